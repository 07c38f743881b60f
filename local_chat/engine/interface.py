"""The engine interface every door (the page, the /v1 API, the command line) talks to, and nothing else.

A door builds a `Request` (a raw prompt, or chat messages with their `ChatOptions`; its `Sampling`, stop strings,
images, a cancel flag) and reads the events of `Engine.stream`: `Rendered` (the prompt that messages became),
`Reasoning`, `Delta`s that carry only the new answer text (and, when asked, the log-probabilities of exactly the
tokens that text came from) and `ToolCallDelta`s, perhaps `Queued` while other requests go first (or `Loading`
while its model loads), then one `End` with the `FinishReason`, token counts and timings. `stream` never raises: a
mistake the user can fix, a model that failed, a bug all end in an `End` whose `finish_reason` is
`FinishReason.ERROR` and whose `error` is one sentence to show.

Engines: `LocalEngine` in-process (model/local_engine.py), `PipeEngine` over the pipe to the model's process
(engine/process.py), `RemoteEngine` over another server's OpenAI API (engine/remote.py); `ChatEngine`
(engine/chats.py) renders messages for those that take prompts, and `InArrivalOrder` (engine/in_order.py) queues
every door's requests in front of them. Session keys (`SessionKey`) name one door of one browser session: its Stop
and its KV cache. This module is the bottom of the import order (docs/architecture.md): it imports nothing of the
project but local_chat.errors.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

from local_chat.errors import UserError

# the sampling settings' ranges, checked wherever they come from (OpenAI's for temperature and top_p)
SAMPLING_LIMITS = {
    "max_new_tokens": (1, 10**9),
    "temperature": (0, 2),
    "top_p": (0, 1),  # and above 0
    "top_k": (0, 10**6),
    "repetition_penalty": (0.01, 10),
}
WHOLE_SETTINGS = ("max_new_tokens", "top_k")


def out_of_range(name: str, value, low: float, high: float, whole: bool = False) -> str:
    """The sentence for a setting outside its range, the same at every door: "`temperature` is 9; give from 0 to
    2."."""

    def shown(number) -> str:
        return str(int(number)) if isinstance(number, (int, float)) and float(number).is_integer() else f"{number:g}"

    told = shown(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else json.dumps(value)
    return f"`{name}` is {told}; give {'a whole number ' if whole else ''}from {shown(low)} to {shown(high)}."


@dataclass(frozen=True)
class Sampling:
    """How long an answer may grow and how its tokens are picked (temperature 0: greedy).

    The defaults are the chat's (the page, the /chat API, and /v1 where the model's generation_config is silent);
    `ACCESSORY_SAMPLING` holds LLaMA2-Accessory's, which `MetaModel.generate` and `stream_generate` keep."""

    max_new_tokens: int = 256
    temperature: float = 0.1
    top_p: float = 0.75
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        """Settings outside `SAMPLING_LIMITS` are one sentence (/v1's), whichever door they came through: /v1, the
        Gradio API, the page's sliders, the command line, --models_config."""
        for name, (low, high) in SAMPLING_LIMITS.items():
            value = getattr(self, name)
            if name == "top_p" and value == 0:
                raise UserError("`top_p` is 0; give a value above 0 and at most 1.")
            if not low <= value <= high:
                raise UserError(out_of_range(name, value, low, high, name in WHOLE_SETTINGS))

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def but(self, **changes) -> Sampling:
        """This sampling with some settings changed (checked again)."""
        return replace(self, **changes)

    @staticmethod
    def chosen_for(chosen: dict) -> Sampling:
        """The chat's sampling, with the temperature, top_p, top_k and repetition penalty of `chosen` (a
        checkpoint's generation_config: what its authors chose for it); a value outside every door's limits keeps
        the chat's."""
        sampling = Sampling()
        for name in ("temperature", "top_p", "top_k", "repetition_penalty"):
            try:
                sampling = sampling.but(**{name: chosen[name]}) if chosen.get(name) is not None else sampling
            except UserError:
                pass
        return sampling


CHAT_SAMPLING = Sampling()  # the chat's: the page's controls and the /chat and /single_turn API start from it
ACCESSORY_SAMPLING = Sampling(max_new_tokens=512, temperature=0.0, top_p=0.95)


@dataclass(frozen=True)
class AnswerFormat:
    """What an answer must be, enforced token by token (model/constraints.py): `kind` "json_object" (any JSON object),
    "json_schema" (valid against `schema`, a JSON schema; `name` as the caller gave it), or "lark" (`grammar`, in
    llguidance's Lark: a required tool call in the family's format, prompting/answer_grammars.py)."""

    kind: str
    schema: dict | None = field(default=None, hash=False)
    name: str = ""
    grammar: str = ""

    @property
    def held_schema(self) -> dict | None:
        """The JSON schema a JSON kind's answer must validate against (any object for "json_object")."""
        return {"type": "object"} if self.kind == "json_object" else self.schema

    @property
    def key(self) -> str:
        """The same key for the same format: what its compiled grammar is cached under."""
        return self.kind + ":" + (self.grammar or json.dumps(self.schema, sort_keys=True, separators=(",", ":")))


@dataclass
class ChatOptions:
    """What a request in chat messages asks of the template and of the answer's parsing (OpenAI's fields)."""

    tools: list[dict] | None = None  # OpenAI's {"type": "function", "function": {name, description, parameters}}
    tool_choice: str = "auto"  # "auto"; "none": tools still rendered, the answer not parsed for calls; "required"
    tool_name: str | None = None  # with "required": the one tool the answer calls
    parallel_tool_calls: bool = True  # False: the first call only
    template_kwargs: dict = field(default_factory=dict)  # the template's own variables (enable_thinking, ...)
    answer_tokens: int = 256  # room kept for the answer when the oldest turns must go
    template: str | None = None  # the conversation template (an Accessory name or "chat_template"); None: the app's


@dataclass
class Request:
    """One answer to generate: to a raw `prompt` (the text the model sees, never parsed), or to chat `messages`
    (OpenAI's shape: roles system, developer, user, assistant, tool; assistant messages with `tool_calls` and
    `reasoning_content`), which the engine renders with its template and `chat` options."""

    prompt: str = ""
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()  # strings that end the answer, never shown (nor any start of one)
    images: list | None = None  # the images the prompt's image markers stand for, in order
    image_transform: str | None = None  # None or "auto": the model's own fitting; else an Accessory transform
    session: SessionKey | str | None = (
        None  # a conversation whose KV cache is kept between turns (model/prefix_cache.py)
    )
    logprobs: int | None = None  # None: none; k: each sent token's log-probability and its k likeliest alternatives
    cancel: threading.Event | None = field(default=None, compare=False)  # set: the model stops before its next step
    messages: list[dict] | None = None  # chat messages instead of a prompt (see above)
    chat: ChatOptions | None = None  # with `messages`
    special_tokens: bool = False  # the text keeps the tokenizer's special tokens (what a response parser reads)
    answer_format: AnswerFormat | None = None  # the answer must follow it (JSON, a schema); None: free text
    adapter: str | None = None  # a LoRA adapter loaded over the model (--lora): its name; None: the model alone

    def portable(self) -> Request:
        """This request as another process can receive it: without the cancel flag (it is passed on separately)."""
        return replace(self, cancel=None)


@dataclass
class TokenLogprob:
    token_id: int
    token: str
    logprob: float | None  # None: unknown (llama.cpp reports none for a token it held back: engine/llama_cpp.py)
    top: list[tuple[str, float]] = field(default_factory=list)  # the likeliest tokens at that step, best first


@dataclass
class Delta:
    """Text added to the answer, and the tokens it came from when the request asked for log-probabilities."""

    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class Reasoning:
    """Text added to the answer's reasoning (what a reasoning model thinks before it answers)."""

    text: str


@dataclass
class ToolCallDelta:
    """A piece of a tool call: its first piece names it (`id`, `name`); `arguments` text follows, by `index`."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def openai(self) -> dict:
        """The whole call in OpenAI's shape (a message's `tool_calls` entry)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Rendered:
    """The prompt the engine made of a request's messages (first event of such a request): its text (for an engine
    that applies its own template, the messages it is sent, as JSON), how many of the oldest turns were left out to
    fit the context, its length in tokens, and how many images it shows."""

    text: str
    dropped_turns: int = 0
    prompt_tokens: int = 0
    images: int = 0


