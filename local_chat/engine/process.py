"""The browser launchers' two processes: the model in the launcher's process, the web server in one of its own.

Why two: on the CPU (and for small models on a GPU) a decoding step is mostly Python, so the model needs the GIL
nearly all the time. In one process, Gradio's event loop took it from the model for every request and every update
it sent: bench/ui_overhead.py measured 0.70-0.78 of the tokens/s a bare Gradio endpoint delivers, and 40-60 ms more
to the first piece. Apart, neither waits for the other, and on the CPU the model leaves one core to the server
(`leave_a_core_to_the_server`), whose threads would otherwise stall the model's parallel work.

Why the model stays in the launcher's process: that process is rank 0 of the --n_gpus and torchrun layouts
(model/parallel.py), so one layout serves them all; the server process only needs the tokenizer.

The server's side (`PipeEngine`) is the engine (engine/interface.py) the doors use there: it holds the tokenizer and
the model's facts, asks the model for prompt lengths, and streams answers over the pipe, only the new text of each
step. The model's side (`serve_model`) answers each request on a thread of its own, tagged with the request's
number; a cancel flag set in the server (Stop, a new message, a client gone) or a reader that leaves is passed on,
so the model stops within a step.
Either process ending ends the other: a model that dies (a worker lost, out of memory, killed) becomes one
sentence in the chat, and the server exits a moment later with it; a server that stops ends the launcher.
"""

from __future__ import annotations

import itertools
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from local_chat.errors import UserError, described
from local_chat.model.local_engine import LocalEngine
from local_chat.model.parallel import EXIT_AFTER_FAILURE_S

from .interface import Answer, End, EngineSummary, Event, Request, Sampling, collect

CANCEL_POLL_S = 0.02  # how often a request waiting for the model looks at its cancel flag and for a failure
FAILURE_POLL_S = 0.25  # how often the model's side looks for a failure (a tensor-parallel worker that died)


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


def leave_a_core_to_the_server(engine: LocalEngine) -> None:
    """On the CPU, the model's threads leave one core to the web server (and its clients on this machine): a
    parallel region waits for its slowest thread, and a server thread on the same core delays every step."""
    if engine.device.type == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads() - 1))


def serve_in_own_process(engine: LocalEngine, run_server: Callable, *server_args) -> None:
    """Start `run_server(engine, *server_args)` (a `PipeEngine` over `engine`) in a process of its own and answer
    its requests here until it ends; a server that fails ends this process with code 1."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    facts = model_facts(engine)
    server = context.Process(target=_server_main, name="web-server", args=(there, facts, run_server, server_args))
    server.start()
    there.close()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a terminated launcher ends its server too
    try:
        serve_model(engine, here)  # until the server's process ends
    except KeyboardInterrupt:
        pass
    finally:
        if server.is_alive():
            server.terminate()
        server.join()
    if server.exitcode == 1:
        raise SystemExit(1)  # it said why
    if server.exitcode not in (0, -signal.SIGTERM):
        print(f"error: the web server's process stopped (exit code {server.exitcode}).", file=sys.stderr)
        raise SystemExit(1)


# ----- the model's side -----


def serve_model(engine: LocalEngine, connection) -> None:
    """Answer the requests arriving on `connection` until the other side closes it."""
    send = _locked_sender(connection)
    cancels: dict[int, threading.Event] = {}
    stopped = threading.Event()
    threading.Thread(target=_report_failure, args=(engine, send, stopped), name="failure-watch", daemon=True).start()
    try:
        while True:
            try:
                request = connection.recv()
            except (EOFError, OSError):
                return
            if isinstance(request, StreamAnswer):
                cancels[request.number] = request.request.cancel = threading.Event()
                threading.Thread(
                    target=_stream, args=(engine, send, request, cancels), name="answer", daemon=True
                ).start()
            elif isinstance(request, CancelAnswer):
                if (event := cancels.get(request.number)) is not None:
                    event.set()
            elif isinstance(request, CountPrompt):
                send(_counted(engine, request))
            elif isinstance(request, DropSessions):
                engine.drop_sessions(request.browser_session)
    finally:
        stopped.set()


def _stream(engine: LocalEngine, send, asked: StreamAnswer, cancels: dict) -> None:
    try:
        for event in engine.stream(asked.request):
            send(Streamed(asked.number, event))
    finally:
        cancels.pop(asked.number, None)


def _counted(engine: LocalEngine, asked: CountPrompt) -> Counted | Refused:
    try:
        return Counted(asked.number, engine.prompt_length(asked.prompt, asked.images, asked.image_transform))
    except Exception as error:
        return Refused(asked.number, _portable(error))


def _portable(error: Exception) -> Exception:
    """`error` as the server can receive it: itself when it pickles, else a RuntimeError saying what it was; a bug
    (not the user's mistake nor memory running out) leaves its traceback in this terminal, where its frames are."""
    if not isinstance(error, (UserError, torch.OutOfMemoryError)):
        traceback.print_exception(error)
    try:
        pickle.dumps(error)
        return error
    except Exception:
        return RuntimeError(described(error))


def _report_failure(engine: LocalEngine, send, stopped: threading.Event) -> None:
    """Tell the server once the model cannot answer any more (model/parallel.py ends this process soon after)."""
    while not stopped.wait(FAILURE_POLL_S):
        if (sentence := engine.failure) is not None:
            send(ModelFailed(sentence))
            return


def _locked_sender(connection) -> Callable:
    lock = threading.Lock()

    def send(message) -> None:
        with lock:
            try:
                connection.send(message)
            except (OSError, EOFError):
                pass  # the server is gone; the request loop ends on its own

    return send


# ----- the server's side -----


def _server_main(connection, facts: dict, run_server: Callable, server_args: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the launcher, which ends this process
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # as it does: an exit that cleans up
    try:
        run_server(PipeEngine(connection, facts), *server_args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1)


def model_facts(engine) -> dict:
    """What the web server's process gets to know of the model once, at start-up (see `PipeEngine`)."""
    return {
        "tokenizer": engine.tokenizer,
        "chat_renderer": engine.chat_renderer,
        "summary": engine.summary(),
        "generation_defaults": engine.generation_defaults(),
    }


class PipeEngine:
    """The engine (engine/interface.py) of the model in another process, over a pipe."""

    def __init__(self, connection, facts: dict, end_process: bool = True):
        self.tokenizer = facts["tokenizer"]
        self.chat_renderer = facts["chat_renderer"]
        self._summary = facts["summary"]
        self._generation_defaults = facts["generation_defaults"]
        self.max_seq_len = self._summary.context
        self.sees_images = self._summary.sees_images
        self._connection = connection
        self._send = _locked_sender(connection)
        self._numbers = itertools.count()
        self._waiting: dict[int, queue.Queue] = {}
        self._failure: str | None = None
        self._end_process = end_process  # when the model's process ends (tests keep theirs)
        threading.Thread(target=self._receive, name="model-replies", daemon=True).start()

    def summary(self) -> EngineSummary:
        return self._summary

    def generation_defaults(self) -> Sampling:
        return self._generation_defaults

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

    def _open(self, message: Callable[[int], object]) -> tuple[int, queue.Queue]:
        """Send `message(number)` under a new request number, and the queue its replies will arrive in."""
        if self._failure is not None:
            raise UserError(self._failure)
        number = next(self._numbers)
        self._waiting[number] = replies = queue.Queue()
        self._send(message(number))
        return number, replies

    def _next(self, replies: queue.Queue, while_waiting: Callable[[], None] = lambda: None) -> Streamed | Counted:
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
