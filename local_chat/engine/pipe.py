"""The web server's side of the browser launchers' two processes (engine/process.py says why two): `PipeEngine`,
the engine (engine/interface.py) the doors use there, over a pipe to the model's process, and what goes over that
pipe. It holds the tokenizer and the model's facts, asks the model for prompt lengths, and streams answers, only the
new text of each step; a cancel flag set here (Stop, a new message, a client gone) or a reader that leaves is passed
on, so the model stops within a step. Nothing here imports torch: the server's process starts while the model loads
and only needs Gradio and the tokenizer."""

from __future__ import annotations

import itertools
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from local_chat.defaults import EXIT_AFTER_FAILURE_S
from local_chat.errors import UserError

from .interface import Answer, End, EngineSummary, Event, Request, Sampling, collect

CANCEL_POLL_S = 0.02  # how often a request waiting for the model looks at its cancel flag and for a failure
CLOSE_WAIT_S = 10.0  # how long the launcher waits for its server's process to end before killing it


# ----- what goes over the pipe: from the server, numbered requests; from the model, replies to a number -----


@dataclass(frozen=True)
class StreamAnswer:
    """Answer `request`: its events come back as `Streamed` replies."""

    number: int
    request: Request


@dataclass(frozen=True)
class CancelAnswer:
    """Stop answering request `number` (Stop, a new message, a reader gone): the model stops at its next step."""

    number: int


@dataclass(frozen=True)
class CountPrompt:
    """How many tokens `prompt` (with its images) is: a `Counted` reply, or `Refused`."""

    number: int
    prompt: str
    images: list | None
    image_transform: str | None


@dataclass(frozen=True)
class DropSessions:
    """Forget the KV caches of a closed browser session (no reply)."""

    browser_session: str


@dataclass(frozen=True)
class Streamed:
    number: int
    event: Event


@dataclass(frozen=True)
class Counted:
    number: int
    tokens: int


@dataclass(frozen=True)
class Refused:
    """The request failed: `error` is raised in the server, where the request was made."""

    number: int
    error: Exception


@dataclass(frozen=True)
class ModelFailed:
    """The model cannot answer any more (a tensor-parallel worker died): every request fails with `sentence`."""

    sentence: str


@dataclass(frozen=True)
class LoadProgress:
    """How far a model's process has come in loading (--models_dir): its `stage` ("weights", "compiling",
    "preparing to answer") and, where known, the part of it `done` (0 to 1)."""

    stage: str
    done: float | None = None

    def __str__(self) -> str:
        return self.stage + (f" {self.done:.0%}" if self.done is not None else "")


def locked_sender(connection) -> Callable:
    """A send over `connection` that threads may share; a peer gone is no error (its reader ends on its own)."""
    lock = threading.Lock()

    def send(message) -> None:
        with lock:
            try:
                connection.send(message)
            except (OSError, EOFError):
                pass  # the server is gone; the request loop ends on its own

    return send


# ----- the server's side -----