@dataclass
class Queued:
    """The request waits for the model: `ahead` requests go first."""

    ahead: int


@dataclass
class Loading:
    """The request waits for its model to load (--models_dir): `sentence` says what it waits for, and how long."""

    sentence: str


class FinishReason(StrEnum):
    """Why an answer ended. Its values are OpenAI's `finish_reason`s, and two of ours (/v1 says "stop" for both)."""

    STOP = "stop"  # the model's end token, or a stop string (the template's or the request's)
    LENGTH = "length"  # its token budget, or the context
    TOOL_CALLS = "tool_calls"  # it ended after calling tools (the chat layer's reading of a stop)
    CANCELLED = "cancelled"  # Stop, a closed tab, a client gone
    ERROR = "error"  # it failed: `End.error` holds the sentence


@dataclass
class End:
    """The last event of a stream."""

    finish_reason: FinishReason  # a string given is read as one (an unknown one is a ValueError)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the session's cache
    time_to_first_token: float = 0.0
    total_time: float = 0.0
    tokens_per_second: float = 0.0
    decode_tokens_per_second: float = 0.0
    detokenize_time: float = 0.0
    encode_time: float = 0.0
    token_ids: list[int] = field(default_factory=list)  # the answer's tokens, its stop token not among them
    error: str | None = None  # with "error": the sentence to show
    caller_error: bool = False  # the error is the request's (a UserError), not the model's
    reasoning_tokens: int = 0  # of the completion tokens, those whose text was reasoning
    guessed_tokens: int = 0  # speculative decoding (--speculative): tokens guessed, and of them those the model took
    accepted_tokens: int = 0

    def __post_init__(self):
        self.finish_reason = FinishReason(self.finish_reason)

    @staticmethod
    def failed(sentence: str, caller_error: bool = False) -> End:
        return End(FinishReason.ERROR, error=sentence, caller_error=caller_error)


