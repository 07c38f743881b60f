"""Chat messages over an engine that takes prompts: the messages rendered with the model's template
(prompting/messages.py), and the answer parsed, while it streams, into reasoning, answer text and tool calls with the
model's response format (prompting/response_formats.py, read by transformers' `ResponseParser`).

`ChatEngine(engine)` is itself an engine: a request with `messages` gets a `Rendered` event, then `Reasoning`,
`Delta` (the answer) and `ToolCallDelta` events, then its `End` ("tool_calls" when the answer called tools). A
request with a raw `prompt` passes through untouched, and so does everything to an engine that renders messages
itself (engine/remote.py).
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace

from local_chat.defaults import MAX_UPLOAD_MB
from local_chat.errors import UserError
from local_chat.model.detokenize import StopCutter
from local_chat.prompting.answer_grammars import held_answer
from local_chat.prompting.chat import IMAGE_PART_TYPES, audio_parts, image_parts
from local_chat.prompting.families import ChatFormat, chat_format
from local_chat.prompting.messages import answerable, fitted, kept_turns, messages_prompt, with_data_urls
from local_chat.prompting.response_formats import Region, response_parser, text_events
from local_chat.templates.multi_turn import CHAT_TEMPLATE
from local_chat.voice.clips import Clip

from .interface import (
    Answer,
    AnswerFormat,
    ChatOptions,
    Delta,
    End,
    Engine,
    Event,
    FinishReason,
    Reasoning,
    Rendered,
    Request,
    ToolCallDelta,
    collect,
)

log = logging.getLogger(__name__)
# a tool to see whether a template shows tools to the model (ChatEngine.why_no_tools)
PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_7f3a", "description": "",
                                                "parameters": {"type": "object", "properties": {}}}}  # fmt: skip


class ChatEngine:
    """`engine` with chat messages rendered in their request's template (else `template`, the launcher's) and answers
    parsed (see the module)."""

    def __init__(self, engine: Engine, template: str, max_upload_mb: float | None = None):
        self.engine, self.template = engine, template
        self._tools_checked: dict[str | None, str | None] = {}
        self.max_upload_mb = MAX_UPLOAD_MB if max_upload_mb is None else max_upload_mb

    @staticmethod
    def over(engine: Engine, template: str, max_upload_mb: float | None = None) -> ChatEngine:
        """`engine` as a `ChatEngine` (itself where it is one already)."""
        return engine if isinstance(engine, ChatEngine) else ChatEngine(engine, template, max_upload_mb)

    def over_engine(self, engine: Engine) -> ChatEngine:
        """This chat engine's template and upload limit over another engine."""
        return ChatEngine(engine, self.template, self.max_upload_mb)

    def __getattr__(self, name):  # every other part of the interface is the engine's
        return getattr(self.engine, name)

    def stream(self, request: Request) -> Iterator[Event]:
        if request.messages is None:
            yield from self.engine.stream(request)
            return
        if getattr(self.engine, "takes_chats", False):  # a model had first (engine/choices/), then rendered there
            yield from self.engine.stream(request, lambda had: self.over_engine(had).stream(request))
            return
        try:
            rendered, sent, parser = self.prepared(request)
        except UserError as error:
            yield End.failed(str(error), caller_error=True)
            return
        yield rendered
        events = self.engine.stream(sent)
        try:
            yield from events if parser is None else parser.events(events, request.stop, sent.cancel)
        finally:
            events.close()  # a reader that leaves stops the model at its next step

    def complete(self, requests: list[Request]) -> list[Answer]:
        """Whole answers (the engine's batch) to raw prompts and to chat messages alike; a request that cannot be
        rendered gets its sentence as an "error" answer."""
        prepared: list = []
        for request in requests:
            try:
                prepared.append(self.prepared(request) if request.messages is not None else (None, request, None))
            except UserError as error:
                prepared.append(Answer("", End.failed(str(error), caller_error=True)))
        sent = [p[1] for p in prepared if isinstance(p, tuple)]
        answers = iter(self.engine.complete(sent) if sent else [])
        out = []
        for item, request in zip(prepared, requests):
            if isinstance(item, Answer):
                out.append(item)
            elif item[2] is None:
                out.append(next(answers))
            else:
                out.append(item[2].whole(next(answers), request.stop))
        return out

    def count(self, messages: list[dict], options: ChatOptions) -> int:
        """The tokens of `messages` (all of them, whatever their length) in their template: /tokenize's count."""
        if self._renders_itself(options):
            return self.engine.messages_length(self._for_the_engine(messages), options.tools)
        built = messages_prompt(self.engine, self._template(options), messages, options, self.max_upload_mb, False)
        return built.tokens

    def prepared(self, request: Request) -> tuple[Rendered, Request, AnswerParser | None]:
        """(the `Rendered` event, the request the engine is sent, the parser of its answer: None where the engine
        renders the messages and parses its answers itself); a conversation that cannot be rendered raises
        `UserError`."""
        options = request.chat or ChatOptions()
        if self._renders_itself(options):
            kept, dropped, tokens, images = self._kept(request.messages, options)
            return Rendered(shown_messages(kept), dropped, tokens, images), replace(request, messages=kept), None
        built = messages_prompt(self.engine, self._template(options), request.messages, options, self.max_upload_mb)
        sent = replace(
            request,
            answer_format=self._held_format(request.answer_format, options, built.text),
            prompt=built.text,
            stop=tuple(built.stop_symbols),  # the caller's own stop strings are looked for in the answer text only
            images=built.images or None,
            messages=None,
            chat=None,
            special_tokens=self.response_style.reads_special_tokens,
            cancel=request.cancel or threading.Event(),
        )
        parser = AnswerParser(self.response_style, built.text, options)
        images = sum(not isinstance(m, Clip) for m in built.images)
        return Rendered(built.text, built.dropped_turns, built.tokens, images), sent, parser

    def _held_format(self, asked: AnswerFormat | None, options: ChatOptions, prompt: str) -> AnswerFormat | None:
        """What the answer to `prompt` is held to: `asked` (a JSON format), or one call of the allowed tools where
        `tool_choice` requires one; after the reasoning, where the model's format has one."""
        required = options.tool_choice == "required" and bool(options.tools)
        style = self.response_style
        if required and not style.reads_special_tokens:
            raise UserError(
                'This model has no known tool-call format, so a call cannot be required; send tool_choice "auto".'
            )
        if not (required or (asked is not None and style.reads_special_tokens)):
            return asked  # no format, or no known frame: held from the answer's first token
        hf = getattr(self.engine.tokenizer, "hf", None)
        tools = options.tools if required else None
        return held_answer(style.family, prompt, hf, asked, tools, options.tool_name)

    def _template(self, options: ChatOptions) -> str:
        return options.template or self.template

    def why_no_tools(self, template: str | None = None) -> str | None:
        """Why this model cannot be given tools in `template` (None: the launcher's), in one sentence; None where it
        can: its template shows them to the model and its calls can be read."""
        if template not in self._tools_checked:
            self._tools_checked[template] = self._tools_refused(ChatOptions(tools=[PROBE_TOOL], template=template))
        return self._tools_checked[template]

    def _tools_refused(self, options: ChatOptions) -> str | None:
        if self._renders_itself(options) or getattr(self.engine, "takes_chats", False):
            return None  # the engine renders them and reads its calls (or the model, loaded when it answers, does)
        hi = [{"role": "user", "content": "Hi"}]
        try:
            built = messages_prompt(self.engine, self._template(options), hi, options, self.max_upload_mb, False)
        except UserError as error:
            return str(error)
        if PROBE_TOOL["function"]["name"] not in built.text:
            return "This model's chat template does not show tools to the model; start a model whose template does."
        if "tool_calls" not in self.response_style.family.response.get("fields", {}):
            return "This model writes its tool calls in no format this app reads, so its calls cannot be run."
        return None

    def _renders_itself(self, options: ChatOptions) -> bool:
        """Whether the engine applies its own chat template (engine/remote.py), and this request asks for it."""
        return self._template(options) == CHAT_TEMPLATE and getattr(self.engine, "renders_messages", False)

    @functools.cached_property
    def response_style(self) -> ResponseStyle:
        return ResponseStyle.of(self.engine)

    def _kept(self, messages: list[dict], options: ChatOptions) -> tuple[list[dict], int, int, int]:
        """(the messages an engine that renders them itself is sent; how many of the oldest turns were left out where
        the conversation outgrows its context; its tokens; its images)."""
        messages = self._for_the_engine(messages)
        length = functools.cache(
            lambda dropped: self.engine.messages_length(kept_turns(messages, dropped), options.tools)
        )
        dropped, tokens = fitted(self.engine, messages, options.answer_tokens, length)
        kept = kept_turns(messages, dropped)
        return kept, dropped, tokens, sum(len(image_parts(m)) for m in kept)

    def _for_the_engine(self, messages: list[dict]) -> list[dict]:
        """Messages checked for an engine that renders them itself, their images as `data:` URLs."""
        messages = with_data_urls(answerable(messages), self.max_upload_mb)
        if not self.engine.sees_images and any(image_parts(m) for m in messages):
            raise UserError(
                "This model cannot see images (start the app with --vision if the engine's model sees them); send "
                "the message without an image."
            )
        return messages


