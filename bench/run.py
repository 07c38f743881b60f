"""python -m bench.run [--quick | --smoke] [--only NAME ...] [--write]: what we promise users, measured on the CPU.

Every figure compares two things measured side by side in one run (interleaved repeats, medians), never an
absolute time (but bench/structured.py's compile and mask times, which the structured issue asks for as such).
Prints the table; with --write (or --out DIR) also writes results.json (a flat object of named figures; --only
merges into it) and RESULTS.md (the table, with date, machine and versions; its notes written by hand, from
NOTES_HEADING on, kept): --write into bench/, the tracked files, which nothing else touches. The tables of the README
(the main figures) and docs/benchmarks.md (all) are edited by hand from RESULTS.md when figures change.
--quick (the default) is the real measurement, 4.5-5.5 minutes on 2 cores; --smoke runs the tiniest settings so a
test can prove the suite still works (its figures mean nothing). `python bench/run.py` runs it too.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # `python bench/run.py`: run as `python -m bench.run` runs it
    import runpy

    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the checkout, where bench/ is, not bench/ itself
    runpy.run_module("bench.run", run_name="__main__", alter_sys=True)
    sys.exit()

from bench.report import read_results_md, results_md, table
from bench.settings import QUICK, SMOKE, Settings

BENCH = Path(__file__).resolve().parent


# name: (its module in bench/, whether its run(settings, demo) takes the demo model), in the order they run
BENCHMARKS = {
    "stream": ("stream", True),
    "quant": ("quant", False),
    "ui": ("ui_overhead", False),
    "cache": ("cache", False),
    "load": ("load", False),
    "api": ("api_vs_serve", False),
    "batching": ("batching", False),
    "remote": ("remote", False),
    "reasoning": ("reasoning", False),
    "front": ("front", False),
    "structured": ("structured", False),
    "models": ("switching", False),
    "tools": ("tools", False),
    "documents": ("documents", True),
    "web": ("web", True),
    "history": ("history", True),
    "adapters": ("adapters", False),
    "speculative": ("speculative", True),
    "cpu": ("cpu", False),
    "gguf": ("gguf", False),
    "voice": ("voice", True),
}


def measure(names: list[str], settings: Settings) -> dict[str, float]:
    from local_chat.defaults import DEMO_MODEL
    from local_chat.model.meta import MetaModel

    demo = None  # loaded once, by the first benchmark that takes it
    results = {}
    for name in names:
        started = time.perf_counter()
        module, takes_demo = BENCHMARKS[name]
        run = importlib.import_module(f"bench.{module}").run
        if takes_demo:
            demo = demo or MetaModel.from_pretrained(str(DEMO_MODEL))
            results.update(run(settings, demo))
        else:
            results.update(run(settings))
        print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the real measurement (the default), a few minutes")
    mode.add_argument("--smoke", action="store_true", help="the tiniest settings, to test that the suite runs")
    p.add_argument(
        "--only", nargs="+", choices=list(BENCHMARKS), default=None, help="run these and merge into results.json"
    )
    p.add_argument("--write", action="store_true", help="write the figures into bench/results.json and RESULTS.md")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write results.json and RESULTS.md there instead (--smoke: bench/smoke/, ignored by git)",
    )
    args = p.parse_args(argv)
    out = args.out or (BENCH / "smoke" if args.smoke else BENCH if args.write else None)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    names = list(args.only or BENCHMARKS)
    results = measure(names, SMOKE if args.smoke else QUICK)
    if out is None:
        print(table(results) + "\n(not written: add --write to put these figures into bench/RESULTS.md)")
        return
    results_file = out / "results.json"
    if args.only and results_file.exists():
        results = {**json.loads(results_file.read_text()), **results}
    results_file.write_text(json.dumps(results, indent=2) + "\n")
    gpu_file = BENCH / "gpu_results.json"
    gpu = json.loads(gpu_file.read_text()) if gpu_file.exists() else None
    (out / "RESULTS.md").write_text(
        results_md(results, "smoke" if args.smoke else "quick", gpu) + read_results_md(out / "RESULTS.md")[1]
    )
    print(table(results))


if __name__ == "__main__":
    main()
