"""--models_dir's model switching (engine/choices/folders.py), as the app runs it: each model in a process of its own,
started by the launcher's `start_model`, a `ModelEngine` per model as the page and /v1 hold one.

- `models_switch_cold_s`: from asking the demo model (not loaded: another one is) to its answer's first text, which
  includes unloading the other and loading the demo model in a fresh process (absolute, this machine).
- `models_ttft_after_switch_ms_more`: two models loaded (--max_loaded_models 2); the time to first text of an answer
  from one right after an answer from the other, minus the same answer right after one from the same model.
- `models_memory_after_unload_ratio`: the memory (RSS) of this process and its children once the models are
  unloaded, over before any loaded.

On a GPU (bench/gpu.py's part "models", `run_on_gpu`): the same in bf16 on CUDA with a 0.5B random Llama as the
other model, and the GPU's memory in use (all processes) in place of RSS: `gpu_models_*`.
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
from local_chat.engine.choices.chosen import ModelEngine
from local_chat.engine.choices.folders import Models
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


def gpu_memory() -> int:
    """Bytes in use on the GPU, by every process (this one's CUDA context included)."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return total - free


def house(folders: dict[str, Path], flags=("--device", "cpu")) -> Models:
    args = parser("bench").parse_args(list(flags))
    return Models(
        [(model_id, None) for model_id in folders],
        start=lambda model_id: start_model(args, str(folders[model_id]), model_id),
        max_loaded=1,
    )


def run(
    settings, flags=("--device", "cpu"), other="tiny", in_use=memory, prefix="models", loaded_figure=False
) -> dict[str, float]:
    """The figures, with the models loaded by `flags`, the other model of shape `other`, the memory in use measured
    by `in_use`, and the names starting with `prefix` (`loaded_figure`: also the memory both models held)."""
    from bench.models import SHAPES, save_random_llama

    tokens = settings.models_tokens
    with tempfile.TemporaryDirectory() as work:
        folders = {"demo": DEMO_MODEL, "other": save_random_llama(SHAPES[other], Path(work) / "other")}
        before = in_use()
        models = house(folders, flags)
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
            loaded = in_use()
        finally:
            models.close()  # every model unloaded
        after = in_use()
    figures = {
        f"{prefix}_switch_cold_s": cold,
        f"{prefix}_ttft_after_switch_ms_more": 1000
        * (statistics.median(times["switched"]) - statistics.median(times["same"])),
        f"{prefix}_memory_after_unload_ratio": after / before,
    }
    if loaded_figure:
        figures[f"{prefix}_memory_loaded_gb"] = (loaded - before) / 2**30
    return figures


def run_on_gpu(settings) -> dict[str, float]:
    """`run` on CUDA in bf16, the other model a 0.5B random Llama, the GPU's memory in use measured."""
    gpu_memory()  # this process's CUDA context first: in the figures before and after alike
    return run(settings, ("--device", "cuda", "--dtype", "bf16"), "0.5b", gpu_memory, "gpu_models", loaded_figure=True)
