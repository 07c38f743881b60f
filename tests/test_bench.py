"""The benchmark scripts keep working: their smallest settings run and write every figure (never a timing check)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.figures import expected_figures
from bench.settings import SMOKE
from local_chat.defaults import DEMO_MODEL

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")


def run_script(*args: str) -> None:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_bench_run_smoke_writes_every_figure(tmp_path):
    (tmp_path / "RESULTS.md").write_text("# old figures\n\n## Notes and history\n\nWritten by hand.\n")
    run_script("-m", "bench.run", "--smoke", "--out", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) == expected_figures(SMOKE)
    assert all(isinstance(v, float) and math.isfinite(v) for v in results.values())
    report = (tmp_path / "RESULTS.md").read_text()
    assert all(f"`{name}`" in report for name in results) and "## GPU" in report
    assert "# old figures" not in report and report.endswith("## Notes and history\n\nWritten by hand.\n")

    from bench.run import main

    main(["--smoke", "--only", "reasoning", "--out", str(tmp_path)])  # --only merges (in this process: quicker)
    assert set(json.loads((tmp_path / "results.json").read_text())) == expected_figures(SMOKE)


@pytest.mark.parametrize("script", ["bench/run.py", "bench/gpu.py"])
def test_the_benchmarks_old_commands_still_run(script):
    """`python bench/run.py` and `python bench/gpu.py` (the README's commands before `python -m bench.run`)."""
    done = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--only" in done.stdout, done.stderr[-3000:]


def test_gpu_bench_smoke_on_the_cpu(tmp_path):
    from bench.gpu import main  # in this process (bench.run's smoke runs in a Python of its own): no Python to start

    main(["--smoke", "--no_quant", "--out", str(tmp_path)])
    assert "gpu_quant4_tok_s" not in json.loads((tmp_path / "gpu_results.json").read_text())
    main(["--smoke", "--only", "quant", "--out", str(tmp_path)])  # --only merges
    results = json.loads((tmp_path / "gpu_results.json").read_text())
    # every part but models (bench/run.py's)
    assert set(results["measured"]) == {"demo", "decode", "profile", "quant", "batching", "probe"}
    for name in (
        "gpu_generate_tok_s",
        "gpu_stream_tok_s",
        "gpu_eager_tok_s",
        "gpu_default_first_answer_s",
        "gpu_compile_tok_s",
        "gpu_compile_forward_tok_s",
        "gpu_compile_first_answer_s",
        "gpu_limit_tok_s",
        "demo_first_answer_tok_s",
        "demo_later_answers_tok_s",
        "gpu_quant4_tok_s",
        "gpu_quant4_eager_tok_s",
        "gpu_probe_fused_norm_tok_s",
        "gpu_quant8_tok_s",
        "gpu_batching_crowd_tok_s",
        "gpu_transformers_cb_tok_s",
        "gpu_profile_ms_per_token",
    ):
        assert results[name] > 0
    assert results["compile_cudagraphs"] == "none on the CPU"
    assert "gpu_compile_tok_s" in (tmp_path / "RESULTS.md").read_text()
    assert "aten::" in (tmp_path / "gpu_profile.txt").read_text()  # the profiler's table of the decode step


def test_gpu_bench_reports_why_cuda_graphs_were_skipped():
    """The reason inductor logs when `--compile` runs without CUDA graphs lands in gpu_results.json."""
    import torch
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    from bench.gpu_timing import CudagraphSkips

    with CudagraphSkips() as skips:
        assert skips.verdict(torch.device("cuda")) == "used (no skip logged)"
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs")
    log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to another model")  # after the block: not collected
    assert skips.verdict(torch.device("cuda")) == "skipping cudagraphs due to mutated inputs"