Event = Delta | Reasoning | ToolCallDelta | Rendered | Queued | Loading | End


@dataclass
class Answer:
    """A whole answer, as `Engine.complete` returns it."""

    text: str
    end: End
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)  # each call whole


@runtime_checkable
class Engine(Protocol):
    """What every door uses of a model: its facts, prompt lengths, and answers as streams of events."""

    tokenizer: object  # Accessory's tokenizer API: encode(s, bos, eos), decode(ids)
    max_seq_len: int  # the context, in tokens

    @property
    def sees_images(self) -> bool: ...

    @property
    def chat_renderer(self) -> object | None:
        """What renders the model's own chat template (a processor or tokenizer), or None."""

    @property
    def failure(self) -> str | None:
        """Why the model cannot answer any more (a worker died), or None."""

    def summary(self) -> EngineSummary:
        """What the engine's model is: for the page's model panel, /v1/models and the response format."""

    def generation_defaults(self) -> Sampling:
        """The chat's sampling with what the model's own generation_config sets (what /v1 uses)."""

    def prompt_length(self, prompt: str, images=None, image_transform: str | None = None) -> int: ...

    def stream(self, request: Request) -> Iterator[Event]:
        """The answer's events; never raises (see the module's docstring)."""

    def complete(self, requests: list[Request]) -> list[Answer]:
        """Whole answers to several requests of one sampling (in-process: one left-padded batch)."""

    def drop_sessions(self, browser_session: str) -> None:
        """Forget the KV caches of a closed browser session."""


