"""Accessory's import path for the single-turn templates, `from templates import format_prompt`: they live in
single_turn_templates/ (multi-turn ones in conversation/)."""

from single_turn_templates import TEMPLATE_NAMES, TEMPLATES, format_prompt

__all__ = ["format_prompt", "TEMPLATE_NAMES", "TEMPLATES"]
