"""Serve the real app in this process on a free port, over a model whose forward passes are counted (and can be
slowed down), so a test can see when the server really stops computing; or start a real launcher (`launched`)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from local_chat.api import OpenAIAPI
from local_chat.defaults import MAX_UPLOAD_MB
from local_chat.engine.in_order import InArrivalOrder
from local_chat.launchers.loading import free_port
from local_chat.prompting import default_template
from local_chat.ui import build_app
from local_chat.ui.chat_tab import ChatSettings
from local_chat.ui.history import SavedChats
from local_chat.ui.layout import PAGE

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # the project is installed (pip install -e .)


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


# the keys of each record `demos/generate.py --output` writes
GENERATE_RECORD_KEYS = {
    "prompt",
    "response",
    "reasoning",
    "tool_calls",
    "finish_reason",
    "input_tokens",
    "output_tokens",
}


def generate_here(tmp_path: Path, name: str, *flags: str) -> str:
    """What `demos/generate.py --output FILE *flags` writes to FILE, run in this process (a reference for a run in
    other processes: no launch to wait for)."""
    from local_chat.launchers.generate import main

    output = tmp_path / f"{name}.jsonl"
    main(["--output", str(output), *flags])
    return output.read_text()


def generate(tmp_path: Path, name: str, *flags: str, launcher=(sys.executable,)) -> str:
    """What `demos/generate.py --output FILE *flags` (run by `launcher`) writes to FILE."""
    output = tmp_path / f"{name}.jsonl"
    result = subprocess.run(
        [*launcher, str(ROOT / "demos" / "generate.py"), "--output", str(output), *flags],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return output.read_text()


def launched(*flags: str, launcher=(sys.executable,), env: dict | None = None, port: int | None = None, auth=None):
    """(process, gradio_client) of `python app.py *flags` (or `torchrun ... app.py` with `launcher=TORCHRUN`) on
    `port` (default: a free one), once it answers, with `env` added to its environment. It runs in a session of its
    own, as from a terminal: `interrupted` is its Ctrl-C. `auth`: (user, password) of an app started with --auth."""
    from gradio_client import Client

    port = port or free_port()
    app = subprocess.Popen(
        [*launcher, str(ROOT / "app.py"), "--port", str(port), *flags],
        start_new_session=True,
        preexec_fn=_ctrl_c_as_in_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**ENV, "XDG_DATA_HOME": tempfile.mkdtemp(prefix="app-data-"), **(env or {})},  # its own history
    )
    deadline, client = time.time() + 120, None
    while client is None and time.time() < deadline and app.poll() is None:
        try:
            client = Client(f"http://127.0.0.1:{port}", verbose=False, auth=auth)
        except Exception:
            time.sleep(0.5)
    assert client is not None, app.stdout.read() if app.poll() is not None else "the app did not start"
    return app, client


def v1_answer(client, question: str) -> str:
    """The greedy answer to `question` through the /v1 API of the app `client` (a gradio_client) talks to."""
    from openai import OpenAI

    api = OpenAI(base_url=client.src.rstrip("/") + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": question}]
    return api.chat.completions.create(model="x", messages=messages, temperature=0.0).choices[0].message.content


def _ctrl_c_as_in_a_terminal() -> None:
    """A test run started in the background (`cmd &` in a script, nohup) ignores SIGINT, and so would the app it
    starts: Python then installs no Ctrl-C handler at all. In a terminal, Ctrl-C is never ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted(app: subprocess.Popen) -> str:
    """Ctrl-C in the terminal of a `launched` app (SIGINT to all its processes); what it printed, once every
    process that could print has ended. An app still running a minute later is killed (no process outlives the test)."""
    os.killpg(app.pid, signal.SIGINT)
    try:
        output, _ = app.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(app.pid, signal.SIGKILL)
        raise
    return output


def wait_for_pieces(job, count: int) -> None:
    """Wait until a gradio_client `job` has shown `count` pieces of its answer, or has ended: an answer too quick
    for the wait then fails the test's own checks instead of hanging it."""
    while len(job.outputs()) < count and not job.done():
        time.sleep(0.01)


def stopped_mid_answer(url: str, counter) -> int:
    """Ask the app at `url` "Who are you?" through /chat (gradio_client), cancel it three pieces in, and check that the
    model counted by `counter` did at most two more forward passes and stopped early; the count it settled at."""
    from gradio_client import Client

    job = Client(url, verbose=False).submit(message="Who are you?", history=[], max_gen_len=200, api_name="/chat")
    wait_for_pieces(job, 3)
    job.cancel()
    at_cancel = counter.calls
    stopped_at = counter.settled(quiet=0.5)
    assert stopped_at - at_cancel <= 2, f"{stopped_at - at_cancel} forward passes after Stop"
    assert stopped_at < 40  # the whole answer is about 50 tokens: it really stopped early
    return stopped_at