@dataclass(frozen=True)
class EngineSummary:
    """What an engine says of its model (`Engine.summary()`). `engine_url` is set where another server serves it
    (engine/remote.py); the rest of a remote model is unknown and keeps the defaults."""

    path: str  # the checkpoint's folder(s), ", "-joined; a remote engine's model id
    context: int  # tokens, prompt and answer
    sees_images: bool
    engine_url: str | None = None
    hears: bool = False  # it takes sound clips (a model that hears: Qwen2-Audio, say)
    context_known: bool = True  # False: a remote engine that does not say its context
    architecture: str = ""
    model_type: str | None = None  # the config's: picks the family's response format
    format: str = ""  # the checkpoint's: Hugging Face, LLaMA2-Accessory (2 shards), GGUF Q8_0 · 0.4 GB, ...
    served_by: str = ""  # the engine that computes it where it is not this app's own: "llama.cpp" (a GGUF file)
    dtype: str = ""
    device: str = ""
    quant: str = "none"
    cpu_kernels: str = ""  # what of its linear layers runs on torch's CPU kernels (model/cpu_linear.py)
    weight_mib: float = 0.0
    compiled: bool = False
    cuda_graphs: bool = False
    batching: str = "off"
    image_marker: str = ""  # what stands for an image in a prompt whose template has no marker of its own
    image_token: str = ""
    adapters: tuple[str, ...] = ()  # the LoRA adapters loaded over the model (--lora), which a request may name
    adapter: str = ""  # the adapter its answers run with: the view's of one (engine/choices/lora.py), or merged
    adapter_problems: tuple[tuple[str, str], ...] = ()  # (name, why) of each --lora adapter that did not load

    @property
    def remote(self) -> bool:
        return self.engine_url is not None


@dataclass(frozen=True)
class SessionKey:
    """One door (a tab, a conversation of a tab, the /chat API) of one browser session: the key of its Stop and of
    its KV cache. A `pool` names the conversations of a door nobody names (the /v1 API's clients send whole
    conversations, with no id): model/prefix_cache.py takes the member whose cached tokens share the longest start
    with the prompt, or hands out a new `member`. (Accessory's `stream_generate(session=...)` takes any string.)"""

    browser: str
    door: str
    pool: bool = False
    member: int | None = None


def session_key(browser_session: str, door: str) -> SessionKey:
    return SessionKey(browser_session, door)


def in_session(key: SessionKey | str, browser_session: str) -> bool:
    """Whether `key` is one of `browser_session`'s doors (a plain string key is a session of its own)."""
    return key.browser == browser_session if isinstance(key, SessionKey) else key == browser_session


def checkpoint_name(summary: EngineSummary) -> str:
    """The loaded checkpoint's folder name(s), from `Engine.summary()`'s path: nothing else of the server's disk;
    with the adapter its answers run with (--lora), "BASE + NAME"."""
    name = ", ".join(Path(folder).name for folder in summary.path.split(", "))
    return f"{name} + {summary.adapter}" if summary.adapter else name


def add_call_piece(calls: list[ToolCallDelta], piece: ToolCallDelta) -> None:
    """Add a streamed piece of a tool call to `calls`, the whole calls so far (by index)."""
    if piece.index < len(calls):
        calls[piece.index].arguments += piece.arguments
    else:
        calls.append(replace(piece))


def collect(events: Iterator[Event]) -> Answer:
    """A stream read to its end, as one answer (its reasoning and tool calls apart)."""
    text, reasoning, calls, end = [], [], [], None
    for event in events:
        if isinstance(event, Delta):
            text.append(event.text)
        elif isinstance(event, Reasoning):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallDelta):
            add_call_piece(calls, event)
        elif isinstance(event, End):
            end = event
    end = end or End.failed("The answer ended without its last event.")
    return Answer("".join(text), end, "".join(reasoning), calls)


def collect_at_once(stream: Callable[[Request], Iterator[Event]], requests: list[Request]) -> list[Answer]:
    """Whole answers to `requests`, each `stream`ed on a thread of its own at the same time (an engine that runs them
    together: another server, llama.cpp's slots)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, len(requests))) as pool:
        return list(pool.map(lambda request: collect(stream(request)), requests))
