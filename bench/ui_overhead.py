"""What the app adds on top of Gradio itself, seen by a program calling it: rates through gradio_client, first
pieces off Gradio's HTTP stream (`http_first_piece` says why).

Three things are measured in one run, for the same questions, in turns:
- the model's own pieces (one per token), generated in this process through the app's prompt and streaming
  helpers, with the threads the app's model runs with: when each piece is ready after the call starts (its time
  to first piece, its tokens/s);
- the real launcher (`python app.py --pretrained_path ...`, its /chat endpoint), in a subprocess;
- a bare Gradio endpoint (bench/bare_gradio.py) replaying the model's recorded pieces at the recorded pace.
Each client-side figure is taken relative to what the server side needed, and the app's extra is compared with
the bare endpoint's: what is left is our own overhead. Rates count answer tokens, not pieces: the app sends the
newest answer at most 30 times a second, so one piece it sends can hold several tokens.

The model's own pace varies by 10-20% from one answer to the next on a shared CPU, so it is timed again in every
round, between the clients' runs, and the app's rate and first piece are compared with the model's in the same
round (comparing with the one recording the bare endpoint replays moved the rate ratio between 0.83 and 1.10).

The model is a random Llama the size of the demo model whose tokenizer has no EOS, so every answer runs to
`max_gen_len`: gradio_client hands over what arrived every 50 ms, and only long answers make its rates
precise (the demo model's answers last a third of a second).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from local_chat.launchers.loading import free_port
from local_chat.model.meta import MetaModel

from .models import SHAPES, save_random_llama

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ["Who are you?", "What can you do?"]
FIRST_PIECE_TOKENS = 8  # the answers timed for their first piece: short, so that they cost little
RECORDINGS = 3  # answers recorded per question before the servers start; the bare endpoint replays the median


@dataclass
class Timeline:
    """When each piece of one answer was ready (server side) or arrived (client side), from the call's start."""

    times: list[float]
    texts: list[str]

    @property
    def first(self) -> float:
        return self.times[0]

    @property
    def rate(self) -> float:
        """Pieces per second after the first."""
        span = self.times[-1] - self.times[0]
        return (len(self.times) - 1) / span if span > 0 else float("nan")

    def token_rate(self, model_pieces: Timeline) -> float:
        """Answer tokens per second after the first piece: how fast the text grows for the reader. The app sends
        the newest answer at most every `ui.chat.UPDATE_INTERVAL`, so one piece it sends can hold several of the
        model's; each text seen is counted as the number of model pieces (tokens) it holds."""
        tokens = {text: count for count, text in reversed(list(enumerate(model_pieces.texts, 1)))}
        span = self.times[-1] - self.times[0]
        return (tokens[self.texts[-1]] - tokens[self.texts[0]]) / span if span > 0 else float("nan")


