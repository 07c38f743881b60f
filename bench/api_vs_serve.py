"""The OpenAI-compatible API, through the official `openai` client: what it adds over the engine's own stream, and
how it compares with transformers' own OpenAI-compatible server (`transformers serve`) on the same folder.

One random Llama folder of the demo model's size, fp32 (what both servers load on the CPU), with a chat template
and a tokenizer without EOS, so every answer runs to `max_tokens`. Measured in turns, in one run:
- the engine's own stream (`MetaModel.stream`, in this process, with the threads the app's model runs with, the
  request built as /v1 builds it): when the first text is ready, and its tokens/s after that;
- the app (`python app.py --pretrained_path DIR`), streamed through the `openai` client: the same two figures as a
  client sees them; `api_ttft_overhead_ms` and `api_token_rate_ratio` compare them with the engine's own, round by
  round;
- `transformers serve DIR` and the app, one client each in turns, then 8 clients at once: time to first token,
  tokens/s, and the 8 clients' aggregate tokens/s (no install of `transformers[serving]`: those figures are left
  out). bench/batching.py sets 8 clients against `transformers serve --continuous-batching`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch

from local_chat.launchers.loading import free_port

from .models import SHAPES, save_random_llama

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "Who are you?"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def save_chat_llama(shape_name: str, folder: Path) -> Path:
    save_random_llama(SHAPES[shape_name], folder, dtype=torch.float32, with_eos=False)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_file.write_text(json.dumps(config, indent=2))
    return folder


@contextmanager
def openai_server(command: list[str], port: int, env: dict | None = None, timeout: float = 240.0):
    """Start a server on `port`; yield an `openai` client for it once /v1/models answers."""
    with openai_servers({"server": (command, port)}, env, timeout) as clients:
        yield clients["server"]


@contextmanager
def openai_servers(servers: dict[str, tuple[list[str], int]], env: dict | None = None, timeout: float = 240.0):
    """Start every server of `servers` (name: (command, port)) at once; yield {name: `openai` client} once each
    one's /v1/models answers."""
    from openai import OpenAI

    processes = {
        name: subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            # each app its own saved conversations (two apps on one database: the second is refused)
            env={
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "XDG_DATA_HOME": tempfile.mkdtemp(prefix="bench-"),
                **(env or {}),
            },
        )
        for name, (command, _) in servers.items()
    }
    clients = {
        name: OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0, timeout=600)
        for name, (_, port) in servers.items()
    }
    deadline = time.time() + timeout
    try:
        for name, client in clients.items():
            while True:
                if processes[name].poll() is not None:
                    command = " ".join(servers[name][0])
                    raise RuntimeError(f"{command} exited: {processes[name].stderr.read()[-2000:]}")
                try:
                    client.models.list()
                    break
                except Exception:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.5)
        yield clients
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def timed_answer(client, model: str, tokens: int, question: str = QUESTION) -> tuple[float, float, int, float]:
    """(seconds to the first text, to the last text, answer tokens, seconds in all) of one streamed greedy chat
    answer, as the client sees it."""
    started = time.perf_counter()
    first = last = None
    count = 0
    usage = None
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
            count += 1
    if first is None:
        raise AssertionError("the server sent no text")
    return first - started, last - started, usage or count, time.perf_counter() - started


def client_stream(client, model: str, tokens: int, question: str = QUESTION) -> tuple[float, float, int]:
    """(seconds to the first text, tokens/s after it, tokens) of one streamed chat answer, as the client sees it."""
    first, last, count, _ = timed_answer(client, model, tokens, question)
    return first, (count - 1) / (last - first) if last > first else float("nan"), count


def engine_stream(model, tokens: int) -> tuple[float, float]:
    """(seconds to the first text, tokens/s after it) of the engine's own stream, the request built as /v1 does."""
    from local_chat.api.routes import V1_CACHE_POOL
    from local_chat.engine import Delta, End, Request, Sampling
    from local_chat.prompting import chat_prompt, default_template

    started = time.perf_counter()
    built = chat_prompt(model.engine, default_template(model.engine), None, [], QUESTION, tokens)
    request = Request(built.text, Sampling(tokens, temperature=0.0), tuple(built.stop_symbols), session=V1_CACHE_POOL)
    first = last = None
    for event in model.engine.stream(request):
        if isinstance(event, Delta) and event.text:
            last = time.perf_counter()
            first = first or last
        elif isinstance(event, End):
            count = event.completion_tokens
    return first - started, (count - 1) / (last - first)


