"""One /v1 answer as it grows (`Reply`): OpenAI's chunks while it streams (server-sent events), or its whole body,
with the usage, the reasoning, the tool calls and the log-probabilities the request asked for."""

from __future__ import annotations

import json
import secrets
import time

from local_chat.engine import Delta, End, FinishReason, Reasoning, TokenLogprob, ToolCallDelta
from local_chat.engine.interface import add_call_piece
from local_chat.engine.openai_wire import finish_to_wire

from .requests import Call


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class Reply:
    """The answer to one /v1 request as it grows: OpenAI's chunks while it streams, or its whole body."""

    def __init__(self, model: str, chat: bool, call: Call):
        self.model, self.chat, self.call = model, chat, call
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

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def first_chunk(self) -> dict:
        if not self.chat:
            return self._chunk("", [], None)
        return {
            **self._head("chat.completion.chunk"),
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            ],
        }

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
            chunks.append(self._chunk("", [], self.finish_reason))
        return chunks

    def _delta(self, delta: dict) -> dict:
        """A chat chunk whose delta is `delta` (reasoning, or a tool call)."""
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        chunk = {**self._head("chat.completion.chunk"), "choices": [choice]}
        if self.call.include_usage:
            chunk["usage"] = None
        return chunk

    def _chunk(self, text: str, logprobs: list[TokenLogprob], finish: str | None) -> dict:
        if self.chat:
            choice = {"index": 0, "delta": {"content": text} if text or finish is None else {}}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text}
            kind = "text_completion"
        choice["logprobs"] = self._logprobs(logprobs) if self.call.logprobs is not None and logprobs else None
        choice["finish_reason"] = finish
        chunk = {**self._head(kind), "choices": [choice]}
        if self.call.include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self) -> dict:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [], "usage": self.usage()}

    def usage(self) -> dict:
        end = self.end
        return {
            "prompt_tokens": end.prompt_tokens,
            "completion_tokens": end.completion_tokens,
            "total_tokens": end.prompt_tokens + end.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": end.cached_tokens},
            "completion_tokens_details": {
                "reasoning_tokens": end.reasoning_tokens,
                # OpenAI's fields for a prediction's tokens: here those speculative decoding guessed (--speculative)
                "accepted_prediction_tokens": end.accepted_tokens,
                "rejected_prediction_tokens": end.guessed_tokens - end.accepted_tokens,
            },
        }

    def whole(self) -> dict:
        text = "".join(self.text)
        logprobs = self._logprobs(self.logprobs) if self.call.logprobs is not None else None
        if self.chat:
            choice = {"index": 0, "message": self._message(text)}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text}
            kind = "text_completion"
        choice.update(logprobs=logprobs, finish_reason=self.finish_reason)
        return {**self._head(kind), "choices": [choice], "usage": self.usage()}

    def _message(self, text: str) -> dict:
        """The whole answer as a chat message: its reasoning under both names clients read, its tool calls."""
        message = {"role": "assistant", "content": text if text or not self.calls else None}
        if self.reasoning:
            message["reasoning_content"] = message["reasoning"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [c.openai() for c in self.calls]
        return message

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
