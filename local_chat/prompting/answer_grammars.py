"""The grammar an answer to chat messages is held to, in the family's own frame (model/constraints.py holds the
answer to it, in llguidance's Lark): first the model's reasoning, free, where the prompt leaves it room to reason;
then what the request asks for, a JSON schema (`response_format`) or one call of an allowed tool (`tool_choice`
"required", or a named function), its arguments valid against the tool's parameters, written in the family's own
call format, so that the response parser (prompting/response_formats.py) returns it as `tool_calls`.

A marker that is one token of the tokenizer's added vocabulary (`<think>`, `<tool_call>`, `<|call|>`,
`[TOOL_CALLS]`) is written as that token, `<[id]>`. Call formats with a grammar here: the Qwen2/2.5/3 format
(`<tool_call>` JSON `</tool_call>`, SmolLM3's too), Llama 3.1's JSON call, gpt-oss's harmony
`commentary to=functions.NAME` message and Mistral's `[TOOL_CALLS]NAME[ARGS]`. Another format is one sentence
saying that the model's calls cannot be required."""

from __future__ import annotations

import json
import re

from local_chat.engine.interface import AnswerFormat
from local_chat.errors import UserError

from .response_formats import HARMONY, LLAMA3_JSON_CALLS, MISTRAL_THINK, RESPONSE_FORMATS

QWEN_CALLS = next(v for types, v in RESPONSE_FORMATS.items() if "qwen3" in types)
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # as the templates write JSON
AFTER_REASONING = r"/[ \n]{0,2}/"  # the blank lines a model leaves between its reasoning and its answer


def json_options() -> dict:
    """llguidance's JSON options: compact JSON, no whitespace of the model's choosing (a random model would fill
    its answer with it)."""
    return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def held_answer(
    template: dict, prompt: str, tokenizer, asked: AnswerFormat | None, tools: list[dict] | None, only: str | None
) -> AnswerFormat:
    """The format an answer to `prompt` is held to: the reasoning the family's response `template` lets the model
    write first, then `asked` (a JSON format) or, where `tools` are given, one call of them (only the one named
    `only` if given); `tokenizer`, the model's Hugging Face tokenizer (its added tokens). A format that needs no
    frame is `asked` as it is."""
    token = _token_writer(tokenizer)
    reasoning = _reasoning(template, prompt, token)  # never None for harmony, whose answer has a frame of its own
    if reasoning is None and not tools:
        return asked
    body = call_body(template, tools, only, token) if tools else _json_body(asked, template, token)
    thought, *rules = reasoning or ("",)
    start = f"start: {thought} {body}" if thought else f"start: {body}"
    return AnswerFormat("lark", grammar="\n".join([start, *rules]) + "\n")


def call_body(template: dict, tools: list[dict], only: str | None, token) -> str:
    """A Lark expression for one call of `tools` (OpenAI's {"type": "function", "function": {...}}; only the one
    named `only` if given) in the call format of `template` (a response format). `UserError` for a format with no
    grammar here."""
    functions = [t["function"] for t in tools if only is None or t["function"]["name"] == only]
    if template is QWEN_CALLS:
        call = {"anyOf": [_named(f, "arguments") for f in functions]}
        return f'{token("<tool_call>")} "\\n" %json {_json(call)} "\\n" {token("</tool_call>")}'
    if template is LLAMA3_JSON_CALLS:
        return f"%json {_json({'anyOf': [_named(f, 'parameters') for f in functions]})}"
    if template is HARMONY:  # the recipient after the channel, or before it (as gpt-oss writes it after reasoning)
        channel, message = token("<|channel|>"), token("<|message|>")
        calls = [
            f'({channel} "commentary to=functions.{f["name"]} " {token("<|constrain|>")} "json" '
            f'| " to=functions.{f["name"]}" {channel} "commentary json") '
            f"{message} %json {_json(_parameters(f))} {token('<|call|>')}"
            for f in functions
        ]
        return "(" + " | ".join(calls) + ")"
    if template is MISTRAL_THINK:
        calls = [
            f'{token("[TOOL_CALLS]")} "{f["name"]}" {token("[ARGS]")} %json {_json(_parameters(f))}' for f in functions
        ]
        return "(" + " | ".join(calls) + ")"
    raise UserError(
        "This model's tool calls cannot be required: the app knows no grammar for its call format; send "
        'tool_choice "auto".'
    )


def _json_body(asked: AnswerFormat, template: dict, token) -> str:
    """`asked` as a Lark expression (compact JSON), in harmony's final message where the family writes those."""
    body = f"%json {json.dumps({**asked.held_schema, 'x-guidance': json_options()})}"
    return f"{token('<|channel|>final<|message|>')} {body}" if template is HARMONY else body


def _reasoning(template: dict, prompt: str, token) -> tuple[str, ...] | None:
    """(the expression of the reasoning the model may write before its answer, the rules it names), or None where
    the family writes none, or the prompt closed it (thinking switched off)."""
    if template is HARMONY:  # analysis messages, each followed by the next message's start
        opening = token("<|channel|>analysis<|message|>")
        return (
            "thought*",
            f"thought: {opening} analysis {token('<|start|>assistant')}",
            _lazy("analysis", "<|end|>", token),
        )
    field = template.get("fields", {}).get("reasoning_content")
    if not field or not isinstance(field.get("open"), str) or not isinstance(field.get("close"), str):
        return None
    opening, closing, tail = field["open"], field["close"], prompt.rstrip()
    if tail.endswith(closing):
        return None
    if tail.endswith(opening):  # the template opened it (DeepSeek-R1's, Qwen3.5's): the model reasons first
        return f"thought {AFTER_REASONING}", _lazy("thought", closing, token)
    return f"({token(opening)} thought {AFTER_REASONING})?", _lazy("thought", closing, token)


def _lazy(name: str, closing: str, token) -> str:
    """A rule for free text up to the first `closing` marker, and the marker. Text never holds an added token, so
    a marker that is one ends it as it is; a marker in plain text ends a lazy lexeme, at its first occurrence."""
    written = token(closing)
    return f"{name}: /(?s:.*)/ {written}" if "<[" in written else f"{name}[lazy]: /(?s:.*)/ {written}"


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
    """How the grammar writes a marker: each added token of the tokenizer in it as that token, the rest as text."""
    added = tokenizer.get_added_vocab() if tokenizer is not None else {}
    found = re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))) if added else None

    def token(marker: str) -> str:
        pieces, at = [], 0
        for match in found.finditer(marker) if found else ():
            pieces += [json.dumps(marker[at : match.start()])] if match.start() > at else []
            pieces.append(f"<[{added[match.group()]}]>")
            at = match.end()
        pieces += [json.dumps(marker[at:])] if at < len(marker) else []
        return " ".join(pieces)

    return token
