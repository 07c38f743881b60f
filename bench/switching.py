"""--models_dir's model switching (engine/models.py), as the app runs it: each model in a process of its own, started
by the launcher's `start_model`, a `ModelEngine` per model as the page and /v1 hold one.

- `models_switch_cold_s`: from asking the demo model (not loaded: another one is) to its answer's first text, which
  includes unloading the other and loading the demo model in a fresh process (absolute, this machine).
- `models_ttft_after_switch_ms_more`: two models loaded (--max_loaded_models 2); the time to first text of an answer
  from one right after an answer from the other, minus the same answer right after one from the same model.
- `models_memory_after_unload_ratio`: the memory (RSS) of this process and its children once the models are
  unloaded, over before any loaded.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import psutil

from bench.timing import interleaved_values
from local_chat.defaults import DEMO_MODEL
from local_chat.engine import Delta, Request, Sampling
from local_chat.engine.models import ModelEngine, Models
from local_chat.launchers.flags import parser
from local_chat.launchers.model_processes import start_model

QUESTION = "What is the capital of France?"


def first_text_s(engine: ModelEngine, tokens: int) -> float:
    """Seconds from asking `engine` to its answer's first text (the answer then read to its end)."""
    request = Request(prompt=QUESTION, sampling=Sampling(max_new_tokens=tokens, temperature=0.0))
    started, first = time.perf_counter(), None
    for event in engine.stream(request):
        if first is None and isinstance(event, Delta) and event.text:
            first = time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


def memory() -> int:
    """Bytes resident in this process and all its children."""
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)] if p.is_running())


def house(folders: dict[str, Path]) -> Models:
    args = parser("bench").parse_args(["--device", "cpu"])
    return Models(
        [(model_id, None) for model_id in folders],
        start=lambda model_id: start_model(args, str(folders[model_id]), model_id),
        max_loaded=1,
    )


def run(settings) -> dict[str, float]:
    from bench.models import SHAPES, save_random_llama

    tokens = settings.models_tokens
    with tempfile.TemporaryDirectory() as work:
        folders = {"demo": DEMO_MODEL, "other": save_random_llama(SHAPES["tiny"], Path(work) / "other")}
        before = memory()
        models = house(folders)
        engines = {model_id: ModelEngine(models, model_id) for model_id in folders}
        try:
            first_text_s(engines["other"], tokens)  # loaded, answering
            cold = first_text_s(engines["demo"], tokens)  # the other unloaded to make room, the demo model loaded
            models.max_loaded = 2
            first_text_s(engines["other"], tokens)  # both loaded from now on

            def switched() -> float:
                first_text_s(engines["other"], tokens)
                return first_text_s(engines["demo"], tokens)

            def same() -> float:
                first_text_s(engines["demo"], tokens)
                return first_text_s(engines["demo"], tokens)

            times = interleaved_values({"switched": switched, "same": same}, settings.models_repeats, settings.warmups)
        finally:
            models.close()  # every model unloaded
        after = memory()
    return {
        "models_switch_cold_s": cold,
        "models_ttft_after_switch_ms_more": 1000
        * (statistics.median(times["switched"]) - statistics.median(times["same"])),
        "models_memory_after_unload_ratio": after / before,
    }
