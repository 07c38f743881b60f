"""LLaMA2-Accessory's import path for the single-turn templates, `from templates import format_prompt`
(Accessory: `accessory.data.system_prompt`): a face of local_chat/templates/single_turn.py."""

from local_chat.templates.single_turn import TEMPLATE_NAMES, TEMPLATES, format_prompt

__all__ = ["format_prompt", "TEMPLATE_NAMES", "TEMPLATES"]
