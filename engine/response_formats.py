"""How each family writes its reasoning and tool calls: transformers' declarative response templates, read by
`tokenizer.get_response_parser` (transformers/utils/chat_parsing).

A checkpoint's own `response_template` (its tokenizer config) comes first; else the entry for its `model_type` below,
copied from the fallbacks of transformers' own server (`_RESPONSE_TEMPLATE_FALLBACKS` in
transformers/cli/serving/utils.py, private, and importing it pulls in FastAPI; tests/test_reasoning.py checks that
the copies still equal it); else `THINK_TAGS`: a `<think>...</think>` block is reasoning, the rest is the answer.
"""

from __future__ import annotations

_QWEN_CONTENT_END = r"\s*(?:<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>)"

RESPONSE_FORMATS: dict[tuple[str, ...], dict] = {
    (
        "qwen2",
        "qwen2_moe",
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3",
        "qwen3_moe",
        "qwen3_next",
        "qwen3_vl",
        "qwen3_vl_moe",
    ): {
        "defaults": {"role": "assistant"},
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
            "tool_calls": {
                "open_pattern": r"\s*<tool_call>",
                "close": "</tool_call>",
                "repeats": True,
                "content": "json",
                "transform": {"type": "function", "function": "{content}"},
            },
            "content": {"close_pattern": _QWEN_CONTENT_END, "content": "text"},
        },
    },
    ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"): {
        "defaults": {"role": "assistant"},
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
            "tool_calls": {
                "open_pattern": r"\s*<tool_call>\s*<function=(?P<name>[^>\n]+)>",
                "close_pattern": r"</function>\s*</tool_call>",
                "repeats": True,
                "content": "xml-inline",
                "content_args": {"tag_pattern": r"<parameter=(?P<key>[^>\n]+)>\s*(?P<value>.*?)\s*</parameter>"},
                "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
            },
            "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>)", "content": "text"},
        },
    },
    ("gemma4",): {
        "defaults": {"role": "assistant"},
        "start_anchor": ["<|turn>model\n", "<tool_response|>"],
        "fields": {
            "reasoning_content": {"open": "<|channel>thought\n", "close": "<channel|>", "content": "text"},
            "tool_calls": {
                "open_pattern": r"<\|tool_call>call:(?P<name>\w+)",
                "close": "<tool_call|>",
                "repeats": True,
                "content": "json",
                "content_args": {"unquoted_keys": True, "string_delims": [['<|"|>', '<|"|>']]},
                "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
            },
            "content": {"close": ["<turn|>", "<|tool_response>", "<eos>"], "content": "text"},
        },
    },
}

# A model with no known format: a <think>...</think> block is its reasoning, the rest its answer. The answer starts
# where the prompt ends, or at a <think> the prompt opened (as the R1 distills' templates do).
THINK_TAGS = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"\Z(?<!<think>\n)|(?=<think>\n\Z)",
    "fields": {
        "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
        "content": {"content": "text"},
    },
}


def response_format(tokenizer, model_type: str | None) -> tuple[dict, bool]:
    """(the response template for a model, whether it is the model's own format rather than `THINK_TAGS`)."""
    own = getattr(getattr(tokenizer, "tokenizer", tokenizer), "response_template", None)
    if own is not None:
        return own, True
    found = next((v for types, v in RESPONSE_FORMATS.items() if model_type in types), None)
    return (found, True) if found is not None else (THINK_TAGS, False)


class Region:
    """One text field of the answer (reasoning, or the answer itself) as it streams: its leading and trailing
    whitespace left out, as the parsed message has it."""

    def __init__(self, kind):
        self.kind, self.started, self.pending = kind, False, ""

    def chunk(self, text: str) -> list:
        text = self.pending + (text if self.started else text.lstrip())
        shown = text.rstrip()
        self.pending = text[len(shown) :]
        if not shown:
            return []
        self.started = True
        return [self.kind(shown)]

    def close(self) -> None:
        self.pending = ""
