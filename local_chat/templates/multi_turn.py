"""Conversation templates. Accessory's strings are kept byte for byte; nothing here imports the project."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from enum import Enum, auto

from local_chat.errors import UserError
from local_chat.voice.clips import Clip

CHAT_TEMPLATE = "chat_template"


class SeparatorStyle(Enum):
    SINGLE = auto()  # "### Human: ...\n### Assistant: ..."; an answer ends at "\n###"
    TWO = auto()  # "USER: ... ASSISTANT: ...</s>"; an answer ends at sep2


class _Messages:
    """Message handling shared by every template: [[role, text], ...], the last text None while generating."""

    roles: tuple[str, str]
    messages: list

    def append_message(self, role: str, message: str | None) -> None:
        self.messages.append([role, message])

    def load_qas(self, qas: Sequence[Sequence[str | None]]) -> None:
        """Replace the messages with [[question, answer], ...]; the last answer may be None (to generate)."""
        self.messages = []
        for question, answer in qas:
            self.append_message(self.roles[0], question)
            self.append_message(self.roles[1], answer)


@dataclasses.dataclass
class Conversation(_Messages):
    """A conversation in one of Accessory's templates."""

    system: str
    roles: tuple[str, str]
    messages: list = dataclasses.field(default_factory=list)
    sep_style: SeparatorStyle = SeparatorStyle.SINGLE
    sep: str = "###"
    sep2: str | None = None
    version: str = "Unknown"
    skip_next: bool = False

    def process(self) -> dict:
        """{"conv": the whole text, "to_predict": the answers a model learns to produce}."""
        if self.sep_style == SeparatorStyle.SINGLE:
            text = self.system + "\n\n" + self.sep
            seps = (self.sep, self.sep)
            turn_end = "\n"
        elif self.sep_style == SeparatorStyle.TWO:
            text = self.system + self.sep
            seps = (self.sep, self.sep2)
            turn_end = ""
        else:
            raise ValueError(f"Invalid style: {self.sep_style}")
        to_predict = []
        for i, (role, message) in enumerate(self.messages):
            if message is None or (self.sep_style == SeparatorStyle.TWO and not message):
                if i != len(self.messages) - 1:
                    raise UserError("Only the last message of a conversation can be empty (the one to generate).")
                text += " " + role + ":"
                continue
            if isinstance(message, tuple):
                message = message[0]
            end = turn_end + seps[i % 2]
            text += " " + role + ": " + message + end
            if role == self.roles[1]:
                to_predict.append(message + end)
        return {"conv": text, "to_predict": to_predict}

    def get_prompt(self) -> str:
        return self.process()["conv"]

    def copy(self) -> Conversation:
        return dataclasses.replace(self, messages=[[r, m] for r, m in self.messages])

    @property
    def response_end_signal(self) -> str:
        """The text that ends an answer; pass it as a stop symbol."""
        return "\n" + self.sep if self.sep_style == SeparatorStyle.SINGLE else self.sep2

    @property
    def stop_symbols(self) -> list[str]:
        return [self.response_end_signal]


_HUMAN_SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)
_USER_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)
_LLAVA_SYSTEM = (
    "You are LLaVA, a large language and vision assistant trained by UW Madison WAIV Lab."
    "You are able to understand the visual content that the user provides, and assist the user with "
    "a variety of tasks using natural language."
    "Follow the instructions carefully and explain your answers in detail."
)


def conv_v1() -> Conversation:
    return Conversation(system=_HUMAN_SYSTEM, roles=("Human", "Assistant"))


def conv_vicuna_v1_1() -> Conversation:
    return Conversation(
        system=_USER_SYSTEM,
        roles=("USER", "ASSISTANT"),
        version="v1",
        sep_style=SeparatorStyle.TWO,
        sep=" ",
        sep2="</s>",
    )


def conv_bair_v1() -> Conversation:
    return Conversation(
        system="BEGINNING OF CONVERSATION:", roles=("USER", "GPT"), sep_style=SeparatorStyle.TWO, sep=" ", sep2="</s>"
    )


def simple_conv_multimodal() -> Conversation:
    return Conversation(system=_LLAVA_SYSTEM, roles=("Human", "Assistant"))


def conv_llava_v1() -> Conversation:
    return Conversation(
        system=_LLAVA_SYSTEM,
        roles=("USER", "ASSISTANT"),
        version="v1",
        sep_style=SeparatorStyle.TWO,
        sep=" ",
        sep2="</s>",
    )


