"""How families write their reasoning and tool calls: transformers' declarative response templates, read by
`tokenizer.get_response_parser` (transformers/utils/chat_parsing), and the streaming pieces that turn a parser's
events into the answer's events. prompting/families.py says which model writes which.

`RESPONSE_FORMATS` are transformers' own server's fallbacks (copied from `_RESPONSE_TEMPLATE_FALLBACKS` in
transformers/cli/serving/utils.py, private, and importing it pulls in FastAPI; tests/test_reasoning.py checks that the
copies still equal it); the others here and in prompting/family_responses.py are ours, each tested against its
published template in tests/test_families.py. `THINK_TAGS` reads a model with no known format: a
`<think>...</think>` block is reasoning, the rest is the answer.
"""

from __future__ import annotations

from local_chat.engine.interface import Delta, Event, Reasoning

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


# a call's value: the function its opening named (the `name` capture), its JSON as the arguments
NAMED_CALL = {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}


# gpt-oss's harmony format: each message of the answer is `<|channel|>CHANNEL<|message|>TEXT<|end|>`, the next opening
# with `<|start|>assistant`; `analysis` is the reasoning, `final` (or `commentary` with no recipient) the answer, and a
# call is a `commentary` message to `functions.NAME` (the recipient before or after the channel), ended by `<|call|>`.
HARMONY = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|start|>assistant",
    "fields": {
        "reasoning_content": {
            "open": "<|channel|>analysis<|message|>",
            "close": ["<|end|>", "<|return|>"],
            "repeats": True,
            "join": "\n\n",
            "content": "text",
        },
        "tool_calls": {
            "open_pattern": r"\s*(?:to=functions\.(?P<name>[^<\s]+)\s*<\|channel\|>commentary"
            r"|<\|channel\|>commentary\s+to=functions\.(?P<name>[^<\s]+))[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>",
            "close": ["<|call|>", "<|end|>"],
            "repeats": True,
            "content": "json",
            "transform": NAMED_CALL,
        },
        "content": {
            "open_pattern": r"<\|channel\|>(?:final|commentary)<\|message\|>",
            "close": ["<|return|>", "<|end|>"],
            "content": "text",
        },
    },
}

# Mistral's reasoning models (Ministral 3, Magistral): `[THINK]...[/THINK]`, then the answer; calls are
# `[TOOL_CALLS]NAME[ARGS]{...}`, one after another.
MISTRAL_THINK = {
    "defaults": {"role": "assistant"},
    "start_anchor": ["[/INST]", "[/TOOL_RESULTS]"],
    "fields": {
        "reasoning_content": {"open": "[THINK]", "close": "[/THINK]", "content": "text"},
        "tool_calls": {
            "open_pattern": r"\[TOOL_CALLS\](?P<name>[^\[\s]+)\[ARGS\]",
            "close_pattern": r"(?=\[TOOL_CALLS\])|</s>",
            "repeats": True,
            "content": "json",
            "transform": NAMED_CALL,
        },
        "content": {"close": "</s>", "content": "text"},
    },
}

# The DeepSeek-R1 distills: the template opens `<think>\n` after `<｜Assistant｜>`, the answer follows `</think>`; a
# template that closes the block in the prompt (a V3.1 taken for R1) answers after that `</think>`.
DEEPSEEK_R1 = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"<｜Assistant｜>(?:</think>)?",
    "fields": {
        "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
        "content": {"close": "<｜end▁of▁sentence｜>", "content": "text"},
    },
}

# Llama 3.1 to 3.3: a call is the whole answer, a JSON object {"name": ..., "parameters": {...}}.
LLAMA3_JSON_CALLS = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\A\s*(?=\{\s*\"name\")",
            "close_pattern": r"<\|eot_id\|>|<\|eom_id\|>",
            "repeats": True,
            "content": "json",
            "transform": {
                "type": "function",
                "function": {"name": "{content.name}", "arguments": "{content.parameters}"},
            },
        },
        "content": {"close_pattern": r"<\|eot_id\|>|<\|eom_id\|>", "content": "text"},
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


def response_parser(template: dict, prefix: str, tools: list | None = None):
    """transformers' `ResponseParser` for a response template; imported here, on the first answer, so that the front
    of another engine (`--api_base`) starts without transformers."""
    from transformers.utils.chat_parsing.response_parser import ResponseParser

    return ResponseParser(template, prefix=prefix, tools=tools)


class ThinkSplitter:
    """Reasoning an engine sends raw in its answer's text (engine/remote.py): a leading <think>...</think> block, or,
    where thinking is on and the prompt may have opened the block (`opened`), the text up to a first </think>. In
    that case the text is held until a </think> comes (then the reasoning and the rest stream) or the answer ends
    without one: a model whose template opened no block answered plainly, and all of it is the answer."""

    def __init__(self, opened: bool):
        self.held = "" if opened else None  # None: nothing held back
        self.parser = response_parser(THINK_TAGS, "<think>\n" if opened else "")
        self.fields = {"reasoning_content": Region(Reasoning), "content": Region(Delta)}

    def feed(self, text: str) -> list[Event]:
        if self.held is not None:
            self.held += text
            if "</think>" not in self.held:
                return []
            text, self.held = self.held, None
        return text_events(self.parser.feed(text), self.fields)

    def finish(self) -> list[Event]:
        if self.held is not None:  # no </think> came: no block was open
            held, self.held = self.held, None
            self.parser = response_parser(THINK_TAGS, "")
            return text_events(self.parser.feed(held) + self.parser.finalize()[1], self.fields)
        return text_events(self.parser.finalize()[1], self.fields)


def text_events(events: list[dict], fields: dict) -> list[Event]:
    """The reasoning and answer events of a parser's region events (tool calls left to the caller)."""
    out: list[Event] = []
    for event in events:
        region = fields.get(event.get("field"))
        if region is not None and event["type"] == "region_chunk":
            out.extend(region.chunk(event["text"]))
        elif region is not None and event["type"] == "region_close":
            region.close()
    return out