def shown_messages(messages: list[dict]) -> str:
    """Messages as "Prompt sent to the model" shows them: JSON, each image as `<image N>`, each recording's data as
    `<recording N>`."""
    counts = {"image": 0, "recording": 0}

    def shown(part):
        if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
            counts["image"] += 1
            return {"type": "image_url", "image_url": {"url": f"<image {counts['image']}>"}}
        if isinstance(part, dict) and part.get("type") == "input_audio":
            counts["recording"] += 1
            return {**part, "input_audio": {**part["input_audio"], "data": f"<recording {counts['recording']}>"}}
        return part

    out = [
        {**m, "content": [shown(p) for p in m["content"]]} if image_parts(m) or audio_parts(m) else m for m in messages
    ]
    return json.dumps(out, ensure_ascii=False, indent=1)


@dataclass(frozen=True)
class ResponseStyle:
    """How a model writes its answers: its family's chat format (prompting/families.py), and its tokenizer (to count
    reasoning tokens)."""

    family: ChatFormat
    tokenizer: object

    @property
    def reads_special_tokens(self) -> bool:
        """Whether answers are read in the family's own format, with the special tokens in the text."""
        return self.family.own

    @staticmethod
    def of(engine: Engine) -> ResponseStyle:
        return ResponseStyle(chat_format(engine.chat_renderer, engine.summary().model_type), engine.tokenizer)


