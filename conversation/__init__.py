"""Multi-turn templates: LLaMA2-Accessory's set, byte-exact, plus the tokenizer's own chat template.

`conv_templates` maps Accessory's names to zero-argument factories, as Accessory does:
`conv = conv_templates["default"](); conv.load_qas([[q, None]]); prompt = conv.get_prompt()`.
"""

from .multi_turn import (
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
