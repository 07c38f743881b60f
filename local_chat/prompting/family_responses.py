"""The response templates (transformers' declarative format, read by its `ResponseParser`) of the families
transformers' own server has none for, beside prompting/response_formats.py's: how each writes its reasoning, its
answer and its tool calls after its prompt. prompting/families.py says which model has which."""

from __future__ import annotations

import json

from .response_formats import NAMED_CALL, RESPONSE_FORMATS

QWEN_CALLS = next(v for types, v in RESPONSE_FORMATS.items() if "qwen3" in types)["fields"]["tool_calls"]

# a call-list element {"name", "arguments"} as a call (with `transform_each`)
LISTED_CALL = {"type": "function", "function": {"name": "{name}", "arguments": "{arguments}"}}


def _think(open_: str = "<think>", close: str = "</think>") -> dict:
    return {"open": open_, "close": close, "content": "text"}


def _xml_call(open_pattern: str, close_pattern: str, pair_pattern: str) -> dict:
    """Calls written as XML: the function named in the opening, each argument a key and a value (the parser turns
    values into the types the tool's parameters declare)."""
    return {
        "open_pattern": open_pattern,
        "close_pattern": close_pattern,
        "repeats": True,
        "content": "xml-inline",
        "content_args": {"tag_pattern": pair_pattern},
        "transform": NAMED_CALL,
    }


# DeepSeek V3.1: `<think>` opened by the prompt where thinking is on, and closed by it where it is off (the checkpoint's
# template writes `</think>`, llama.cpp's copy `<think></think>`), calls
# `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`;
# after a tool result the answer follows `<｜tool▁output▁end｜>` with no new assistant header.
DEEPSEEK = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"(?:<｜Assistant｜>|<｜tool▁output▁end｜>)(?:</think>)?",
    "fields": {
        "reasoning_content": _think(),
        "tool_calls": {
            "open_pattern": r"\s*(?:<｜tool▁calls▁begin｜>)?\s*<｜tool▁call▁begin｜>(?P<name>[^<]+?)<｜tool▁sep｜>",
            "close_pattern": r"<｜tool▁call▁end｜>\s*"
            r"(?:<｜tool▁calls▁end｜>|(?=<｜tool▁call▁begin｜>|<｜end▁of▁sentence｜>))",
            "repeats": True,
            "content": "json",
            "transform": NAMED_CALL,
        },
        "content": {"close": "<｜end▁of▁sentence｜>", "content": "text"},
    },
}

# Kimi K2: no reasoning (the Instruct models); calls `<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
# {...}<|tool_call_end|>` inside a `<|tool_calls_section_begin|>...<|tool_calls_section_end|>` section.
KIMI_K2 = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_assistant|>assistant<|im_middle|>",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\s*(?:<\|tool_calls_section_begin\|>)?\s*<\|tool_call_begin\|>\s*(?:functions\.)?"
            r"(?P<name>[^:<\s]+):\d+\s*<\|tool_call_argument_begin\|>",
            "close_pattern": r"<\|tool_call_end\|>\s*"
            r"(?:<\|tool_calls_section_end\|>|(?=<\|tool_call_begin\|>|<\|im_end\|>))",
            "repeats": True,
            "content": "json",
            "transform": NAMED_CALL,
        },
        "content": {"close": ["<|im_end|>", "[EOS]"], "content": "text"},
    },
}

_GLM_END = ["<|user|>", "<|observation|>", "<|endoftext|>"]
_GLM_CALLS = _xml_call(
    r"\s*<tool_call>\s*(?P<name>[^\s<]+)",
    r"</tool_call>",
    r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>",
)

# GLM-4.5 to 4.7: `<think>...</think>` (4.7's prompt opens it, or closes it when thinking is off), calls
# `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`, the turn ended by the next role's token.
GLM = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"<\|assistant\|>(?:</think>)?",
    "fields": {
        "reasoning_content": _think(),
        "tool_calls": _GLM_CALLS,
        "content": {"close": _GLM_END, "content": "text"},
    },
}