class AnswerParser:
    """One answer's text (with the special tokens in it where the format is the model's own) turned into reasoning,
    answer and tool-call events, as it grows. Calls are read only where the request declared tools, and only of
    those tools: any other stays in the answer as text."""

    def __init__(self, form: ResponseStyle, prompt: str, options: ChatOptions):
        family = form.family
        if options.tool_choice == "none" or not options.tools:
            family = family.without("tool_calls")  # calls stay text in the answer
        self.parser = response_parser(family.response, prompt, options.tools)
        self.declared = {t["function"]["name"] for t in options.tools or [] if isinstance(t.get("function"), dict)}
        self.tokenizer = form.tokenizer
        self.parallel = options.parallel_tool_calls
        self.fields = {"reasoning_content": Region(Reasoning), "content": Region(Delta)}
        self.calls = 0
        self.broken = False  # a call could not be read: the rest is answer text
        self.call_text = ""  # the call being written, as the model writes it
        self.reasoning_text = ""  # what was sent as reasoning, to count its tokens
        self.raw = ""  # the answer as the model wrote it, for the terminal when a call cannot be read

    def whole(self, answer: Answer, stops: tuple[str, ...] = ()) -> Answer:
        """A whole answer's text parsed (the caller's `stops` cut it)."""
        return collect(self.events(iter([Delta(answer.text), answer.end]), stops, threading.Event()))

    def events(self, inner: Iterator[Event], stops: tuple[str, ...], cancel: threading.Event) -> Iterator[Event]:
        """`inner`'s events with its text parsed; a stop string of the caller's found in the answer ends it."""
        stop, logprobs = _AnswerStops(stops), _AnswerLogprobs()
        yield from self._parsed(self.parser.initial_events)
        for event in inner:
            if isinstance(event, Delta):
                if stop.hit:
                    continue  # the model stops at its next step
                self.raw += event.text
                parsed = stop.cut(self._feed(event.text))
                if stop.hit:
                    cancel.set()
                yield from logprobs.attached(parsed, event.logprobs)
            elif isinstance(event, End):
                if not stop.hit:
                    yield from logprobs.attached(stop.cut(self._feed(None), at_end=True), [])
                yield self._end(event, stop.hit)
                return
            else:
                yield event

    def _end(self, end: End, stopped: bool) -> End:
        reason = end.finish_reason
        if stopped and reason == FinishReason.CANCELLED:
            reason = FinishReason.STOP
        elif self.calls and reason == FinishReason.STOP:
            reason = FinishReason.TOOL_CALLS
        reasoning = len(self.tokenizer.encode(self.reasoning_text, bos=False)) if self.reasoning_text else 0
        return replace(end, finish_reason=reason, reasoning_tokens=min(reasoning, end.completion_tokens))

    def _feed(self, text: str | None) -> list[Event]:
        """The events of the next piece of the answer (None: its end). A call the parser cannot read (broken, or
        cut by the length limit) and all that follows stay in the answer as text."""
        if self.broken:
            return self.fields["content"].chunk(text or "")
        try:
            return self._parsed(self.parser.feed(text) if text is not None else self.parser.finalize()[1])
        except ValueError as error:
            log.warning("A tool call could not be read, so it stays in the answer as text (%s)", str(error)[:300])
            self.broken = True
            return self.fields["content"].chunk(self.call_text + (text or ""))

    def _parsed(self, events: list[dict]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if event.get("field") != "tool_calls":
                out.extend(text_events([event], self.fields))
            elif event["type"] == "region_open":
                self.call_text = ""
            elif event["type"] == "region_chunk":
                self.call_text += event["text"]
            elif event["type"] == "region_close":
                out.extend(self._call(event.get("value")))
        self.reasoning_text += "".join(e.text for e in out if isinstance(e, Reasoning))
        return out

    def _call(self, value) -> list[Event]:
        if isinstance(value, list):  # a family that writes its calls as one list
            return [event for item in value for event in self._call(item)]
        function = value.get("function") if isinstance(value, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in self.declared:
            why = "it names no tool" if not isinstance(name, str) else f"{name!r} is not one of the request's tools"
            log.warning("A tool call stays in the answer as text (%s): %r", why, self.raw[-300:])
            return self.fields["content"].chunk(json.dumps(function or value, ensure_ascii=False))
        if self.calls and not self.parallel:
            return []  # parallel_tool_calls false: the first call only
        arguments = function.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        call = ToolCallDelta(self.calls, "call_" + secrets.token_hex(12), name, text)
        self.calls += 1
        return [call]


class _AnswerLogprobs:
    """The log-probabilities of the answer's tokens, each step's given to the answer text it became: a token whose
    text the parser holds back (a line break inside the answer) keeps them until that text is sent; the tokens of
    the reasoning, of tool calls, and of the tags and whitespace before the answer carry none."""

    def __init__(self):
        self.pending: list = []
        self.answering = False  # the answer's text has begun

    def attached(self, events: list[Event], logprobs: list) -> list[Event]:
        if not logprobs and not self.pending:  # none asked for (or none left to give)
            self.answering = self.answering or any(isinstance(e, Delta) for e in events)
            return events
        self.pending += logprobs
        at = next((i for i, e in enumerate(events) if isinstance(e, Delta)), None)
        if at is not None:
            events[at] = Delta(events[at].text, self.pending)
            self.pending, self.answering = [], True
        elif events or not self.answering:
            self.pending = []  # reasoning or a call, or what came before the answer
        return events


class _AnswerStops:
    """The caller's stop strings, looked for in the answer text only (model/detokenize.py's `StopCutter`)."""

    def __init__(self, stops: tuple[str, ...]):
        self.cutter = StopCutter(stops) if stops else None

    @property
    def hit(self) -> bool:
        return self.cutter is not None and self.cutter.hit

    def cut(self, events: list[Event], at_end: bool = False) -> list[Event]:
        if self.cutter is None:
            return events
        out: list[Event] = []
        for event in events:
            if not isinstance(event, Delta):
                out.extend([] if self.hit else [event])
            elif shown := self.cutter.add(event.text):
                out.append(Delta(shown))
        if at_end and (tail := self.cutter.finish()):
            out.append(Delta(tail))
        return out
