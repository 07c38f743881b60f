"""LLaMA2-Accessory's import path for the multi-turn templates, `from conversation import default_conversation`
(Accessory: `accessory.data.conversation`): a face of local_chat/templates/multi_turn.py.

`conv_templates` maps Accessory's names to zero-argument factories, as Accessory does:
`conv = conv_templates["default"](); conv.load_qas([[q, None]]); prompt = conv.get_prompt()`.
"""

from local_chat.templates.multi_turn import (
    ChatTemplateConversation,
    Conversation,
    SeparatorStyle,
    conv_templates,
    default_conversation,
    get_conversation,
    template_names,
)

__all__ = [
    "Conversation",
    "SeparatorStyle",
    "ChatTemplateConversation",
    "conv_templates",
    "default_conversation",
    "get_conversation",
    "template_names",
]