# GLM-4.1V-Thinking: `<think>...</think><answer>...</answer>`; an answer without its tags is the answer too.
GLM_V = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "reasoning_content": _think(),
        "content": {
            "open_pattern": r"\s*<answer>|(?:(?<=</think>)|\A)(?=\s*[^<\s])",
            "close_pattern": r"</answer>|<\|user\|>|<\|observation\|>|<\|endoftext\|>",
            "content": "text",
        },
    },
}

# MiniMax M2: the prompt opens `<think>`; calls `<minimax:tool_call><invoke name="NAME"><parameter name="K">V
# </parameter>...</invoke>...</minimax:tool_call>`.
MINIMAX_M2 = {
    "defaults": {"role": "assistant"},
    "start_anchor": "]~b]ai\n",
    "fields": {
        "reasoning_content": _think(),
        "tool_calls": _xml_call(
            r"\s*(?:<minimax:tool_call>\s*)?<invoke name=\"(?P<name>[^\"]+)\">",
            r"</invoke>\s*(?:</minimax:tool_call>|(?=<invoke|\[e~\[))",
            r"<parameter name=\"(?P<key>[^\"]+)\">(?P<value>.*?)</parameter>",
        ),
        "content": {"close": "[e~[", "content": "text"},
    },
}

# Seed-OSS: `<seed:think>...</seed:think>` (a thinking budget of 0 closes it in the prompt), calls
# `<seed:tool_call><function=NAME><parameter=K>V</parameter>...</function></seed:tool_call>`.
SEED_OSS = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"<seed:bos>assistant\n(?:<seed:think>\n<seed:cot_budget_reflect>.*?"
    r"</seed:cot_budget_reflect>\n</seed:think>)?",
    "fields": {
        "reasoning_content": _think("<seed:think>", "</seed:think>"),
        "tool_calls": _xml_call(
            r"\s*<seed:tool_call>\s*<function=(?P<name>[^>\s]+)>",
            r"</function>\s*</seed:tool_call>",
            r"<parameter=(?P<key>[^>\s]+)>(?P<value>.*?)</parameter>",
        ),
        "content": {"close": "<seed:eos>", "content": "text"},
    },
}

# Granite 4: no reasoning; Qwen's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
GRANITE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|start_of_role|>assistant<|end_of_role|>",
    "fields": {
        "tool_calls": QWEN_CALLS,
        "content": {"close": "<|end_of_text|>", "content": "text"},
    },
}

# LFM2: `<think>...</think>`, calls a Python list of keyword calls `<|tool_call_start|>[NAME(K="V")]<|tool_call_end|>`.
LFM2 = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": _think(),
        "tool_calls": {
            "open_pattern": r"\s*<\|tool_call_start\|>",
            "close": "<|tool_call_end|>",
            "content": "python-call-list",
            "transform": LISTED_CALL,
            "transform_each": True,
        },
        "content": {"close": "<|im_end|>", "content": "text"},
    },
}


def lfm2_calls_text(calls: list[dict]) -> str:
    """Calls as LFM2 writes them (`<|tool_call_start|>[NAME(KEY=VALUE, ...)]<|tool_call_end|>`, each value as JSON,
    as its call grammar writes them), for its 1.2B template, which renders an assistant's content only."""
    written = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            arguments = json.loads(arguments or "{}")
        pairs = ", ".join(f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in arguments.items())
        written.append(f"{function.get('name')}({pairs})")
    return f"<|tool_call_start|>[{', '.join(written)}]<|tool_call_end|>"


# Nemotron Nano 2: the prompt opens `<think>` (or writes `<think></think>` after /no_think), calls a JSON list
# `<TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>`.
NEMOTRON = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<SPECIAL_11>Assistant\n",
    "fields": {
        "reasoning_content": _think(),
        "tool_calls": {
            "open_pattern": r"\s*<TOOLCALL>",
            "close": "</TOOLCALL>",
            "content": "json",
            "transform": LISTED_CALL,
            "transform_each": True,
        },
        "content": {"close": ["<SPECIAL_12>", "</s>"], "content": "text"},
    },
}
