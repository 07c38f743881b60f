"""Where --compile's decode step spends its time on a GPU: a torch.profiler trace of the token loop.

python experiments/compile_profile/trace_steps.py [--smoke] [--out DIR] [--no_tuning] [--no_trace]
Prints, for `gpu_compile_forward_tok_s`'s loop (no token read back) and `gpu_compile_tok_s`'s (stream_generate):
wall ms per step, GPU kernel ms per step (the sum of the kernels' durations), so the device's idle share, and the
top host-side ops. Writes the two tables to DIR/profile.txt.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import CompileConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu import compiled_forward_rate, prompt_of, stream_decode_rate, synchronize  # noqa: E402
from bench.models import SHAPES, eos_ignored, random_meta_model  # noqa: E402
from model import MetaModel  # noqa: E402


def kernel_ms(prof) -> float:
    """Sum of device kernel durations in the trace (ms)."""
    return sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA") / 1e3


def traced(name: str, run, steps: int, device: torch.device, lines: list[str]) -> None:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        rate = run()
        synchronize(device)
        wall = (time.perf_counter() - started) * 1e3
    gpu = kernel_ms(prof)
    lines.append(f"== {name}: {rate:.1f} tok/s reported; wall {wall / steps:.2f} ms/step, "
                 f"kernels {gpu / steps:.2f} ms/step (device busy {gpu / wall:.0%})")
    lines.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--no_tuning", action="store_true",
                   help="compile the forward without inductor's coordinate descent tuning, as --compile did before "
                        "2026-11-25 (transformers' default mode, reduce-overhead)")
    p.add_argument("--no_trace", action="store_true", help="only the untraced rates")
    args = p.parse_args()
    device, dtype, shape, prompt_tokens, steps = ("cpu", torch.float32, "tiny", 16, 8) if args.smoke else \
        ("cuda", torch.bfloat16, "7b", 128, 256)
    max_seq_len = prompt_tokens + steps + 16
    model = random_meta_model(SHAPES[shape], device=device, dtype=dtype, max_seq_len=max_seq_len)
    compiled = MetaModel(model.llma, model.tokenizer, max_seq_len=max_seq_len, compile=True)
    if args.no_tuning:
        compiled.compiled.forward = model.llma.get_compiled_call(CompileConfig(dynamic=True))
    prompt = prompt_of(model, prompt_tokens)
    lines: list[str] = []
    started = time.perf_counter()
    with eos_ignored(model):
        stream_decode_rate(compiled, prompt, steps)
        first = time.perf_counter() - started
        lines.append(f"first compiled answer ({steps} tokens, compiling included): {first:.1f} s")
        for _ in range(2):  # build and record the graphs
            compiled_forward_rate(compiled, prompt, steps), stream_decode_rate(compiled, prompt, steps)
        untraced = [compiled_forward_rate(compiled, prompt, steps), stream_decode_rate(compiled, prompt, steps)]
        lines.append(f"untraced: forward loop {untraced[0]:.1f} tok/s, stream_generate {untraced[1]:.1f} tok/s "
                     f"(coordinate descent tuning {'off' if args.no_tuning else 'on'}; compiled and "
                     f"measured in {time.perf_counter() - started:.0f} s)")
        if not args.no_trace:
            traced("forward loop (no read back)", lambda: compiled_forward_rate(compiled, prompt, steps), steps,
                   model.device, lines)
            traced("stream_generate --compile", lambda: stream_decode_rate(compiled, prompt, steps), steps,
                   model.device, lines)
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
