"""Single-turn prompt templates, byte-exact to LLaMA2-Accessory's `format_prompt` (imported as Accessory does through
`templates`)."""

from collections.abc import Mapping

from local_chat.errors import UserError

_ALPACA_HEAD = "Below is an instruction that describes a task. "
_ALPACA_INPUT_HEAD = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
)
_REQUEST = "Write a response that appropriately completes the request"

TEMPLATES = {
    "alpaca": _ALPACA_HEAD + _REQUEST + ".\n\n### Instruction:\n{instruction}\n\n### Response:",
    "alpaca_input": _ALPACA_INPUT_HEAD
    + _REQUEST
    + ".\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:",
    "shortqa": _ALPACA_HEAD
    + _REQUEST
    + " using a single word or phrase.\n\n### Instruction:\n{instruction}\n\n### Response:",
    "qg": "Generate a question whose answer is:\n{instruction}\n\nQuestion:\n",
    "caption": "",
    "None": "{instruction}",
}

#: The names a user can pass as `sys_name` (alpaca picks its input variant itself).
TEMPLATE_NAMES = ("alpaca", "shortqa", "qg", "caption", "None")


def _has_input(format_dict: Mapping) -> bool:
    value = format_dict.get("input")
    return isinstance(value, str) and value.strip() != ""


def format_prompt(format_dict: Mapping, sys_name: str = "alpaca") -> str:
    """Render `format_dict` ({"instruction": ..., "input": ...}) with the single-turn template `sys_name`."""
    if sys_name not in TEMPLATE_NAMES:
        raise UserError(f"Unknown prompt template {sys_name!r}; choose one of: {', '.join(TEMPLATE_NAMES)}.")
    if sys_name == "alpaca" and _has_input(format_dict):
        sys_name = "alpaca_input"
    return TEMPLATES[sys_name].format_map(dict(format_dict))
