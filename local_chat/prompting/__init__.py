"""Prompt building, below every door (prompting/chat.py), and images from users (prompting/images.py)."""

from .chat import (
    EMPTY_MESSAGE,
    ChatPrompt,
    chat_prompt,
    check_system,
    checked_template,
    conversation_templates,
    default_system,
    default_template,
    history_pairs,
    merged_roles,
    message_images,
    message_text,
    resolve_template,
    single_turn_prompt,
)
from .images import checked_image, image_from_data_url, open_upload, png_bytes, png_data_url

__all__ = [
    "EMPTY_MESSAGE",
    "ChatPrompt",
    "chat_prompt",
    "check_system",
    "checked_image",
    "checked_template",
    "conversation_templates",
    "default_system",
    "default_template",
    "history_pairs",
    "image_from_data_url",
    "merged_roles",
    "message_images",
    "message_text",
    "open_upload",
    "png_bytes",
    "png_data_url",
    "resolve_template",
    "single_turn_prompt",
]
