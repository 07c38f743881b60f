"""The front's start-up: `python app.py --api_base URL` (no model in the app) from process start to the first HTTP
200 on `/`, against a stub engine, beside `python -c "import gradio"` in the same run (interleaved, medians).

The issue's goal: at most 3 s, or at most gradio's import + 1 s, whichever is larger. The front imports neither torch
nor transformers (tests/test_package.py checks it with `python -X importtime`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from local_chat.launchers.loading import free_port

from .timing import interleaved_values

ROOT = Path(__file__).resolve().parent.parent
MODEL_CARD = {"id": "stub", "object": "model", "owned_by": "bench", "max_model_len": 4096}


class _StubEngine(BaseHTTPRequestHandler):
    """An OpenAI-compatible engine that only lists its model: what the front asks an engine at start-up."""

    def do_GET(self):
        if self.path.rstrip("/").endswith("/v1/models"):
            self._reply(200, {"object": "list", "data": [MODEL_CARD]})
        else:
            self._reply(404, {"error": {"message": "not here"}})

    def do_POST(self):
        self._reply(404, {"error": {"message": "not here"}})

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


@contextmanager
def stub_engine() -> Iterator[str]:
    """The /v1 address of a stub engine served on a thread while the context lasts."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def started_front(api_base: str, python: tuple[str, ...] = (sys.executable,), app: Path = ROOT / "app.py"):
    """(seconds from process start to the first 200 on `/`, the file its output goes to) of `python app.py
    --api_base api_base`; the process is ended when the context leaves."""
    port = free_port()
    command = [*python, str(app), "--api_base", api_base, "--port", str(port), "--no_history"]
    env = {**os.environ, "XDG_DATA_HOME": tempfile.mkdtemp(prefix="front-")}
    output = Path(env["XDG_DATA_HOME"]) / "output.txt"
    started = time.perf_counter()
    with output.open("w") as sink:
        process = subprocess.Popen(command, cwd=app.parent, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        while process.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.01)
        if process.poll() is not None:
            raise RuntimeError(f"the front exited: {output.read_text()[-2000:]}")
        yield time.perf_counter() - started, output
    finally:
        process.terminate()
        process.wait(timeout=30)


def front_start_s(api_base: str, app: Path = ROOT / "app.py") -> float:
    with started_front(api_base, app=app) as (seconds, _):
        return seconds


def gradio_import_s() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import gradio"], check=True)
    return time.perf_counter() - started


def run(settings) -> dict[str, float]:
    with stub_engine() as url:
        times = interleaved_values(
            {"front": lambda: front_start_s(url), "gradio": gradio_import_s}, settings.front_repeats, settings.warmups
        )
    return {
        "front_start_s": statistics.median(times["front"]),
        "front_start_over_gradio_import_s": statistics.median(a - b for a, b in zip(times["front"], times["gradio"])),
    }