default_conversation: Callable[[], Conversation] = conv_v1
conv_templates: dict = {
    "default": conv_v1,
    "simple": conv_v1,
    "multimodal": simple_conv_multimodal,
    "llava_v1": conv_llava_v1,
    # FastChat's names
    "v1": conv_v1,
    "bair_v1": conv_bair_v1,
    "vicuna_v1_1": conv_vicuna_v1_1,
}


class ChatTemplateConversation(_Messages):
    """A conversation rendered by a model's own (Jinja) chat template: its tokenizer's, or for a vision model its
    processor's (`processor.apply_chat_template`), which places each image in the turn it belongs to.

    Same interface as `Conversation`; a question may also be `(text, images)`, the images asked about with it (only
    their number matters here: each becomes an image part, `{"type": "image"}`, before the text). Messages go to the
    template as typed parts (`[{"type": "text", "text": ...}]`) where the template reads them (vision templates),
    else as strings. The stop symbols come from the template itself, so a model with a chat template needs no
    hand-written entry.
    """

    roles = ("user", "assistant")
    _ANSWER = "ANSWER7f3a9"
    _NEXT = "NEXT7f3a9"

    def __init__(self, renderer, system: str = "", takes_media: bool = False):
        if not getattr(renderer, "chat_template", None):
            raise UserError("This tokenizer has no chat template; choose one of the named templates instead.")
        self.renderer = renderer
        self.system = system
        self.messages: list = []
        self.string_roles: frozenset[str] = frozenset()  # roles whose content the template reads as a string only
        self.typed_parts = self._reads_typed_parts(prefer=takes_media)
        self.string_roles = self._string_roles() if self.typed_parts else frozenset()
        self.stop_symbols = self._derive_stop_symbols()

    def _content(self, message, typed_parts: bool):
        text, media = message if isinstance(message, tuple) else (message, ())
        if not typed_parts:
            return text
        return [_media_part(m) for m in media] + [{"type": "text", "text": text}]

    def _chat(self, messages, typed_parts: bool, with_system: bool = True) -> list:
        system = [["system", self.system]] if self.system and with_system else []
        return [
            {"role": role, "content": self._content(content, typed_parts and role not in self.string_roles)}
            for role, content in system + list(messages)
        ]

    def _apply(self, messages, add_generation_prompt: bool, typed_parts: bool, with_system: bool = True) -> str:
        return self.renderer.apply_chat_template(
            self._chat(messages, typed_parts, with_system), tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _reads_typed_parts(self, prefer: bool) -> bool:
        """Whether the template reads content as typed parts (vision templates) rather than strings. A template
        written for strings prints a list of parts as Python text ("[{'type': ...}]"), or nothing."""
        probe = [["user", self._NEXT]]

        def shows_probe(typed_parts: bool) -> bool:
            try:
                text = self._apply(probe, True, typed_parts, with_system=False)
            except Exception:
                return False
            return self._NEXT in text and "'type'" not in text

        if prefer:
            return shows_probe(True) or not shows_probe(False)
        return not shows_probe(False) and shows_probe(True)

    def _string_roles(self) -> frozenset[str]:
        """The roles whose typed parts a template that reads them in user messages prints as Python text
        (GLM-4.1V's system and assistant messages): those get their text as a string."""
        user = {"role": "user", "content": self._content(self._NEXT, True)}
        probes = {
            "system": [{"role": "system", "content": self._content(self._ANSWER, True)}, user],
            "assistant": [user, {"role": "assistant", "content": self._content(self._ANSWER, True)}],
        }
        roles = set()
        for role, chat in probes.items():
            try:
                roles |= {role} if "'type'" in self.renderer.apply_chat_template(chat, tokenize=False) else set()
            except Exception:  # a template that cannot render the probe: as it was
                continue
        return frozenset(roles)

    def _render(self, messages, add_generation_prompt: bool) -> str:
        return self._applied(self._chat(messages, self.typed_parts), add_generation_prompt=add_generation_prompt)

    def _applied(self, chat: list[dict], tools: list[dict] | None = None, **kwargs) -> str:
        """The template applied to `chat` (dict messages, content as the template reads it); a template that refuses
        a system role gets the system prompt in front of the first message's text instead."""
        render = functools.partial(self.renderer.apply_chat_template, tokenize=False, **kwargs)
        try:
            return render(chat, tools=tools) if tools else render(chat)
        except Exception:
            if len(chat) < 2 or chat[0]["role"] != "system":
                raise
            system, first = _text(chat[0]["content"]), chat[1]["content"]
            if isinstance(first, list):
                at = next((i for i, p in enumerate(first) if p.get("type") == "text"), len(first))
                text = first[at]["text"] if at < len(first) else ""
                merged = [*first[:at], {"type": "text", "text": f"{system}\n\n{text}"}, *first[at + 1 :]]
            else:
                merged = f"{system}\n\n{first}"
            chat = [{**chat[1], "content": merged}, *chat[2:]]
            return render(chat, tools=tools) if tools else render(chat)

    def template_system(self) -> str:
        """The system prompt a conversation sends: its own, else the one the template writes where a conversation
        has none (the demo's "A chat between...", Qwen2.5's "You are Qwen..."), else ""."""
        if self.system:
            return self.system
        question = {"role": "user", "content": self._content(self._NEXT, self.typed_parts)}
        probe = {"role": "system", "content": self._content(self._ANSWER, self.typed_parts)}
        try:
            bare = self._applied([question], add_generation_prompt=True)
            probed = self._applied([probe, question], add_generation_prompt=True)
        except Exception:  # a template that renders no lone question says no more
            return ""
        before, _, after = probed.partition(self._ANSWER)
        if not (after and bare.startswith(before) and bare.endswith(after)):
            return ""  # no system prompt of its own (or one it writes elsewhere)
        written = bare[len(before) : len(bare) - len(after)]
        sent = {"role": "system", "content": self._content(written, self.typed_parts)}
        if not written.strip() or self._applied([sent, question], add_generation_prompt=True) != bare:
            return ""  # a template that reads its system prompt (SmolLM3's /think) would send another prompt
        return written

    def _derive_stop_symbols(self) -> list[str]:
        """What the template writes right after an answer and before the next question: its end-of-turn marker
        (what follows an answer both at the end of a conversation and between two turns: some templates append an
        EOS after the last message only), else the next user header, and EOS."""
        one_turn = self._render([["user", "Hi"], ["assistant", self._ANSWER]], add_generation_prompt=False)
        two_turns = self._render(
            [["user", "Hi"], ["assistant", self._ANSWER], ["user", self._NEXT]], add_generation_prompt=False
        )
        after_last = one_turn.split(self._ANSWER, 1)[1]
        between = two_turns.split(self._ANSWER, 1)[1].split(self._NEXT, 1)[0]
        # Keep a leading newline ("\n###" must not stop at a "###" inside an answer), drop spaces and the rest.
        end_marker = self._common_start(after_last, between).rstrip().lstrip(" ")
        if end_marker:
            return [end_marker]
        eos = getattr(getattr(self.renderer, "tokenizer", self.renderer), "eos_token", None)
        return [s for s in (between.rstrip().lstrip(" "), eos) if s]

    def _common_start(self, a: str, b: str) -> str:
        """The longest start of `a` and `b` made of whole tokens ("<|end|>\n" of "<|end|>\n<|endoftext|>" and
        "<|end|>\n<|user|>", not "<|end|>\n<|")."""
        tokenizer = getattr(self.renderer, "tokenizer", self.renderer)
        ids_a, ids_b = (tokenizer.encode(x, add_special_tokens=False) for x in (a, b))
        same = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), min(len(ids_a), len(ids_b)))
        start = tokenizer.decode(ids_a[:same])
        return start if a.startswith(start) else ""

    def get_prompt(self) -> str:
        messages = [m for m in self.messages if m[1] is not None]
        open_answer = bool(self.messages) and self.messages[-1][1] is None
        return self._render(messages, add_generation_prompt=open_answer)

    def render_messages(self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs) -> str:
        """The prompt for OpenAI-style `messages` (roles system, user, assistant, tool; a content a string or typed
        parts, an image part being {"type": "image"}; assistant messages with `tool_calls` and
        `reasoning_content`), with the generation prompt, `tools` and the template's own variables. An empty system
        message is no system prompt."""
        chat = [self._typed(m) for m in messages if m.get("role") != "system" or _text(m.get("content") or "")]
        if self.system and not any(m["role"] == "system" for m in chat):
            chat.insert(0, {"role": "system", "content": self._content(self.system, self._typed_role("system"))})
        try:
            return self._applied(chat, tools, add_generation_prompt=True, **template_kwargs)
        except TypeError:
            if not any(m.get("tool_calls") for m in chat):
                raise
            # a template that joins the arguments to its text takes them as JSON text
            return self._applied(
                [_calls_as_text(m) for m in chat], tools, add_generation_prompt=True, **template_kwargs
            )

    def renders_calls(self) -> bool:
        """Whether the template writes an assistant message's tool calls back into the prompt (LFM2.5-1.2B's writes
        its content only)."""
        call = {"id": "call_probe", "type": "function", "function": {"name": self._NEXT, "arguments": "{}"}}
        probe = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_probe", "content": "{}"},
        ]
        try:
            return self._NEXT in self.render_messages(probe)
        except Exception:
            return True  # a template that cannot render the probe: the calls are left to it

    def _typed(self, message: dict) -> dict:
        """A message with its content as the template reads it (typed parts, or a string)."""
        content = message.get("content") if message.get("content") is not None else ""
        if isinstance(content, list):
            if not self._typed_role(message.get("role")):
                content = _text(content)
            else:
                content = [_typed_part(p) for p in content]
        elif self._typed_role(message.get("role")) and message.get("role") in ("system", "user"):
            content = [{"type": "text", "text": content}]
        return {**message, "content": content, **_thinking(message), **_calls_as_objects(message)}

    def _typed_role(self, role) -> bool:
        """Whether a message of `role` goes to the template as typed parts (else as a string)."""
        return self.typed_parts and role not in self.string_roles

    @property
    def response_end_signal(self) -> str:
        return self.stop_symbols[0]


