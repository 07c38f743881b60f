"""What an OpenAI-compatible engine sends back, read for engine/remote.py: server-sent events, a chunk's reasoning,
tool calls and log-probabilities in the engine interface's shape, an error's own message, and what a failed
connection raises."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx

from local_chat.errors import described
from local_chat.prompting.chat import message_text
from local_chat.prompting.response_formats import Region, ThinkSplitter

from .interface import AnswerFormat, Event, FinishReason, Request, TokenLogprob, ToolCallDelta

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
