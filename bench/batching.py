"""Many clients at once: continuous batching against the one-at-a-time path and against `transformers serve
--continuous-batching`, all through the official `openai` client.

For each shape (a random Llama folder of the demo model's size, and ~100M), three servers on the same folder, asked
in turns, in one run: the app as launched by default (`python app.py --pretrained_path DIR`: batching, 8 answers at
a time), the app with `--concurrency 1` (today's one-at-a-time path), and `transformers serve --continuous-batching`.
Each is asked by one client alone, then by 8 clients at once; every answer runs to `max_tokens` (greedy, a
tokenizer without EOS). Figures: total answer tokens/s of 8 clients over one client alone, ours over the
transformers server's at 8 clients, ours alone over the one-at-a-time app alone, and the time to first token of
the slowest tenth of the 8 clients' requests over a request's alone.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from local_chat.launchers.loading import free_port

from .api_vs_serve import has_serving, openai_servers, save_chat_llama, timed_answer

QUESTIONS = [f"Tell me about the number {n}." for n in range(64)]


def answer(client, model: str, tokens: int, question: str) -> tuple[float, int, float]:
    """(seconds to the first text, answer tokens, seconds in all) of one streamed chat answer."""
    first, _, count, total = timed_answer(client, model, tokens, question)
    return first, count, total


def crowd(client, model: str, clients: int, tokens: int) -> tuple[float, list[float]]:
    """(total answer tokens/s, each request's time to first text) of `clients` answers asked at once."""
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(lambda i: answer(client, model, tokens, QUESTIONS[i]), range(clients)))
    wall = time.perf_counter() - started
    return sum(count for _, count, _ in answers) / wall, [first for first, _, _ in answers]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def measure_shape(settings, shape: str, suffix: str) -> dict[str, float]:
    tokens, repeats, clients = settings.api_answer_tokens, settings.batching_repeats, settings.load_clients
    cb_blocks = ["--cb-num-blocks", str(settings.serve_cb_blocks)] if settings.serve_cb_blocks else []
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
        folder = str(save_chat_llama(shape, Path(tmp) / "model"))
        ports = {name: free_port() for name in ("ours", "alone_path", "theirs")}
        app = [sys.executable, "app.py", "--pretrained_path", folder, "--port"]
        serve = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", folder]
        servers = {
            "ours": ([*app, str(ports["ours"])], ports["ours"]),
            "alone_path": ([*app, str(ports["alone_path"]), "--concurrency", "1"], ports["alone_path"]),
            "theirs": (
                [*serve, "--port", str(ports["theirs"]), "--device", "cpu", "--continuous-batching", *cb_blocks],
                ports["theirs"],
            ),
        }
        names = {"ours": "x", "alone_path": "x", "theirs": folder}
        seen = {name: {"alone": [], "first": [], "crowd": [], "firsts": []} for name in servers}
        with openai_servers(servers) as connected:  # started together
            for name, client in connected.items() if settings.warmups else ():  # the transformers server's batching
                crowd(client, names[name], 2, 8)
            order = list(servers)
            for round_ in range(repeats):
                for name in order[round_ % 3 :] + order[: round_ % 3]:
                    client, figures = connected[name], seen[name]
                    first, count, wall = answer(client, names[name], tokens, QUESTIONS[round_])
                    figures["alone"].append(count / wall)
                    figures["first"].append(first)
                    if name != "alone_path":
                        rate, firsts = crowd(client, names[name], clients, tokens)
                        figures["crowd"].append(rate)
                        figures["firsts"] += firsts
    med = {name: {k: statistics.median(v) for k, v in f.items() if v} for name, f in seen.items()}
    return {
        f"batching_crowd_over_alone{suffix}": med["ours"]["crowd"] / med["ours"]["alone"],
        f"batching_over_serve_cb{suffix}": med["ours"]["crowd"] / med["theirs"]["crowd"],
        f"batching_alone_over_one_at_a_time{suffix}": med["ours"]["alone"] / med["alone_path"]["alone"],
        f"batching_wait_p90_over_alone{suffix}": percentile(seen["ours"]["firsts"], 0.9) / med["ours"]["first"],
        f"batching_crowd_tokens_per_s{suffix}": med["ours"]["crowd"],
        f"serve_cb_crowd_tokens_per_s{suffix}": med["theirs"]["crowd"],
        f"serve_cb_crowd_over_alone{suffix}": med["theirs"]["crowd"] / med["theirs"]["alone"],
        f"serve_cb_wait_p90_over_alone{suffix}": percentile(seen["theirs"]["firsts"], 0.9) / med["theirs"]["first"],
    }


# a family of each kind, as the tests' tiny random models of their real classes (fixtures/text_families.py)
FAMILY_KINDS = {
    "plain": "llama3_1",  # transformers' continuous batching
    "mla": "deepseek_v3_1",  # the step batch (model/step_batch.py) from here on
    "mamba": "granite4",
    "conv": "lfm2_moe",
    "linear": "qwen3_5",
}


def measure_families(settings) -> dict[str, float]:
    """Per family kind, in this process: 8 answers at once over one alone (total answer tokens/s), each answer
    running to its length (greedy, no end-of-answer token); for the plain kind also the step batch over
    transformers' continuous batching at 8 at once."""
    import local_chat.model.step_batch as step_batch
    from fixtures import text_families

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-batch-families-") as tmp:
        for kind, name in FAMILY_KINDS.items():
            folder = text_families.build(name, Path(tmp) / name)
            alone, crowded = _alone_and_crowd(folder, settings)
            results[f"batching_{kind}_crowd_over_alone"] = crowded / alone
            results[f"batching_{kind}_crowd_tokens_per_s"] = crowded
            if kind == "plain":
                paged = step_batch.why_not_paged
                step_batch.why_not_paged = lambda llma: "the benchmark asks for the step batch"
                try:
                    results["batching_plain_step_over_paged"] = _alone_and_crowd(folder, settings)[1] / crowded
                finally:
                    step_batch.why_not_paged = paged
    return results


def _alone_and_crowd(folder: Path, settings) -> tuple[float, float]:
    """(answer tokens/s of one answer alone, of `load_clients` answers at once), medians of interleaved repeats."""
    from local_chat.engine import Request, Sampling, collect
    from local_chat.model.meta import MetaModel

    model = MetaModel.from_pretrained(str(folder))
    model.engine.eos_ids = lambda stop_symbols=(): set()  # every answer runs to its length
    model.engine.start_batching(8)

    def tokens(question: str) -> int:
        request = Request(question, Sampling(settings.api_answer_tokens, temperature=0.0))
        return collect(model.engine.stream(request)).end.completion_tokens

    try:
        tokens("Hello")  # warm
        alone, crowded = [], []
        for round_ in range(settings.batching_repeats):
            started = time.perf_counter()
            alone.append(tokens(QUESTIONS[round_]) / (time.perf_counter() - started))
            started = time.perf_counter()
            with ThreadPoolExecutor(settings.load_clients) as pool:
                count = sum(pool.map(tokens, QUESTIONS[: settings.load_clients]))
            crowded.append(count / (time.perf_counter() - started))
    finally:
        model.engine.stop_batching()
    return statistics.median(alone), statistics.median(crowded)


def run(settings) -> dict[str, float]:
    results = measure_families(settings)
    if not has_serving():
        print("bench batching: transformers[serving] is not installed; skipping the servers", file=sys.stderr)
        return results
    from bench.figures import SECOND_SHAPE

    for shape, suffix in zip(settings.batching_shapes, ("", SECOND_SHAPE)):
        results.update(measure_shape(settings, shape, suffix))
    return results
