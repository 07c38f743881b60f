"""LLaMA2-Accessory's prompt templates, byte-exact: single-turn (single_turn.py, `format_prompt`) and multi-turn
(multi_turn.py, `default_conversation`, plus the tokenizer's own chat template). The top-level `templates` and
`conversation` packages are their faces under Accessory's import lines. Imports nothing but local_chat.errors."""