# a sound clip's part as a template reads it: a published template looks for an "audio" key (Qwen2-Audio's
# `'audio' in content`)
AUDIO_PART = {"type": "audio", "audio": "clip"}


def _media_part(item) -> dict:
    """The part a question's image or sound clip is to the template."""
    return dict(AUDIO_PART) if isinstance(item, Clip) else {"type": "image"}


def _typed_part(part: dict) -> dict:
    """A message's part as the template reads it: an image or a clip as `_media_part`'s, else its text."""
    if part.get("type") == "image":
        return {"type": "image"}
    if part.get("type") == "audio":
        return dict(AUDIO_PART)
    return {"type": "text", "text": part.get("text", "")}


def _thinking(message: dict) -> dict:
    """An assistant message's reasoning also as `thinking`, where gpt-oss's template reads it (it refuses reasoning
    beside a content in a message with tool calls: there the content stays alone)."""
    reasoning = message.get("reasoning_content")
    if not reasoning or (message.get("content") and message.get("tool_calls")):
        return {}
    return {"thinking": reasoning}


def _calls_as_objects(message: dict) -> dict:
    """An assistant message's tool calls with their arguments as objects, as the published templates read them
    (OpenAI's clients send them as JSON text: gpt-oss's template would quote them again, Qwen3.5's cannot list them)."""
    calls = message.get("tool_calls")
    if not calls:
        return {}
    return {"tool_calls": [_call_as_object(c) for c in calls]}