class ForwardCounter:
    """Wraps `model.llma.forward`: counts calls, and sleeps `delay` seconds in each (a slow model)."""

    def __init__(self, model, delay: float = 0.0):
        self.model, self.delay, self.calls = model, delay, 0
        self._lock = threading.Lock()
        self._original = model.llma.forward

        def counted(*args, **kwargs):
            with self._lock:
                self.calls += 1
            if self.delay:
                time.sleep(self.delay)
            return self._original(*args, **kwargs)

        model.llma.forward = counted

    def restore(self) -> None:
        self.model.llma.forward = self._original

    def settled(self, quiet: float = 1.0, timeout: float = 10.0) -> int:
        """The call count once no call has happened for `quiet` seconds."""
        deadline = time.time() + timeout
        last = self.calls
        while time.time() < deadline:
            time.sleep(quiet)
            if self.calls == last:
                return last
            last = self.calls
        return self.calls


def answer_of(history: list[dict]) -> str:
    """The last answer of a chat's history (its figures, shown under it, left out)."""
    return next(m["content"] for m in reversed(history) if not (m.get("metadata") or {}).get("title"))


def submit(
    tab,
    message,
    history=(),
    image=None,
    conversation=None,
    browser_id=None,
    session="tab",
    username=None,
    thinking=None,
    template="default",
    **settings,
):
    """A chat tab's Send handler as Gradio runs it (greedy, default template): `message` (text, `image` attached, or
    the box's {"text", "files"}) after `history`, in `conversation` of `browser_id` or `username`; returns its last
    (history, message box, prompt, conversation, conversation list)."""
    sampling = dict(max_gen_len=64, temperature=0.0, top_p=0.75, top_k=0, repetition_penalty=1.0) | settings
    box = message if isinstance(message, dict) else {"text": message, "files": [image] if image else []}

    settings = ChatSettings(conversation, browser_id, template, None, "padded_resize", **sampling, thinking=thinking)
    request = SimpleNamespace(session_hash=session, username=username)
    return last_of(tab.submit(request, box, list(history), settings))


def last_of(updates):
    """The last update a page handler (an async generator) yields, run to its end."""

    async def drain():
        update = None
        async for update in updates:
            pass
        return update

    return asyncio.run(drain())


@contextmanager
def serve(
    model,
    tabs=("chat", "single"),
    delay: float = 0.0,
    concurrency: int = 1,
    api_keys=None,
    max_upload_mb: float = MAX_UPLOAD_MB,
    store=None,
    **server,
):
    """Yield (url, counter) for the app over `model`, with the /v1 API (asking for one of `api_keys` if given), as
    the launchers serve them, until the block ends; conversations are kept in `store` (a history.Store) if given;
    `server`: serve_engine's `port`, `auth`, `tool_servers` and `web`."""
    counter = ForwardCounter(model, delay)
    try:
        with serve_engine(model.engine, tabs, concurrency, api_keys, max_upload_mb, store, **server) as url:
            yield url, counter
    finally:
        counter.restore()


@contextmanager
def serve_engine(
    engine,
    tabs=("chat", "single"),
    concurrency: int = 1,
    api_keys=None,
    max_upload_mb: float = MAX_UPLOAD_MB,
    store=None,
    port: int | None = None,
    auth=None,
    tool_servers=None,
    web=None,
):
    """Yield the url of the app and its /v1 API over `engine` (a model, or engine/remote.py's `RemoteEngine`), on
    `port` (default: a free one), asking for one of the (user, password) `auth` logins if given; `web`: the web
    search (web/context.py's `WebResearch`) of the page's switch and of /v1's `web_search_options`."""
    queue = InArrivalOrder(engine, concurrency)
    app = build_app(queue, tabs, max_upload_mb=max_upload_mb, store=store, tool_servers=tool_servers, web=web)
    app.queue(default_concurrency_limit=concurrency)
    api = OpenAIAPI(queue, default_template(queue), "auto", max_upload_mb, api_keys)
    api.web = web
    routes = api.routes() + ([SavedChats(store).route()] if store is not None else [])
    port = port or free_port()
    app.launch(
        server_name="127.0.0.1",
        server_port=port,
        prevent_thread_lock=True,
        quiet=True,
        auth=auth,
        app_kwargs={"routes": routes},
        **PAGE,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        app.close()
