"""The figures as tables: printed, and written into RESULTS.md (the CPU part, the GPU section, the notes kept)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from bench.figures import FIGURES

NOTES_HEADING = "## Notes and history"  # RESULTS.md from here on is written by hand


def met(name: str, value: float) -> str:
    goal = FIGURES[name][1]
    if goal is None:
        return ""
    op, target = goal
    ok = value >= target if op == ">=" else value <= target
    return f"{op} {target:g} {'yes' if ok else 'NO'}"


def table(results: dict[str, float]) -> str:
    rows = ["| figure | value | goal, met | what it measures |", "| --- | --- | --- | --- |"]
    for name, (what, _) in FIGURES.items():
        if name in results:
            value = f"{results[name]:,.0f}" if abs(results[name]) >= 100 else f"{results[name]:.3f}"
            rows.append(f"| `{name}` | {value} | {met(name, results[name])} | {what} |")
    return "\n".join(rows)


def machine() -> str:
    import gradio
    import torch
    import transformers

    try:
        import bitsandbytes

        bnb = bitsandbytes.__version__
    except Exception:
        bnb = "not installed"
    return (
        f"{platform.machine()} CPU, {os.cpu_count()} cores, {platform.system()}; Python {platform.python_version()}, "
        f"torch {torch.__version__}, transformers {transformers.__version__}, gradio {gradio.__version__}, "
        f"bitsandbytes {bnb}"
    )


GPU_HEADING = "## GPU (bench/gpu.py)"


def read_results_md(results_md_file: Path) -> tuple[str, str]:
    """A RESULTS.md as (the written figures, the hand-written notes from NOTES_HEADING on, kept when the figures are
    written again); both empty where there is none."""
    text = results_md_file.read_text() if results_md_file.exists() else ""
    figures, heading, notes = text.partition(NOTES_HEADING)
    return figures, "\n" + heading + notes if heading else ""


def results_md(results: dict[str, float], mode: str, gpu: dict | None) -> str:
    lines = [
        "# Benchmark results",
        "",
        "Written by `python -m bench.run` (CPU) and `python -m bench.gpu` (GPU); each figure is a ratio of two things",
        "measured side by side in one run (interleaved repeats, medians).",
        "",
        f"CPU run ({mode}), {time.strftime('%Y-%m-%d')}: {machine()}.",
        "",
        table(results),
        "",
    ]
    return "\n".join(lines) + "\n" + gpu_section(gpu)


def gpu_section(gpu: dict | None) -> str:
    lines = [GPU_HEADING, ""]
    if gpu:
        lines += [f"{gpu['device']}, {gpu['date']}: {gpu['setup']}.", ""]
        lines += [f"- {part}: {when}" for part, when in gpu.get("measured", {}).items()]
        lines += ["", "| figure | value |", "| --- | --- |"]
        lines += [
            f"| `{k}` | {v:,.1f} |" if v >= 10 else f"| `{k}` | {v:.3f} |"
            for k, v in gpu.items()
            if isinstance(v, (int, float))
        ]
        lines += [
            "",
            "Goals: `stream_over_generate` >= 1 (ours at least as fast as bare generate); the plain launch "
            "(`gpu_stream_tok_s`, CUDA graphs) `gpu_stream_over_limit` >= 0.6 with `gpu_default_first_answer_s` "
            "<= 30; `compile_over_limit` >= 0.7; `gpu_quant4_tok_s` >= 1.5x and `gpu_quant8_tok_s` >= 1x "
            "`gpu_stream_tok_s`; a first answer about as fast as later ones; `gpu_batching_crowd_over_alone` >= 6 "
            "(8 answers at once over one alone).",
        ]
        if "compile_cudagraphs" in gpu:
            lines += ["", f"CUDA graphs under `--compile`: {gpu['compile_cudagraphs']}."]
    else:
        lines.append("Not measured yet: no GPU machine was lent to the sessions so far.")
    return "\n".join(lines) + "\n"


def write_gpu_section(results_md_file: Path, gpu: dict) -> None:
    """Replace the GPU section of an existing RESULTS.md (the CPU part keeps its own date and machine)."""
    figures, notes = read_results_md(results_md_file)
    head = figures.split(GPU_HEADING)[0] or "# Benchmark results\n\n"
    results_md_file.write_text(head + gpu_section(gpu) + notes)