def _call_as_object(call: dict) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": parsed}} if isinstance(parsed, dict) else call


def _calls_as_text(message: dict) -> dict:
    """An assistant message's tool calls with their arguments as JSON text, for a template that joins them to its text
    (DeepSeek V3.1's writes `'<｜tool▁sep｜>' + arguments`)."""
    if not message.get("tool_calls"):
        return message
    return {**message, "tool_calls": [_call_as_text(c) for c in message["tool_calls"]]}


def _call_as_text(call: dict) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _text(content) -> str:
    """The text of a content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def template_names(tokenizer=None) -> list[str]:
    """The template choices for a tokenizer: Accessory's names, plus `chat_template` when it has one."""
    names = list(conv_templates)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        names.append(CHAT_TEMPLATE)
    return names


def get_conversation(name: str, tokenizer=None, system: str | None = None, takes_media: bool = False):
    """A fresh conversation for a template name (an Accessory name or `chat_template`). `tokenizer` renders the
    chat template: a tokenizer, or the processor of a model that sees images or hears (`takes_media`)."""
    if name == CHAT_TEMPLATE and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return ChatTemplateConversation(tokenizer, system or "", takes_media)
    if name not in conv_templates:
        raise UserError(
            f"Unknown conversation template {name!r}; choose one of: {', '.join(template_names(tokenizer))}."
        )
    conv = conv_templates[name]()
    if system is not None:
        conv.system = system
    return conv