def crowd(client, model: str, clients: int, tokens: int) -> float:
    """Aggregate answer tokens/s of `clients` streams at once."""
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        counts = list(pool.map(lambda _: client_stream(client, model, tokens)[2], range(clients)))
    return sum(counts) / (time.perf_counter() - started)


def run(settings) -> dict[str, float]:
    from local_chat.model.meta import MetaModel

    tokens, repeats = settings.api_answer_tokens, settings.api_repeats
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        folder = save_chat_llama(settings.api_shape, Path(tmp) / "model")
        model = MetaModel.from_pretrained(str(folder))
        ours_port, theirs_port = free_port(), free_port()
        ours = [sys.executable, "app.py", "--pretrained_path", str(folder), "--port", str(ours_port)]
        with openai_server(ours, ours_port) as app:
            client_stream(app, "x", tokens), engine_stream(model, tokens)  # warm up
            extra, ratio = [], []
            for _ in range(repeats):
                own_first, own_rate = engine_stream(model, tokens)
                api_first, api_rate, _ = client_stream(app, "x", tokens)
                extra.append(api_first - own_first)
                ratio.append(api_rate / own_rate)
            del model
            results["api_ttft_overhead_ms"] = 1000 * statistics.median(extra)
            results["api_token_rate_ratio"] = statistics.median(ratio)
            if not has_serving():
                print("bench api: transformers[serving] is not installed; skipping the side-by-side", file=sys.stderr)
                return results
            serve = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve"]
            theirs = [*serve, str(folder), "--port", str(theirs_port), "--device", "cpu"]
            with openai_server(theirs, theirs_port) as peer:
                results.update(side_by_side(app, peer, str(folder), tokens, repeats, settings.load_clients))
    return results


def has_serving() -> bool:
    """Whether `transformers serve` can run here (pip install -e ".[bench]")."""
    try:
        import fastapi  # noqa: F401
        import openai  # noqa: F401
        import rich  # noqa: F401
        import uvicorn  # noqa: F401
        from transformers.cli.transformers import main  # noqa: F401
    except ImportError:
        return False
    return True


def side_by_side(app, peer, folder: str, tokens: int, repeats: int, clients: int) -> dict[str, float]:
    """One client, then `clients` at once, against each server in turns."""
    servers = {"ours": (app, "x"), "theirs": (peer, folder)}
    for client, name in servers.values():
        client_stream(client, name, tokens)  # warm up
    seen = {name: {"first": [], "rate": [], "crowd": []} for name in servers}
    for round_ in range(repeats):
        for name in ("ours", "theirs") if round_ % 2 == 0 else ("theirs", "ours"):
            client, model_name = servers[name]
            first, rate, _ = client_stream(client, model_name, tokens)
            seen[name]["first"].append(first)
            seen[name]["rate"].append(rate)
    for round_ in range(max(1, repeats // 2)):
        for name in ("ours", "theirs") if round_ % 2 == 0 else ("theirs", "ours"):
            client, model_name = servers[name]
            seen[name]["crowd"].append(crowd(client, model_name, clients, tokens))
    med = {name: {k: statistics.median(v) for k, v in figures.items()} for name, figures in seen.items()}
    return {
        "api_ttft_ms": 1000 * med["ours"]["first"],
        "serve_ttft_ms": 1000 * med["theirs"]["first"],
        "api_over_serve_ttft": med["ours"]["first"] / med["theirs"]["first"],
        "api_over_serve_token_rate": med["ours"]["rate"] / med["theirs"]["rate"],
        "api_crowd_tokens_per_s": med["ours"]["crowd"],
        "serve_crowd_tokens_per_s": med["theirs"]["crowd"],
        "api_over_serve_crowd": med["ours"]["crowd"] / med["theirs"]["crowd"],
    }
