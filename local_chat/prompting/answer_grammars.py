"""The grammar an answer to chat messages is held to, in the family's own frame (model/constraints.py holds the
answer to it, in llguidance's Lark): first the model's reasoning, free, where the prompt leaves it room to reason;
then what the request asks for, a JSON schema (`response_format`) or one call of an allowed tool (`tool_choice`
"required", or a named function), its arguments valid against the tool's parameters, written in the family's own
call format (each family's `call` writer below, named by its entry in prompting/families.py), so that the response
parser returns it as `tool_calls`.

A marker that is one token of the tokenizer's added vocabulary (`<think>`, `<tool_call>`, `<|call|>`,
`[TOOL_CALLS]`) is written as that token, `<[id]>`. A family with no call writer gets one sentence saying that its
calls cannot be required."""

from __future__ import annotations

import json
import re

from local_chat.engine.interface import AnswerFormat
from local_chat.errors import UserError

COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # as the templates write JSON
AFTER_REASONING = r"/[ \n]{0,2}/"  # the blank lines a model leaves between its reasoning and its answer
XML_TEXT = r"/[^<]*/"  # an argument's text in an XML call: up to the tag that closes it


def json_options() -> dict:
    """llguidance's JSON options: compact JSON, no whitespace of the model's choosing (a random model would fill
    its answer with it)."""
    return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def held_answer(
    family, prompt: str, tokenizer, asked: AnswerFormat | None, tools: list[dict] | None, only: str | None
) -> AnswerFormat:
    """The format an answer to `prompt` is held to: the reasoning the `family` (prompting/families.py's
    `ChatFormat`) lets the model write first, then `asked` (a JSON format) or, where `tools` are given, one call of
    them (only the one named `only` if given); `tokenizer`, the model's Hugging Face tokenizer (its added tokens). A
    format that needs no frame is `asked` as it is."""
    token = token_writer(tokenizer)
    reasoning = _reasoning(family, prompt, token)
    if reasoning is None and not tools and not family.answer_opening:
        return asked
    body = call_body(family, tools, only, token) if tools else _json_body(asked, family, token)
    thought, *rules = reasoning or ("",)
    start = f"start: {thought} {body}" if thought else f"start: {body}"
    return AnswerFormat("lark", grammar="\n".join([start, *rules]) + "\n")


def call_body(family, tools: list[dict], only: str | None, token) -> str:
    """A Lark expression for one call of `tools` (OpenAI's {"type": "function", "function": {...}}; only the one
    named `only` if given) in the family's call format. `UserError` for a family with no call writer."""
    if family.call is None:
        raise UserError(
            "This model's tool calls cannot be required: the app knows no grammar for its call format; send "
            'tool_choice "auto".'
        )
    functions = [t["function"] for t in tools if only is None or t["function"]["name"] == only]
    return "(" + " | ".join(family.call(f, token) for f in functions) + ")"


def _json_body(asked: AnswerFormat, family, token) -> str:
    """`asked` as a Lark expression (compact JSON), after the opening of the family's answer where it has one."""
    body = f"%json {json.dumps({**asked.held_schema, 'x-guidance': json_options()})}"
    return f"{token(family.answer_opening)} {body}" if family.answer_opening else body


def _reasoning(family, prompt: str, token) -> tuple[str, ...] | None:
    """(the expression of the reasoning the model may write before its answer, the rules it names), or None where
    the family writes none, or the prompt closed it (thinking switched off)."""
    if family.reasoning_grammar is not None:
        return family.reasoning_grammar(token)
    field = family.response.get("fields", {}).get("reasoning_content")
    if not field or not isinstance(field.get("open"), str) or not isinstance(field.get("close"), str):
        return None
    opening, closing, tail = field["open"], field["close"], prompt.rstrip()
    if tail.endswith(closing):
        return None
    if tail.endswith(opening):  # the template opened it (DeepSeek-R1's, Qwen3.5's): the model reasons first
        return f"thought {AFTER_REASONING}", _lazy("thought", closing, token)
    return f"({AFTER_REASONING} {token(opening)} thought {AFTER_REASONING})?", _lazy("thought", closing, token)


def harmony_reasoning(token) -> tuple[str, ...]:
    """gpt-oss's reasoning: analysis messages, each followed by the next message's start."""
    opening = token("<|channel|>analysis<|message|>")
    return (
        "thought*",
        f"thought: {opening} analysis {token('<|start|>assistant')}",
        _lazy("analysis", "<|end|>", token),
    )


def _lazy(name: str, closing: str, token) -> str:
    """A rule for free text up to the first `closing` marker, and the marker. A marker in plain text ends a lazy
    lexeme, at its first occurrence. A marker that is one added token ends text that never spells it: where the
    grammar's tokenizer marks added tokens special (transformers'), text cannot hold it anyway; where it reads a
    non-special added token as its text too (llama.cpp's, for <think> and its kin), the text would swallow it."""
    written = token(closing)
    if "<[" not in written:
        return f"{name}[lazy]: /(?s:.*)/ {written}"
    text, spelled = f"{name.upper()}_TEXT", re.escape(closing).replace("/", "\\/")
    return f"{name}: {text} {written}\n{text}: /(?s:.*)/ & ~/(?s:.*{spelled}.*)/"


# One call of a function in each family's format: (function, token writer) -> a Lark expression.


