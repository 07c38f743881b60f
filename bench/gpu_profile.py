"""bench/gpu.py's part `profile`: where a decode step of the plain launch spends its time (the GPU issue's first
question). One answer is run under torch.profiler after a warm-up one: the wall time per token, the device's busy
time per token (every kernel's own time, summed) and the share of the wall it fills (the rest: the device waiting on
the host, between steps or between graphs), kernels per token, and the host's time per token in each top-level
operation. The profiler's table (by device time, else host time) and a Chrome trace go into the output folder."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.gpu_timing import stream_decode_rate, synchronize
from bench.models import eos_ignored
from local_chat.model.meta import MetaModel


def profile_figures(model: MetaModel, prompt: str, new_tokens: int, out: Path) -> dict:
    """The figures of one profiled answer of `new_tokens` tokens; gpu_profile.txt and gpu_profile_trace.json in
    `out`."""
    cuda = model.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with eos_ignored(model):
        stream_decode_rate(model, prompt, new_tokens)  # its CUDA graphs recorded, its shapes seen
        with profile(activities=activities) as profiled:
            synchronize(model.device)
            started = time.perf_counter()
            stream_decode_rate(model, prompt, new_tokens)
            synchronize(model.device)
            wall = time.perf_counter() - started
    averages = profiled.key_averages()
    kernels = [e for e in profiled.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    device_s = sum(e.self_device_time_total for e in averages) / 1e6
    out.mkdir(parents=True, exist_ok=True)
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    (out / "gpu_profile.txt").write_text(averages.table(sort_by=sort, row_limit=40, max_name_column_width=80) + "\n")
    profiled.export_chrome_trace(str(out / "gpu_profile_trace.json"))
    return {
        "gpu_profile_ms_per_token": 1000 * wall / new_tokens,
        "gpu_profile_device_ms_per_token": 1000 * device_s / new_tokens,
        "gpu_profile_device_busy_share": device_s / wall,
        "gpu_profile_kernels_per_token": len(kernels) / new_tokens,
    }
