"""The browser launchers' two processes: the model in the launcher's process, the web server in one of its own.

Why two: on the CPU (and for small models on a GPU) a decoding step is mostly Python, so the model needs the GIL
nearly all the time. In one process, Gradio's event loop took it from the model for every request and every update
it sent: bench/ui_overhead.py measured 0.70-0.78 of the tokens/s a bare Gradio endpoint delivers, and 40-60 ms more
to the first piece. Apart, neither waits for the other. On the CPU the model's threads take every core: the server
needs one only between tokens, and a decode step reads the weights at the pace of the memory, which two threads on
two cores drive faster than one (a 386M Llama, 2-core Xeon: 8.0 tokens/s on one thread, 13.5 on two in fp32).

Why the model stays in the launcher's process: that process is rank 0 of the --n_gpus and torchrun layouts
(model/parallel.py), so one layout serves them all; the server process only needs the tokenizer.

The server's side (`PipeEngine`, engine/pipe.py) is the engine the doors use there; its process starts before the
model loads (`WebServer`), so that its imports overlap the load. The model's side (`serve_model`) answers each
request on a thread of its own, tagged with the request's number, and stops one within a step of its cancel.
Either process ending ends the other: a model that dies (a worker lost, out of memory, killed) becomes one
sentence in the chat, and the server exits a moment later with it; a server that stops ends the launcher.
"""

from __future__ import annotations

import pickle
import signal
import sys
import threading
import traceback

import torch

from local_chat.errors import UserError, described
from local_chat.model.local_engine import LocalEngine

from .pipe import (
    CancelAnswer,
    Counted,
    CountPrompt,
    DropSessions,
    ModelFailed,
    Refused,
    StreamAnswer,
    Streamed,
    WebServer,
    locked_sender,
)

FAILURE_POLL_S = 0.25  # how often the model's side looks for a failure (a tensor-parallel worker that died)


def serve_in_own_process(server: WebServer, engine: LocalEngine, *server_args) -> None:
    """Hand `server` (started while the model loaded) `engine`'s facts and `server_args`, and answer its requests
    here until it ends; a server that fails ends this process with code 1."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a terminated launcher ends its server too
    try:
        server.hand_over(model_facts(engine), server_args)
        serve_model(engine, server.connection)  # until the server's process ends
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        server.close()
    server.exit_as_it_did()


# ----- the model's side -----


def serve_model(engine: LocalEngine, connection) -> None:
    """Answer the requests arriving on `connection` until the other side closes it."""
    send = locked_sender(connection)
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


def model_facts(engine) -> dict:
    """What the web server's process gets to know of the model once, at start-up (see `PipeEngine`)."""
    return {
        "tokenizer": engine.tokenizer,
        "chat_renderer": engine.chat_renderer,
        "summary": engine.summary(),
        "generation_defaults": engine.generation_defaults(),
    }
