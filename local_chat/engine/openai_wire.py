"""The OpenAI wire format, both ways, in one place: the replies /v1 sends (`Reply`: chunks while an answer streams, or
its whole body, with usage, reasoning, tool calls and log-probabilities, built as the `openai` package's own types,
`ChatCompletionChunk`, `ChatCompletion`, `Completion`, as transformers' serving code builds them; 16 µs a chunk),
what an OpenAI-compatible engine sends back, read for engine/remote.py (server-sent events, a chunk's reasoning, tool
calls and log-probabilities in the engine interface's shape, an error's own message, what a failed connection
raises), the fields of a request to one (`request_fields`), and `finish_reason` each way. The requests /v1 takes are
checked by api/requests.py."""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator

import httpx

from local_chat.errors import described
from local_chat.prompting.chat import message_text
from local_chat.prompting.response_formats import Region, ThinkSplitter

from .interface import (
    AnswerFormat,
    Delta,
    End,
    Event,
    FinishReason,
    Reasoning,
    Request,
    TokenLogprob,
    ToolCallDelta,
    add_call_piece,
)

ON_THE_WIRE = (FinishReason.LENGTH, FinishReason.TOOL_CALLS)  # OpenAI's reasons that are ours as they are


def finish_from_wire(reason: str) -> FinishReason:
    """An engine's `finish_reason` as ours: "length" and "tool_calls" as they are, any other a stop ("eos", "stop")."""
    return FinishReason(reason) if reason in ON_THE_WIRE else FinishReason.STOP


def finish_to_wire(reason: FinishReason) -> str:
    """Ours as OpenAI's: "length" and "tool_calls" as they are, else "stop" (/v1 tells an error by its status)."""
    return reason.value if reason in ON_THE_WIRE else FinishReason.STOP.value


def transport_errors() -> tuple[type[Exception], ...]:
    """What reading a stream raises when the connection fails: httpx's errors, and httpx2's (the HTTP client of the
    `openai` package from its version 3)."""
    import openai

    errors: list[type[Exception]] = [httpx.HTTPError, openai.APIConnectionError]
    try:
        import httpx2

        errors.append(httpx2.HTTPError)
    except ImportError:
        pass
    return tuple(errors)


def raw_think_splitter(request: Request):
    """What splits reasoning sent raw in the answer's text out of it."""
    kwargs = request.chat.template_kwargs if request.chat is not None else {}
    return ThinkSplitter(opened=kwargs.get("enable_thinking") is True)


def reasoning_and_calls(delta: dict, reasoning: Region) -> Iterator[Event]:
    """The reasoning (under either name engines send it) and tool-call pieces of a chat chunk's delta."""
    text = delta.get("reasoning_content") or delta.get("reasoning")
    if text:
        yield from reasoning.chunk(text)
    for call in delta.get("tool_calls") or []:
        function = call.get("function") or {}
        yield ToolCallDelta(call.get("index", 0), call.get("id"), function.get("name"), function.get("arguments") or "")