def qwen_call(function: dict, token) -> str:
    """Qwen2/2.5/3's, SmolLM3's and Granite 4's `<tool_call>` JSON `</tool_call>`."""
    return f'{token("<tool_call>")} "\\n" %json {_json(_named(function, "arguments"))} "\\n" {token("</tool_call>")}'


def llama3_call(function: dict, token) -> str:
    """Llama 3.1's answer that is a JSON object {"name", "parameters"}."""
    return f"%json {_json(_named(function, 'parameters'))}"


def harmony_call(function: dict, token) -> str:
    """gpt-oss's commentary message to `functions.NAME`: the recipient after the channel, or before it (as gpt-oss
    writes it after reasoning)."""
    channel, name = token("<|channel|>"), function["name"]
    return (
        f'({channel} "commentary to=functions.{name} " {token("<|constrain|>")} "json" '
        f'| " to=functions.{name}" {channel} "commentary json") '
        f"{token('<|message|>')} %json {_json(_parameters(function))} {token('<|call|>')}"
    )


def mistral_call(function: dict, token) -> str:
    return f'{token("[TOOL_CALLS]")} "{function["name"]}" {token("[ARGS]")} %json {_json(_parameters(function))}'


def deepseek_call(function: dict, token) -> str:
    return (
        f'{token("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>")} "{function["name"]}" {token("<｜tool▁sep｜>")} '
        f"%json {_json(_parameters(function))} {token('<｜tool▁call▁end｜><｜tool▁calls▁end｜>')}"
    )


def kimi_call(function: dict, token) -> str:
    return (
        f'{token("<|tool_calls_section_begin|><|tool_call_begin|>")} "functions.{function["name"]}:0" '
        f"{token('<|tool_call_argument_begin|>')} %json {_json(_parameters(function))} "
        f"{token('<|tool_call_end|><|tool_calls_section_end|>')}"
    )


def nemotron_call(function: dict, token) -> str:
    return f'{token("<TOOLCALL>")} "[" %json {_json(_named(function, "arguments"))} "]" {token("</TOOLCALL>")}'


def pythonic_call(function: dict, token) -> str:
    """LFM2's `[NAME(KEY=VALUE, ...)]`, each value written as JSON (which its call-list syntax reads)."""
    pairs = [f'"{key}=" %json {_json(schema)}' for key, schema in _arguments(function)]
    return (
        f'{token("<|tool_call_start|>")} "[{function["name"]}(" {_in_order(pairs, json.dumps(", "))} ")]" '
        f"{token('<|tool_call_end|>')}"
    )


def glm_call(function: dict, token) -> str:
    """GLM-4.5 to 4.7's `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>` (4.5 and 4.6 put
    each part on its own line)."""
    pairs = [
        f'/\\n?/ {token("<arg_key>")} "{key}" {token("</arg_key>")} /\\n?/ {token("<arg_value>")} {_value(schema)} '
        f"{token('</arg_value>')}"
        for key, schema in _arguments(function)
    ]
    return f'{token("<tool_call>")} "{function["name"]}" {_in_order(pairs)} /\\n?/ {token("</tool_call>")}'


def minimax_call(function: dict, token) -> str:
    pairs = [
        f'"<parameter name=\\"{key}\\">" {_value(schema)} "</parameter>\\n"' for key, schema in _arguments(function)
    ]
    return (
        f'{token("<minimax:tool_call>")} "\\n<invoke name=\\"{function["name"]}\\">\\n" {_in_order(pairs)} '
        f'"</invoke>\\n" {token("</minimax:tool_call>")}'
    )


def seed_call(function: dict, token) -> str:
    return _function_call(function, token, "<seed:tool_call>", "</seed:tool_call>", "")


def qwen3_5_call(function: dict, token) -> str:
    return _function_call(function, token, "<tool_call>", "</tool_call>", "\\n")


def _function_call(function: dict, token, opening: str, closing: str, after_key: str) -> str:
    """`<function=NAME><parameter=KEY>VALUE</parameter>...</function>` between the family's call markers (Seed-OSS's,
    Qwen3.5's, which starts each value on a line of its own)."""
    pairs = [
        f'"<parameter={key}>{after_key}" {_value(schema)} "</parameter>\\n"' for key, schema in _arguments(function)
    ]
    return (
        f'{token(opening)} "\\n<function={function["name"]}>\\n" {_in_order(pairs)} "</function>\\n" {token(closing)}'
    )


def _arguments(function: dict) -> list[tuple[str, dict]]:
    """(name, schema) of the function's required parameters, in their order: a held call passes those (an optional
    argument is the model's to leave out)."""
    parameters = _parameters(function)
    required = set(parameters.get("required") or [])
    return [
        (k, v if isinstance(v, dict) else {}) for k, v in (parameters.get("properties") or {}).items() if k in required
    ]


def _in_order(pieces: list[str], separator: str = "") -> str:
    """The arguments' expressions one after another (`separator`, a Lark string, between them)."""
    return f" {separator} ".join(pieces) if separator else " ".join(pieces)


def _value(schema: dict) -> str:
    """An XML argument's value: its text for a string (one of its values, for an enum of strings), else JSON valid
    against its schema."""
    choices = schema.get("enum")
    if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
        return "(" + " | ".join(json.dumps(c) for c in choices) + ")"
    return XML_TEXT if schema.get("type") == "string" else f"%json {_json(schema)}"


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


def token_writer(tokenizer):
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
