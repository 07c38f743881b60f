"""One queue for every door: requests from the page and from /v1 take turns at the model in the order they arrived.

Gradio queues only its own events, and routes added beside it (the /v1 API) would skip that queue. So the page's
events run without a Gradio limit and every answer, whichever door it came through, waits here for one of
`--concurrency` places, first come first served. A request that waits hears how many go before it (`Queued`);
one cancelled while it waits leaves the queue without reaching the model.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

from .interface import Answer, End, Engine, EngineSummary, Event, FinishReason, Queued, Request, Sampling, collect

WAIT_POLL_S = 0.05  # how often a waiting request looks at its cancel flag


class InArrivalOrder:
    """`engine` with at most `places` answers at a time, the others served in arrival order."""

    def __init__(self, engine: Engine, places: int = 1):
        if places < 1:
            raise ValueError(f"places is {places}; give 1 or more")
        self.engine = engine
        self.places = places
        self._tickets = itertools.count()
        self._waiting: list[int] = []  # tickets in arrival order
        self._running = 0
        self._changed = threading.Condition()

    # the engine's facts and prompt lengths, unchanged
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_seq_len(self) -> int:
        return self.engine.max_seq_len

    @property
    def sees_images(self) -> bool:
        return self.engine.sees_images

    @property
    def chat_renderer(self):
        return self.engine.chat_renderer

    @property
    def renders_messages(self) -> bool:
        return getattr(self.engine, "renders_messages", False)

    @property
    def failure(self) -> str | None:
        return self.engine.failure

    def summary(self) -> EngineSummary:
        return self.engine.summary()

    def generation_defaults(self) -> Sampling:
        return self.engine.generation_defaults()

    def prompt_length(self, prompt: str, images=None, image_transform: str | None = None) -> int:
        return self.engine.prompt_length(prompt, images, image_transform)

    def messages_length(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        """An engine that renders messages itself (engine/remote.py): their tokens."""
        return self.engine.messages_length(messages, tools)

    def drop_sessions(self, browser_session: str) -> None:
        self.engine.drop_sessions(browser_session)

    def complete(self, requests: list[Request]) -> list[Answer]:
        return [collect(self.stream(request)) for request in requests]

    def stream(self, request: Request) -> Iterator[Event]:
        """`engine.stream(request)` once its turn comes; `Queued` events while it waits."""
        ticket = next(self._tickets)
        with self._changed:
            self._waiting.append(ticket)
        try:
            told = None
            while (ahead := self._ahead(ticket)) is not None:
                if request.cancel is not None and request.cancel.is_set():
                    yield End(FinishReason.CANCELLED)
                    return
                if ahead != told:
                    told = ahead
                    yield Queued(ahead)
                with self._changed:
                    self._changed.wait(WAIT_POLL_S)
        except BaseException:
            self._leave(ticket, started=False)
            raise
        try:
            yield from self.engine.stream(request)
        finally:
            self._leave(ticket, started=True)

    def _ahead(self, ticket: int) -> int | None:
        """None when `ticket` may start now (and then it has started); else how many requests go before it."""
        with self._changed:
            position = self._waiting.index(ticket)
            if position == 0 and self._running < self.places:
                self._waiting.pop(0)
                self._running += 1
                self._changed.notify_all()
                return None
            return position + self._running - self.places + 1

    def _leave(self, ticket: int, started: bool) -> None:
        with self._changed:
            if started:
                self._running -= 1
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
            self._changed.notify_all()
