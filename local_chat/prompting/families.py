"""The registry of chat formats: what the app knows of each model family, in one typed entry (`ChatFormat`) — how
it is recognised (its model types, markers its chat template holds), how it writes its reasoning and its calls (the
response template that transformers' `ResponseParser` reads), how a call of it is written as a grammar (for
`tool_choice: required`), what opens its answer, and its template's thinking switch. Parsing (engine/chats.py), the
grammars (prompting/answer_grammars.py), the page's thinking switch and /v1's `reasoning_effort`
(prompting/messages.py) all read the entry. Adding a family is one entry here and its test.

A model's format: the first entry (in `FORMATS`' order) whose model types hold the model's (or that names none),
whose markers its chat template holds all and whose variables it reads all (DeepSeek V3.1's `thinking`), with the
checkpoint's own `response_template` (its tokenizer config) in place of the entry's where it has one; else `PLAIN`,
whose answer is parsed by `THINK_TAGS`, and where that template holds a family's marker, the terminal says which entry
came closest and why it was not taken (`why_unrecognised`). Recognition reads the template's text and the model type,
never which tokens the tokenizer marks special (uploads and conversions of one model differ in that). A format
reasons only where the model shows it (its reasoning's opening marker is in the chat template, or a token of the
tokenizer): else its reasoning field is dropped, so that an answer is never filed as reasoning, and a JSON answer is
held from its first token.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from . import answer_grammars as calls
from . import family_responses as responses
from .response_formats import DEEPSEEK_R1, HARMONY, LLAMA3_JSON_CALLS, MISTRAL_THINK, RESPONSE_FORMATS, THINK_TAGS

log = logging.getLogger(__name__)


class Effort(StrEnum):
    """OpenAI's `reasoning_effort`: NONE turns reasoning off; a template that reads the effort itself (gpt-oss's)
    takes LOW, MEDIUM and HIGH, which the page offers (`PAGE_EFFORTS`), MINIMAL as LOW and XHIGH as HIGH."""

    NONE = "none"
    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"

    def for_template(self) -> Effort:
        return {Effort.MINIMAL: Effort.LOW, Effort.XHIGH: Effort.HIGH}.get(self, self)


PAGE_EFFORTS = (Effort.LOW, Effort.MEDIUM, Effort.HIGH)


@dataclass(frozen=True)
class ThinkingSwitch:
    """How a chat template turns reasoning on and off: a variable it reads (set to `on` or `off`; "reasoning_effort"
    takes the effort itself), or, with `in_system`, a flag (`on` or `off`) written at the end of the system prompt."""

    variable: str
    on: object = True
    off: object = False
    in_system: bool = False

    def variables(self, effort: str) -> dict:
        """The template variables for a `reasoning_effort` ("none" is off)."""
        if self.in_system:
            return {}
        if self.variable == "reasoning_effort":
            return {"reasoning_effort": effort}
        return {self.variable: self.off if effort == "none" else self.on}

    def flagged(self, messages: list[dict], effort: str) -> list[dict]:
        """`messages` with the system flag for `effort` (a switch in the system prompt), else as they are."""
        if not self.in_system:
            return messages
        flag = self.off if effort == "none" else self.on
        if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
            return [{**messages[0], "content": f"{messages[0]['content']} {flag}"}, *messages[1:]]
        return [{"role": "system", "content": flag}, *messages]


ENABLE_THINKING = ThinkingSwitch("enable_thinking")
REASONING_EFFORT = ThinkingSwitch("reasoning_effort")


@dataclass(frozen=True)
class ChatFormat:
    """One family's chat format (see the module)."""

    name: str
    response: dict  # its response template (transformers' format)
    model_types: tuple[str, ...] = ()  # recognised for these model types (none: any)
    markers: tuple[str, ...] = ()  # ... whose chat template holds all of these
    call: Callable[[dict, Callable], str] | None = None  # one call of a function as Lark (answer_grammars.py)
    answer_opening: str = ""  # what opens the answer's text where the family writes it (harmony's final channel)
    switch: ThinkingSwitch | None = None  # None: read from the template's variables (`thinking_switch`)
    own: bool = True  # the family's own format (read with the special tokens in the text), not THINK_TAGS
    reasoning_grammar: Callable | None = None  # reasoning that is no single block (harmony's): its Lark rules
    variables: tuple[str, ...] = ()  # ... and whose chat template reads all of these variables
    written_calls: Callable[[list[dict]], str] | None = None  # an assistant's calls as the family writes them, for a
    # template that renders no calls back (LFM2.5-1.2B's): the call then goes back in the message's text

    def without(self, field: str) -> ChatFormat:
        """This format with one field of its response template left out (its text then stays in the answer)."""
        if field not in self.response.get("fields", {}):
            return self
        fields = {k: v for k, v in self.response["fields"].items() if k != field}
        return dataclasses.replace(self, response={**self.response, "fields": fields})

    def recognises(self, model_type: str | None, template: str) -> bool:
        return not self.unmet(model_type, template)

    def unmet(self, model_type: str | None, template: str) -> list[str]:
        """What of this entry's conditions a model does not meet, each in a few words (none: it is recognised)."""
        unmet = []
        if self.model_types and model_type not in self.model_types:
            unmet.append(f"its model type is {model_type!r}, not {' or '.join(map(repr, self.model_types))}")
        unmet += [f"its chat template has no {m!r}" for m in self.markers if m not in template]
        read = variables_read(template)
        unmet += [f"its chat template reads no {v!r} variable" for v in self.variables if v not in read]
        return unmet