class WebServer:
    """The web server's process, started before the model loads, so that its imports (Gradio's, and the tokenizer's
    and processor's code, seconds on the CPU) overlap the load; `hand_over` then gives it the model's facts and the
    arguments of `run_server(PipeEngine, *server_args)`."""

    def __init__(self, run_server: Callable):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.connection, there = context.Pipe()
        self.process = context.Process(target=server_main, name="web-server", args=(there, run_server))
        self.process.start()
        there.close()
        self.serving = False

    def hand_over(self, facts: dict, server_args: tuple) -> None:
        self.connection.send((facts, server_args))
        self.serving = True

    def close(self) -> None:
        """End the server's process (if it still runs) and wait for it. A server still starting finds the pipe
        closed first, so that it cannot wait for a model that will not come; a serving one is ended first, so
        that it never reports the model's process gone."""
        if not self.serving:
            self.connection.close()
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(timeout=CLOSE_WAIT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.connection.close()

    def exit_as_it_did(self) -> None:
        """Once it has ended: a server that failed ends this process with code 1 (saying why where it did not)."""
        if self.process.exitcode == 1:
            raise SystemExit(1)  # it said why
        if self.process.exitcode not in (0, -signal.SIGTERM):
            print(f"error: the web server's process stopped (exit code {self.process.exitcode}).", file=sys.stderr)
            raise SystemExit(1)


def server_main(connection, run_server: Callable) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the launcher, which ends this process
    # until it serves, nothing to clean up: ended at once (an exit raised inside an import could print or be caught)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    # while the launcher loads the model: Gradio, and what unpickling a tokenizer or processor imports
    import gradio  # noqa: F401
    import transformers.processing_utils  # noqa: F401

    try:
        facts, server_args = connection.recv()
    except (EOFError, OSError, KeyboardInterrupt):  # the launcher ended before its model loaded
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # as the launcher ends it: an exit that cleans up
    try:
        run_server(PipeEngine(connection, facts), *server_args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1)


class ModelFacts:
    """What the model's process tells of its model once it has loaded (`facts`: its "tokenizer", "chat_renderer",
    "summary" and "generation_defaults"): all a door reads of a model without asking it anything."""

    renders_messages = False  # the chat is rendered here, with the model's template

    def __init__(self, facts: dict):
        self.tokenizer = facts["tokenizer"]
        self.chat_renderer = facts["chat_renderer"]
        self._summary = facts["summary"]
        self._generation_defaults = facts["generation_defaults"]
        self.max_seq_len = self._summary.context
        self.sees_images = self._summary.sees_images

    def summary(self) -> EngineSummary:
        return self._summary

    def generation_defaults(self) -> Sampling:
        return self._generation_defaults


class PipeEngine(ModelFacts):
    """The engine (engine/interface.py) of the model in another process, over a pipe."""

    def __init__(self, connection, facts: dict, end_process: bool = True):
        super().__init__(facts)
        self._connection = connection
        self._send = locked_sender(connection)
        self._numbers = itertools.count()
        self._waiting: dict[int, queue.SimpleQueue] = {}
        self._failure: str | None = None
        self._end_process = end_process  # when the model's process ends (tests keep theirs)
        threading.Thread(target=self._receive, name="model-replies", daemon=True).start()

    @property
    def failure(self) -> str | None:
        """Why the model cannot answer any more, or None."""
        return self._failure

    def drop_sessions(self, browser_session: str) -> None:
        self._send(DropSessions(browser_session))

    def prompt_length(self, prompt: str, images=None, image_transform: str | None = None) -> int:
        number, replies = self._open(lambda number: CountPrompt(number, prompt, images, image_transform))
        try:
            return self._next(replies).tokens
        finally:
            self._waiting.pop(number, None)

    def complete(self, requests: list[Request]) -> list[Answer]:
        """One answer after the other (the model's process batches only what arrives together)."""
        return [collect(self.stream(request)) for request in requests]

    def stream(self, request: Request) -> Iterator[Event]:
        """The model's process's `LocalEngine.stream`: the same events; its failure ends the stream as one sentence."""
        cancel = request.cancel
        try:
            number, replies = self._open(lambda number: StreamAnswer(number, request.portable()))
        except UserError as error:
            yield End.failed(str(error))
            return

        def pass_on_cancel() -> None:
            nonlocal cancel
            if cancel is not None and cancel.is_set():
                self._send(CancelAnswer(number))
                cancel = None  # once is enough

        finished = False
        try:
            while True:
                try:
                    event = self._next(replies, pass_on_cancel).event
                except UserError as error:
                    finished = True
                    yield End.failed(str(error))
                    return
                finished = isinstance(event, End)
                yield event
                if finished:
                    return
        finally:
            self._waiting.pop(number, None)
            if not finished:
                self._send(CancelAnswer(number))  # the reader left: the model stops at its next step

    def _open(self, message: Callable[[int], object]) -> tuple[int, queue.SimpleQueue]:
        """Send `message(number)` under a new request number, and the queue its replies will arrive in."""
        if self._failure is not None:
            raise UserError(self._failure)
        number = next(self._numbers)
        self._waiting[number] = replies = queue.SimpleQueue()  # put and get in C: no Python-level Condition
        self._send(message(number))
        return number, replies

    def _next(self, replies: queue.SimpleQueue, while_waiting: Callable[[], None] = lambda: None) -> Streamed | Counted:
        """The next reply to a request; raises its error, or the model's failure."""
        while True:
            try:
                reply = replies.get(timeout=CANCEL_POLL_S)
            except queue.Empty:
                if self._failure is not None:
                    raise UserError(self._failure)
                while_waiting()
                continue
            if isinstance(reply, Refused):
                raise reply.error
            return reply

    def _receive(self) -> None:
        """Hand each reply to the request it answers; when the model's process ends, fail every request."""
        while True:
            try:
                reply = self._connection.recv()
            except (EOFError, OSError):
                break
            if isinstance(reply, ModelFailed):
                self._failure = reply.sentence
            elif (replies := self._waiting.get(reply.number)) is not None:
                replies.put(reply)
        self._model_gone()

    def _model_gone(self) -> None:
        """The launcher's process ended: say so (unless it said why already), then end this server too."""
        told = self._failure is not None
        if not told:
            self._failure = (
                "The model's process stopped, so the model cannot answer any more; restart the app "
                "(see its terminal for why)."
            )
        if self._end_process:
            if not told:
                print(f"error: {self._failure}", file=sys.stderr, flush=True)
                time.sleep(EXIT_AFTER_FAILURE_S)  # long enough for the sentence to reach the browser
            os._exit(1)
