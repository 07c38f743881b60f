"""bench/gpu.py's measuring: a device's copy bandwidth, decode rates (bare generate, our stream, the token loop
with nothing read back) and interleaved repeats of several rates."""

from __future__ import annotations

import logging
import statistics
import time

import torch

from bench.stream import bare_generate_ids
from local_chat.engine import Sampling
from local_chat.model.generation import generate_tokens
from local_chat.model.meta import MetaModel
from local_chat.model.token_choice import TokenChoice


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, megabytes: int) -> float:
    """Bytes/s of a device-to-device copy (each byte read once and written once), the best of 5."""
    source = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(6):
        synchronize(device)
        started = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * source.numel() / best


def prompt_of(model: MetaModel, tokens: int) -> str:
    """A prompt of about `tokens` tokens."""
    text = " ".join(f"word{i}" for i in range(tokens))
    ids = model.tokenizer.encode(text, bos=False)[: tokens - 1]
    return model.tokenizer.decode(ids)


def generate_seconds(model: MetaModel, prompt: str, new_tokens: int) -> float:
    synchronize(model.device)
    started = time.perf_counter()
    bare_generate_ids(model, prompt, new_tokens)
    synchronize(model.device)
    return time.perf_counter() - started


def bare_decode_rate(model: MetaModel, prompt: str, new_tokens: int) -> float:
    """Decode tokens/s of model.generate: the time of N tokens minus the time of 1 (prefill and first token)."""
    return (new_tokens - 1) / (generate_seconds(model, prompt, new_tokens) - generate_seconds(model, prompt, 1))


def stream_decode_rate(model: MetaModel, prompt: str, new_tokens: int) -> float:
    last = list(model.stream_generate(prompt, max_gen_len=new_tokens))[-1]
    assert last["completion_tokens"] == new_tokens
    return last["decode_tokens_per_second"]


def forward_rate(model: MetaModel, prompt: str, new_tokens: int) -> float:
    """Decode tokens/s of the token loop over `model`'s static cache (`--compile`'s, or the CUDA graphs') when no
    token is read back (greedy, no stop checks, no text): the device's own pace. Next to the streamed rate it shows
    what reading each token back and streaming it costs."""
    steps, started = 0, 0.0

    def decide(tokens) -> bool:  # never looks at the tokens, so nothing waits for the device
        nonlocal steps, started
        steps += 1
        if steps == 1:  # the prefill and the first decode step (queued ahead) done: time the rest
            synchronize(model.device)
            started = time.perf_counter()
        return steps == new_tokens

    inputs = model.engine.encoder.prepare_inputs([prompt])
    for _ in generate_tokens(
        model.llma,
        inputs,
        TokenChoice(Sampling(temperature=0.0), inputs.input_ids, decide),
        static=model.engine.static,
        max_new_tokens=new_tokens,
    ):
        pass
    synchronize(model.device)
    return (new_tokens - 1) / (time.perf_counter() - started)


class CudagraphSkips(logging.Handler):
    """Collects inductor's "skipping cudagraphs due to ..." warnings: why `--compile` ran without CUDA graphs."""

    def __init__(self):
        from torch._inductor.cudagraph_utils import cudagraphs_log

        super().__init__()
        self.reasons: list[str] = []
        self.log = cudagraphs_log

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() not in self.reasons:
            self.reasons.append(record.getMessage())

    def __enter__(self) -> CudagraphSkips:
        self.log.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self.log.removeHandler(self)

    def verdict(self, device: torch.device) -> str:
        if device.type != "cuda":
            return "none on the CPU"
        return "; ".join(self.reasons) if self.reasons else "used (no skip logged)"


def measure(runs: dict, repeats: int, device: torch.device) -> dict:
    """The median of `repeats` interleaved runs of each rate in `runs`, after one warm-up each (two for
    `--compile`'s, whose first run compiles and whose second records its graph); and how long `--compile`'s first
    answer took, compiling included."""
    results = {}
    with CudagraphSkips() as skips:
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            if name == "gpu_compile_tok_s":  # what compiling adds to a user's first answer
                results["gpu_compile_first_answer_s"] = time.perf_counter() - started
                run()
        rates = {name: [] for name in runs}
        for _ in range(repeats):  # interleaved
            for name, run in runs.items():
                rates[name].append(run())
    results.update({name: statistics.median(values) for name, values in rates.items()})
    if "gpu_compile_tok_s" in runs:
        results["compile_cudagraphs"] = skips.verdict(device)
    return results


def free_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