def _transformers(model_type: str) -> dict:
    """transformers' own server's response template for a model type (response_formats.RESPONSE_FORMATS)."""
    return next(v for types, v in RESPONSE_FORMATS.items() if model_type in types)


def _types_of(model_type: str) -> tuple[str, ...]:
    return next(types for types in RESPONSE_FORMATS if model_type in types)


FORMATS: list[ChatFormat] = [
    ChatFormat(
        "deepseek_v3_1",
        responses.DEEPSEEK,
        ("deepseek_v3",),
        ("<｜Assistant｜>",),
        calls.deepseek_call,
        switch=ThinkingSwitch("thinking"),
        variables=("thinking",),  # V3.1's templates (the checkpoint's, llama.cpp's) switch it; R1's and V3's have none
    ),
    ChatFormat("deepseek_r1", DEEPSEEK_R1, markers=("<｜Assistant｜>",)),
    ChatFormat("kimi_k2", responses.KIMI_K2, markers=("<|tool_calls_section_begin|>",), call=calls.kimi_call),
    ChatFormat("qwen3_5", _transformers("qwen3_5"), _types_of("qwen3_5"), call=calls.qwen3_5_call),
    ChatFormat("qwen", _transformers("qwen3"), _types_of("qwen3"), call=calls.qwen_call),
    ChatFormat("gemma4", _transformers("gemma4"), ("gemma4", "gemma4_text")),
    ChatFormat(
        "harmony",
        HARMONY,
        ("gpt_oss",),
        call=calls.harmony_call,
        answer_opening="<|channel|>final<|message|>",
        reasoning_grammar=calls.harmony_reasoning,
    ),
    ChatFormat("smollm3", _transformers("qwen3"), ("smollm3",), call=calls.qwen_call),
    ChatFormat(
        "mistral_think",
        MISTRAL_THINK,
        ("mistral3", "ministral3", "ministral", "mistral"),
        ("[THINK]",),
        calls.mistral_call,
    ),
    ChatFormat("llama3_json", LLAMA3_JSON_CALLS, ("llama",), ("<|start_header_id|>",), calls.llama3_call),
    ChatFormat("glm_v", responses.GLM_V, ("glm4v", "glm4v_moe"), ("<|assistant|>",)),
    ChatFormat("glm", responses.GLM, markers=("<|assistant|>", "<arg_key>"), call=calls.glm_call),
    ChatFormat("minimax_m2", responses.MINIMAX_M2, markers=("]~b]ai",), call=calls.minimax_call),
    ChatFormat(
        "seed_oss",
        responses.SEED_OSS,
        markers=("<seed:bos>",),
        call=calls.seed_call,
        switch=ThinkingSwitch("thinking_budget", on=-1, off=0),
    ),
    # Granite 4 (Granite 3's calls are `<|tool_call|>[...]`, which this leaves as text)
    ChatFormat("granite", responses.GRANITE, markers=("<|start_of_role|>", "<tool_call>"), call=calls.qwen_call),
    ChatFormat(
        "lfm2",
        responses.LFM2,
        ("lfm2", "lfm2_moe", "lfm2_vl"),  # LFM2 and 2.5, dense (1.2B), MoE (8B-A1B) and vision alike
        call=calls.pythonic_call,
        written_calls=responses.lfm2_calls_text,
    ),
    ChatFormat(
        "nemotron",
        responses.NEMOTRON,
        markers=("<SPECIAL_11>Assistant",),
        call=calls.nemotron_call,
        switch=ThinkingSwitch("/think", "/think", "/no_think", in_system=True),
    ),
]
PLAIN = ChatFormat("plain", THINK_TAGS, own=False)  # a model with no known format


