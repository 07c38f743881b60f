"""The grammar of a required tool call (`tool_choice` "required", or a named function): the answer is one call of an
allowed tool, its arguments valid against the tool's parameters, written in the family's own call format, so that
the response parser (prompting/response_formats.py) returns it as `tool_calls`. The grammar is llguidance's Lark
(model/constraints.py holds the answer to it); a marker that is one token of the tokenizer's added vocabulary
(`<tool_call>`, `<|call|>`, `[TOOL_CALLS]`) is written as that token, `<[id]>`.

Families with a grammar here: the Qwen2/2.5/3 format (`<tool_call>` JSON `</tool_call>`, SmolLM3's too), Llama 3.1's
JSON call, gpt-oss's harmony `commentary to=functions.NAME` message and Mistral's `[TOOL_CALLS]NAME[ARGS]`. Another
format is one sentence saying that the model's calls cannot be required."""

from __future__ import annotations

import json

from local_chat.errors import UserError

from .response_formats import HARMONY, LLAMA3_JSON_CALLS, MISTRAL_THINK, RESPONSE_FORMATS

QWEN_CALLS = next(v for types, v in RESPONSE_FORMATS.items() if "qwen3" in types)
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # as the templates write JSON


def call_grammar(template: dict, tools: list[dict], only: str | None, tokenizer) -> str:
    """A Lark grammar for one call of `tools` (OpenAI's {"type": "function", "function": {...}}; only the one named
    `only` if given) in the call format of `template` (a response format); `tokenizer`, the model's Hugging Face
    tokenizer (its added tokens). `UserError` for a format with no grammar here."""
    functions = [t["function"] for t in tools if only is None or t["function"]["name"] == only]
    token = _token_writer(tokenizer)
    if template is QWEN_CALLS:
        call = {"anyOf": [_named(f, "arguments") for f in functions]}
        return f'start: {token("<tool_call>")} "\\n" call "\\n" {token("</tool_call>")}\ncall: %json {_json(call)}\n'
    if template is LLAMA3_JSON_CALLS:
        return f"start: %json {_json({'anyOf': [_named(f, 'parameters') for f in functions]})}\n"
    if template is HARMONY:
        calls = [
            f'{token("<|channel|>")} "commentary to=functions.{f["name"]} " {token("<|constrain|>")} "json" '
            f"{token('<|message|>')} %json {_json(_parameters(f))} {token('<|call|>')}"
            for f in functions
        ]
        return "start: " + " | ".join(calls) + "\n"
    if template is MISTRAL_THINK:
        calls = [
            f'{token("[TOOL_CALLS]")} "{f["name"]}" {token("[ARGS]")} %json {_json(_parameters(f))}' for f in functions
        ]
        return "start: " + " | ".join(calls) + "\n"
    raise UserError(
        "This model's tool calls cannot be required: the app knows no grammar for its call format; send "
        'tool_choice "auto".'
    )


def _parameters(function: dict) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}


def _named(function: dict, arguments: str) -> dict:
    """The schema of a call of `function` as one JSON object: its name, and its arguments under `arguments`."""
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments: _parameters(function)},
        "required": ["name", arguments],
        "additionalProperties": False,
    }


def _json(schema: dict) -> str:
    return json.dumps({**schema, "x-guidance": COMPACT})


def _token_writer(tokenizer):
    """How the grammar writes a marker: as its token where the tokenizer has it as one added token, else as text."""
    added = tokenizer.get_added_vocab() if tokenizer is not None else {}

    def token(marker: str) -> str:
        return f"<[{added[marker]}]>" if marker in added else json.dumps(marker)

    return token