def typical(runs: list[Timeline]) -> Timeline:
    """The run of median pace: what the bare endpoint replays (one run's pace varies by 10-20% from the next)."""
    return sorted(runs, key=lambda run: run.rate)[len(runs) // 2]


def model_timeline(model: MetaModel, question: str, length: int) -> Timeline:
    """The pieces /chat yields for `question` (greedy), timed as the model makes them."""
    from local_chat.engine import Delta, Request, Sampling
    from local_chat.prompting import chat_prompt, default_template

    chat = chat_prompt(model.engine, default_template(model.engine), None, [], question, answer_tokens=length)
    started = time.perf_counter()
    times, texts, text = [], [], ""
    for event in model.engine.stream(Request(chat.text, Sampling(length, temperature=0.0), tuple(chat.stop_symbols))):
        if isinstance(event, Delta):
            text += event.text
            times.append(time.perf_counter() - started)
            texts.append(text.strip())
    return Timeline(times, texts)


def http_first_piece(client, question: str, length: int) -> float:
    """Seconds from a call of /chat to its first piece, read off Gradio's own HTTP stream (its /call API).

    gradio_client hands pieces over on a 50 ms tick (it sleeps 0.05 s whenever it has none), which moves a first
    piece to the next tick: the app's and the bare endpoint's first pieces then land on either side of a tick, and
    their difference jumps between about 0 and 50 ms. Rates, over hundreds of tokens, are measured through it."""
    import httpx

    url = f"{client.src.rstrip('/')}/gradio_api/call/chat"
    given = {"message": question, "history": [], "max_gen_len": length, "temperature": 0.0}
    parameters = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/chat"]["parameters"]
    data = [given.get(p["parameter_name"], p.get("parameter_default")) for p in parameters]  # /call wants them all
    started = time.perf_counter()
    event_id = httpx.post(url, json={"data": data}).json()["event_id"]
    first, event = None, None
    with httpx.stream("GET", f"{url}/{event_id}", timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event in ("generating", "complete") and first is None:
                first = time.perf_counter() - started
            if event in ("complete", "error") and line.startswith("data:"):
                break
    if first is None or event != "complete":
        raise AssertionError(f"/chat at {url} did not answer: its last event was {event!r}")
    return first


def client_timeline(client, question: str, length: int, history: list[dict] | None = None) -> Timeline:
    started = time.perf_counter()
    job = client.submit(message=question, history=history or [], max_gen_len=length, temperature=0.0, api_name="/chat")
    times, texts = [], []
    while True:  # polled like Job.__next__ does, which does not always see the end of a job
        done = job.done()
        for text in job.outputs()[len(texts) :]:
            times.append(time.perf_counter() - started)
            texts.append(text)
        if done:
            return Timeline(times, texts)
        time.sleep(0.001)


@contextmanager
def server(command: list[str], timeout: float = 180.0):
    """Start `command` (which serves on the port it is given) and yield a gradio_client for it."""
    with servers([command], timeout) as [client]:
        yield client


@contextmanager
def servers(commands: list[list[str]], timeout: float = 180.0):
    """Start every command of `commands` at once (each serves on the port it is given); yield a gradio_client for
    each, in order, once all answer."""
    started = []
    for command in commands:
        port = free_port()
        process = subprocess.Popen(
            command + ["--port", str(port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "XDG_DATA_HOME": tempfile.mkdtemp(prefix="bench-")},  # its own saved conversations
        )
        started.append((process, f"http://127.0.0.1:{port}/"))
    try:
        deadline = time.time() + timeout
        yield [connect(process, url, deadline) for process, url in started]
    finally:
        for process, _ in started:
            process.terminate()
        for process, _ in started:
            process.wait(timeout=30)


def connect(process: subprocess.Popen, url: str, deadline: float):
    from gradio_client import Client

    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(process.args)} exited: {process.stderr.read()[-2000:]}")
        try:
            return Client(url, verbose=False)
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def run(settings) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        folder = save_random_llama(SHAPES[settings.ui_shape], Path(tmp) / "model", with_eos=False)
        model = MetaModel.from_pretrained(str(folder))
        own = {
            q: [model_timeline(model, q, settings.ui_answer_tokens) for _ in range(RECORDINGS + 1)][1:]
            for q in QUESTIONS[: settings.ui_questions]
        }
        replayed = {q: typical(runs) for q, runs in own.items()}
        schedule = {
            q: [[t, text] for t, text in zip(timeline.times, timeline.texts)] for q, timeline in replayed.items()
        }
        (Path(tmp) / "schedule.json").write_text(json.dumps(schedule))
        with (
            server([sys.executable, "app.py", "--pretrained_path", str(folder)]) as app,
            server([sys.executable, "-m", "bench.bare_gradio", "--schedule", str(Path(tmp) / "schedule.json")]) as bare,
        ):
            seen = compare_clients(app, bare, model, replayed, settings)
    gradio_rate_ratio = statistics.median(seen["bare_rate_ratio"])
    return {
        "ui_ttft_overhead_ms": 1000 * (statistics.median(seen["app_extra"]) - statistics.median(seen["bare_extra"])),
        "ui_token_rate_ratio": statistics.median(seen["app_over_own"]) / gradio_rate_ratio,
        "gradio_ttft_overhead_ms": 1000 * statistics.median(seen["bare_extra"]),
        "gradio_rate_ratio": gradio_rate_ratio,
    }


def compare_clients(app, bare, model: MetaModel, replayed: dict[str, Timeline], settings) -> dict[str, list[float]]:
    """Ask both servers the same questions in turns, and time the model's own answer in each round too; each
    figure relative to what the server side needed. `ui_token_rate_ratio` is the app's rate over the model's own
    in the same round (median over rounds), over what Gradio alone delivers of the pace it is given
    (`gradio_rate_ratio`)."""
    length = settings.ui_answer_tokens
    seen = {"app_extra": [], "bare_extra": [], "app_over_own": [], "bare_rate_ratio": []}
    for question in replayed:  # warm up both servers
        client_timeline(app, question, length), client_timeline(bare, question, length)
    for round_ in range(settings.ui_repeats):
        for question, recorded in replayed.items():  # `recorded`: what the bare endpoint replays
            mine = model_timeline(model, question, length)  # the model's own pace in this round
            for name in ("app", "bare") if round_ % 2 == 0 else ("bare", "app"):
                client = app if name == "app" else bare
                first = http_first_piece(client, question, FIRST_PIECE_TOKENS)
                timeline = client_timeline(client, question, length)
                if timeline.texts[-1] != recorded.texts[-1]:
                    raise AssertionError(
                        f"{name} answered {timeline.texts[-1][:80]!r}..., the model {recorded.texts[-1][:80]!r}..."
                    )
                if name == "app":
                    seen["app_extra"].append(first - mine.first)
                    seen["app_over_own"].append(timeline.token_rate(recorded) / mine.token_rate(recorded))
                else:
                    seen["bare_extra"].append(first - recorded.first)
                    seen["bare_rate_ratio"].append(timeline.token_rate(recorded) / recorded.token_rate(recorded))
    return seen