def server_events(response) -> Iterator[dict]:
    """The JSON objects of a streamed response's server-sent events, up to `data: [DONE]`."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            continue  # not an event of the protocol (a comment, a keep-alive)
        if isinstance(event, dict):
            yield event


def chunk_logprobs(logprobs: dict | None, chat: bool) -> list[TokenLogprob]:
    """The log-probabilities a chunk's choice carries, in the engine interface's shape (token ids are not sent:
    -1)."""
    if not logprobs:
        return []
    if chat:
        return [
            TokenLogprob(
                -1, t["token"], t["logprob"], [(top["token"], top["logprob"]) for top in t.get("top_logprobs") or []]
            )
            for t in logprobs.get("content") or []
        ]
    tokens = logprobs.get("tokens") or []
    tops = logprobs.get("top_logprobs") or [{}] * len(tokens)
    return [
        TokenLogprob(-1, token, value, sorted((top or {}).items(), key=lambda kv: -kv[1]))
        for token, value, top in zip(tokens, logprobs.get("token_logprobs") or [], tops)
    ]


def prompt_characters(prompt: str, messages: list[dict] | None) -> int:
    """A prompt's size in characters, as the estimate of its tokens counts it: a chat's message texts only."""
    if messages is None:
        return len(prompt)
    return sum(len(message_text(m.get("content"))) for m in messages)


def engine_message(error) -> str:
    """An engine's error in one line: its own message where its body has one (OpenAI's `error.message`, or FastAPI's
    `detail`), and its status."""
    body = getattr(error, "body", None)
    message = None
    if isinstance(body, dict):
        inner = body.get("error")
        message = inner.get("message") if isinstance(inner, dict) else body.get("message")
        detail = body.get("detail")
        if message is None and detail is not None:
            message = (
                detail
                if isinstance(detail, str)
                else "; ".join(
                    f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" if isinstance(d, dict) else str(d)
                    for d in (detail if isinstance(detail, list) else [detail])
                )
            )
    status = getattr(error, "status_code", None)
    return f"{message or described(error)}" + (f" ({status})" if status else "")


def openai_response_format(answer_format: AnswerFormat) -> dict:
    """`response_format` as an OpenAI-compatible engine takes it."""
    if answer_format.kind == "json_object":
        return {"type": "json_object"}
    described = {"name": answer_format.name or "answer", "schema": answer_format.schema, "strict": True}
    return {"type": "json_schema", "json_schema": described}


def request_fields(request: Request, chat: bool, context: int) -> tuple[dict, dict]:
    """(the fields of an OpenAI-compatible body for `request`, the optional ones an engine may refuse: vLLM's and
    SGLang's extras, usage); `context`: the engine's, which an answer may fill without a max_tokens."""
    s = request.sampling
    fields: dict = {"temperature": s.temperature, "top_p": s.top_p}
    if s.max_new_tokens < context:  # else up to the end of the context: the engine's own limit
        fields["max_tokens"] = s.max_new_tokens
    if s.seed is not None:
        fields["seed"] = s.seed
    if request.stop:
        fields["stop"] = list(request.stop)
    if request.logprobs is not None:
        fields |= {"logprobs": True, "top_logprobs": request.logprobs} if chat else {"logprobs": request.logprobs}
    optional: dict = {"stream_options": {"include_usage": True}}
    options = request.chat
    if options is not None and options.tools:  # the engine renders them and parses its calls itself
        fields |= {"tools": options.tools} | ({} if options.parallel_tool_calls else {"parallel_tool_calls": False})
        if options.tool_choice == "required":  # the engine holds the answer to a call, or refuses (its sentence shows)
            named = {"type": "function", "function": {"name": options.tool_name}}
            fields["tool_choice"] = named if options.tool_name else "required"
        else:
            optional["tool_choice"] = options.tool_choice  # transformers serve refuses it
    variables = dict(options.template_kwargs) if options is not None else {}
    if "reasoning_effort" in variables:  # OpenAI's own field, which engines map to their templates
        optional["reasoning_effort"] = variables.pop("reasoning_effort")
    body = {"chat_template_kwargs": variables} if variables else {}
    if request.answer_format is not None:  # the engine holds the answer to it, or refuses (its sentence shows)
        wire = openai_response_format(request.answer_format)
        fields, body = (
            (fields | {"response_format": wire}, body) if chat else (fields, body | {"response_format": wire})
        )
    if body:
        fields["extra_body"] = body
    extra = {"top_k": s.top_k} if s.top_k else {}
    extra |= {"repetition_penalty": s.repetition_penalty} if s.repetition_penalty != 1.0 else {}
    return fields, optional | ({"extra_body": extra} if extra else {})


# ----- the replies /v1 sends -----


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _wire(reply) -> dict:
    """One of the `openai` package's types as the JSON it stands for: the fields it was given, nulls included."""
    return reply.model_dump(mode="json", exclude_unset=True)


class Reply:
    """The answer to one /v1 request as it grows: OpenAI's chunks while it streams, or its whole body; `chat`: a chat
    completion (else a text completion); `include_usage`: the stream's chunks carry `usage` (null, then a last chunk
    with it); `logprobs`: the alternatives asked for at each token (None: no log-probabilities); `cited`: the web
    pages the answer may cite as [1], [2] (`web_search_options`: {"number", "name", "url"} each), whose citations it
    carries as `url_citation` annotations."""

    def __init__(
        self,
        model: str,
        chat: bool,
        include_usage: bool = False,
        logprobs: int | None = None,
        cited: list[dict] | None = None,
    ):
        self.model, self.chat, self.include_usage, self.asked_logprobs = model, chat, include_usage, logprobs
        self.cited = cited
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCallDelta] = []
        self.logprobs: list[TokenLogprob] = []
        self.end = End(FinishReason.ERROR, error="The answer ended without its last event.")

    def take(self, events: list) -> list:
        """Keep what `events` add to the answer; the events that a client is sent (answer, reasoning, calls)."""
        sent = []
        for event in events:
            if isinstance(event, Delta):
                self.text.append(event.text)
                self.logprobs.extend(event.logprobs)
            elif isinstance(event, Reasoning):
                self.reasoning.append(event.text)
            elif isinstance(event, ToolCallDelta):
                add_call_piece(self.calls, event)
            elif isinstance(event, End):
                self.end = event
                continue
            else:
                continue
            sent.append(event)
        return sent

    @property
    def finish_reason(self) -> str:
        return finish_to_wire(self.end.finish_reason)

    def _head(self) -> dict:
        return {"id": self.id, "created": self.created, "model": self.model}

    def first_chunk(self) -> dict:
        if not self.chat:
            return self._chunk("", [], None)
        return self._delta({"role": "assistant", "content": ""}, usage=False)

    def chunks(self, events: list) -> list[dict]:
        chunks = []
        for event in self.take(events):
            if isinstance(event, Delta):
                chunks.append(self._chunk(event.text, event.logprobs, None))
            elif isinstance(event, Reasoning):
                chunks.append(self._delta({"reasoning_content": event.text, "reasoning": event.text}))
            else:  # a tool call: its name first, then its arguments, as OpenAI streams them
                head = {"index": event.index, "id": event.id, "type": "function"}
                chunks.append(
                    self._delta({"tool_calls": [{**head, "function": {"name": event.name, "arguments": ""}}]})
                )
                if event.arguments:
                    piece = {"index": event.index, "function": {"arguments": event.arguments}}
                    chunks.append(self._delta({"tool_calls": [piece]}))
        if any(isinstance(event, End) for event in events) and self.end.finish_reason != FinishReason.ERROR:
            if self.cited is not None:
                chunks.append(self._delta({"annotations": self.annotations()}))
            chunks.append(self._chunk("", [], self.finish_reason))
        return chunks

    def _delta(self, delta: dict, usage: bool = True) -> dict:
        """A chat chunk whose delta is `delta` (reasoning, a tool call; extra fields such as `reasoning_content`
        kept as OpenAI's types allow them)."""
        from openai.types.chat import ChatCompletionChunk
        from openai.types.chat.chat_completion_chunk import Choice, ChoiceDelta

        choice = Choice(index=0, delta=ChoiceDelta.model_validate(delta), logprobs=None, finish_reason=None)
        with_usage = {"usage": None} if usage and self.include_usage else {}
        return _wire(
            ChatCompletionChunk(**self._head(), object="chat.completion.chunk", choices=[choice], **with_usage)
        )

    def _chunk(self, text: str, logprobs: list[TokenLogprob], finish: str | None) -> dict:
        from openai.types import Completion, CompletionChoice
        from openai.types.chat import ChatCompletionChunk
        from openai.types.chat.chat_completion_chunk import Choice, ChoiceDelta

        sent = self._logprobs(logprobs) if self.asked_logprobs is not None and logprobs else None
        with_usage = {"usage": None} if self.include_usage else {}
        if self.chat:
            delta = ChoiceDelta(content=text) if text or finish is None else ChoiceDelta()
            choice = Choice(index=0, delta=delta, logprobs=sent, finish_reason=finish)
            return _wire(ChatCompletionChunk(**self._head(), object="chat.completion.chunk", choices=[choice],
                                             **with_usage))  # fmt: skip
        # a text completion's chunk: OpenAI's `Completion` type, whose choices have no reason yet while it streams
        choice = CompletionChoice.model_construct(index=0, text=text, logprobs=sent, finish_reason=finish)
        return _wire(Completion.model_construct(**self._head(), object="text_completion", choices=[choice],
                                                **with_usage))  # fmt: skip

    def usage_chunk(self) -> dict:
        from openai.types import Completion
        from openai.types.chat import ChatCompletionChunk

        if self.chat:
            return _wire(ChatCompletionChunk(**self._head(), object="chat.completion.chunk", choices=[],
                                             usage=self.usage()))  # fmt: skip
        return _wire(Completion(**self._head(), object="text_completion", choices=[], usage=self.usage()))

    def usage(self):
        """The answer's `CompletionUsage` (speculative decoding's guesses as OpenAI's prediction tokens)."""
        from openai.types import CompletionUsage

        end = self.end
        return CompletionUsage(
            prompt_tokens=end.prompt_tokens,
            completion_tokens=end.completion_tokens,
            total_tokens=end.prompt_tokens + end.completion_tokens,
            prompt_tokens_details={"cached_tokens": end.cached_tokens},
            completion_tokens_details={
                "reasoning_tokens": end.reasoning_tokens,
                # OpenAI's fields for a prediction's tokens: here those speculative decoding guessed (--speculative)
                "accepted_prediction_tokens": end.accepted_tokens,
                "rejected_prediction_tokens": end.guessed_tokens - end.accepted_tokens,
            },
        )

    def whole(self) -> dict:
        from openai.types import Completion, CompletionChoice
        from openai.types.chat import ChatCompletion, ChatCompletionMessage
        from openai.types.chat.chat_completion import Choice

        text = "".join(self.text)
        logprobs = self._logprobs(self.logprobs) if self.asked_logprobs is not None else None
        if self.chat:
            message = ChatCompletionMessage.model_validate(self._message(text))
            choice = Choice(index=0, message=message, logprobs=logprobs, finish_reason=self.finish_reason)
            return _wire(ChatCompletion(**self._head(), object="chat.completion", choices=[choice], usage=self.usage()))
        choice = CompletionChoice(index=0, text=text, logprobs=logprobs, finish_reason=self.finish_reason)
        return _wire(Completion(**self._head(), object="text_completion", choices=[choice], usage=self.usage()))

    def _message(self, text: str) -> dict:
        """The whole answer as a chat message: its reasoning under both names clients read, its tool calls."""
        message = {"role": "assistant", "content": text if text or not self.calls else None}
        if self.reasoning:
            message["reasoning_content"] = message["reasoning"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [c.openai() for c in self.calls]
        if self.cited is not None:
            message["annotations"] = self.annotations()
        return message

    def annotations(self) -> list[dict]:
        """Each citation of a web page in the answer ("[2]") as OpenAI's `url_citation`: where it stands in the
        answer's text, and the page's address and title."""
        pages = {source["number"]: source for source in self.cited or []}
        found = []
        for match in re.finditer(r"\[(\d+)\]", "".join(self.text)):
            if (page := pages.get(int(match.group(1)))) is not None:
                citation = {"start_index": match.start(), "end_index": match.end(), "url": page["url"],
                            "title": page["name"]}  # fmt: skip
                found.append({"type": "url_citation", "url_citation": citation})
        return found

    def _logprobs(self, tokens: list[TokenLogprob]) -> dict:
        if self.chat:
            return {
                "content": [
                    {
                        "token": t.token,
                        "logprob": t.logprob,
                        "bytes": list(t.token.encode()),
                        "top_logprobs": [{"token": s, "logprob": v, "bytes": list(s.encode())} for s, v in t.top],
                    }
                    for t in tokens
                ]
            }
        offsets, at = [], sum(len(t) for t in self.text) - sum(len(t.token) for t in tokens)
        for t in tokens:
            offsets.append(at)
            at += len(t.token)
        return {
            "tokens": [t.token for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [dict(t.top) for t in tokens],
            "text_offset": offsets,
        }