def chat_format(renderer, model_type: str | None) -> ChatFormat:
    """The chat format of a model, from its chat template's renderer (a tokenizer or processor, or None) and its
    `model_type` (see the module)."""
    tokenizer = getattr(renderer, "tokenizer", renderer)
    template = getattr(renderer, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    found = next((f for f in FORMATS if f.recognises(model_type, template)), None)
    own = getattr(tokenizer, "response_template", None)
    if own is not None:
        found = dataclasses.replace(found or PLAIN, response=own, own=True)
    if found is None or renderer is None:
        _tell_unrecognised(template, model_type)
        return PLAIN
    return found if _shows_reasoning(found, template, tokenizer) else found.without("reasoning_content")


def _shows_reasoning(found: ChatFormat, template: str, tokenizer) -> bool:
    """Whether the chat template or the tokenizer's added vocabulary holds the opening of the family's reasoning
    (whitespace aside): Qwen3's does, Qwen2.5's (the same parser's family) does not."""
    field = found.response.get("fields", {}).get("reasoning_content")
    opening = field.get("open") if field is not None else None
    if not isinstance(opening, str):
        return True
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    return opening.strip() in template or opening.strip() in added


# the markers of the families' answers: a template that holds one and is recognised as no family is told of
KNOWN_MARKERS = ("</think>", "<｜tool▁calls▁begin｜>", "<|tool_call_start|>", "<tool_call>", "[TOOL_CALLS]", "[THINK]")


def why_unrecognised(template: str, model_type: str | None) -> str | None:
    """Where a chat template holds a known marker but no entry recognises the model: one sentence naming the entry
    that came closest (the fewest conditions unmet, then the most of those markers in its answers) and why it was
    not taken; else None."""
    held = [m for m in KNOWN_MARKERS if m in template]
    if not held or any(f.recognises(model_type, template) for f in FORMATS):
        return None
    closest = min(FORMATS, key=lambda f: (len(f.unmet(model_type, template)), -_writes(f, held)))
    return (
        f"The chat template holds {', '.join(map(repr, held))} but matches no known family: the closest, "
        f"{closest.name!r}, was not taken because {'; '.join(closest.unmet(model_type, template))}. Its answers are "
        "read as plain text with <think> reasoning, and its tool calls stay text."
    )


def _writes(found: ChatFormat, markers: list[str]) -> int:
    """How many of `markers` a family's answers are written with."""
    response = json.dumps(found.response, ensure_ascii=False)
    return sum(m in response for m in markers)


@functools.lru_cache(maxsize=32)
def _tell_unrecognised(template: str, model_type: str | None) -> None:
    """`why_unrecognised` in the terminal, once a template (every request asks for the model's format)."""
    if (why := why_unrecognised(template, model_type)) is not None:
        log.warning(why)


@functools.lru_cache(maxsize=16)
def variables_read(source: str) -> frozenset[str]:
    """The variables a chat template reads that callers may set (enable_thinking, reasoning_effort, thinking): those
    it never sets, and those it sets only where they are not defined (SmolLM3's `enable_thinking`)."""
    import jinja2
    from jinja2 import meta

    defaulted = set(re.findall(r"(?<!\.)\b(\w+)\s+is\s+(?:not\s+)?defined\b", source))  # not `ns.x is defined`
    source = re.sub(r"{%-?\s*(?:end)?generation\s*-?%}", "", source)  # transformers' own tags (SmolLM3's)
    try:
        return frozenset(meta.find_undeclared_variables(jinja2.Environment().parse(source)) | defaulted)
    except jinja2.TemplateError:
        return frozenset(defaulted)
