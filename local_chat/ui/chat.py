"""What the page does with an engine's answers, apart from Gradio: the growing text and its figures from the
engine's events, a cancel flag per tab."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from local_chat.engine import (
    Delta,
    End,
    Engine,
    FinishReason,
    Loading,
    Queued,
    Reasoning,
    Rendered,
    Request,
    ToolCallDelta,
)
from local_chat.engine.interface import SessionKey, add_call_piece, in_session
from local_chat.engine.threaded import in_own_thread

UPDATE_INTERVAL = 1 / 30  # seconds between two updates of an answer on the page, at the least


@dataclass
class AnswerUpdate:
    """An answer as it stands: its text, the figures line (or the place in the queue), its error sentence, the
    prompt the engine rendered (in the update that brings it), and a reasoning model's thought with how long it has
    thought (until the answer began, or the thought stopped)."""

    text: str = ""
    line: str = ""
    error: str | None = None
    rendered: Rendered | None = None
    reasoning: str = ""
    thought_seconds: float | None = None  # how long it thought (so far, while it still does)
    ended: bool = False
    stopped: bool = False  # it ended cancelled (Stop, a new message, a closed tab)
    tool_calls: list[ToolCallDelta] = field(default_factory=list)  # the calls it made, whole

    @property
    def thinking_done(self) -> bool:
        return bool(self.text) or self.ended


async def answer_updates(engine: Engine, request: Request) -> AsyncIterator[AnswerUpdate]:
    """`request`'s answer as it grows, at most every `UPDATE_INTERVAL` seconds; the last update has the answer's
    figures, or its error."""
    update, thought_since = AnswerUpdate(), None
    async for events in in_own_thread(engine.stream(request), UPDATE_INTERVAL, instant=(Rendered, Queued, Loading)):
        update.line, update.rendered = "", None
        for event in events:
            if isinstance(event, Reasoning):
                thought_since = thought_since or time.perf_counter()
                update.reasoning += event.text
            if thought_since is not None and not update.thinking_done:
                update.thought_seconds = time.perf_counter() - thought_since
            if isinstance(event, End):
                update.ended, update.stopped = True, event.finish_reason == FinishReason.CANCELLED
            if isinstance(event, ToolCallDelta):
                add_call_piece(update.tool_calls, event)
            if isinstance(event, Delta):
                update.text += event.text
            elif isinstance(event, Rendered):
                update.rendered = event
            elif isinstance(event, Queued):
                update.line = queue_line(event)
            elif isinstance(event, Loading):
                update.line = f"Waiting for the model: {event.sentence}."
            elif isinstance(event, End) and event.finish_reason == FinishReason.ERROR:
                update.error = event.error
            elif isinstance(event, End):
                update.line = stats_line(event)
        yield update


def stats_line(end: End) -> str:
    first_text = f" · first token {end.time_to_first_token:.2f} s" if end.completion_tokens else ""
    cut = " · cut at the length limit" if end.finish_reason == FinishReason.LENGTH else ""
    # how much of the prompt the conversation's KV cache held (a new turn, or a branch shown again: up to the fork)
    cached = f" · prompt {end.prompt_tokens} tokens, {end.cached_tokens} from the cache" if end.cached_tokens else ""
    guessed = (
        f" · {end.accepted_tokens} of {end.guessed_tokens} guessed tokens taken" if end.guessed_tokens else ""
    )  # --speculative
    return f"{end.completion_tokens} tokens{first_text} · {end.tokens_per_second:.1f} tokens/s{guessed}{cached}{cut}"


def queue_line(queued: Queued) -> str:
    ahead = queued.ahead
    return f"Waiting for the model: {ahead} request{'s' if ahead != 1 else ''} before this one."


class Cancels:
    """One cancel flag per door of a browser session (`SessionKey`): Stop or a new message stops that door's answer
    only, a closed page stops every answer of its session."""

    def __init__(self):
        self._events: dict[SessionKey, threading.Event] = {}
        self._lock = threading.Lock()

    def fresh(self, key: SessionKey) -> threading.Event:
        """Cancel what this tab of a session is generating, and hand out the flag for its next answer."""
        with self._lock:
            old = self._events.get(key)
            if old is not None:
                old.set()
            self._events[key] = event = threading.Event()
            return event

    def cancel(self, key: SessionKey) -> None:
        with self._lock:
            event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def cancel_session(self, session: str) -> None:
        with self._lock:
            keys = [k for k in self._events if in_session(k, session)]
        for key in keys:
            self.cancel(key)
