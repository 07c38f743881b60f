"""python -m bench.gpu [--smoke] [--only PART ...]: decode speed on a GPU against the memory-bandwidth limit.

First, the built-in demo model in the GPU's dtype, loaded as `demos/generate.py` loads it: the decode rate of its
first answer (every sequence length new to the process) and of later ones. Then a Llama-2-7B-shaped random model
in bf16, batch 1, a 128-token prompt, 256 new tokens (EOS ignored): how long the plain launch's first answer takes
from the weights being on the GPU (its CUDA graph recorded on the way); decode tokens/s of bare `model.generate`,
of our `stream_generate` in the plain launch (CUDA graphs) and without CUDA graphs (`--no_cuda_graphs`), and, unless
--no_compile, with `--compile` (static KV cache + torch.compile), against the limit: the bytes read per decode step
(every weight but the embedding table) over the device-to-device copy bandwidth measured here; also the token loop
with no token read back (the device's own pace), whether `--compile` ran as CUDA graphs (inductor's skip reasons),
and how long its first answer took, compiling included. `probe` measures two variants of the graphs' step (fused
RMSNorm, cuDNN attention) that the app does not use. Then the 7B model saved to disk and loaded back with
`--quant 4` and `--quant 8`, as a user's checkpoint would be, with and without CUDA graphs, next to torchao's
weight-only int4 and int8 on the same weights where torchao is installed: decode tokens/s and the weights' bytes
(skip with --no_quant). Then 8 greedy answers at once with continuous batching, each on a thread of its own as the
app's clients are served: total tokens/s over one answer alone, over transformers' own continuous batching
(`generate_batch`), and how many of the 8 answers have the tokens each has alone (bf16 batched kernels may differ).
`models` runs bench/switching.py on the GPU: --models_dir's switch, and the GPU memory an unloaded model gives back.
`profile`: where a decode step's time goes (bench/gpu_profile.py, torch.profiler).
Writes bench/gpu_results.json (after each part) and refreshes bench/RESULTS.md; `--only PART ...` (demo, models,
decode, profile, quant, batching, probe) runs some parts and merges them into gpu_results.json, which records when,
where and with which versions each part was measured. --smoke runs a tiny shape on the CPU (its figures mean nothing)
to prove the script works. `python bench/gpu.py` runs it too. bench/gpu_check.sh is the one prepared run of a lent
GPU machine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # `python bench/gpu.py`: run as `python -m bench.gpu` runs it
    import runpy

    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the checkout, where bench/ is, not bench/ itself
    runpy.run_module("bench.gpu", run_name="__main__", alter_sys=True)
    sys.exit()

import torch
import transformers

from bench.gpu_batching import batching_figures
from bench.gpu_decode import decode_figures, demo_model_rates, step_variants
from bench.gpu_profile import profile_figures
from bench.gpu_quant import quantized
from bench.gpu_timing import prompt_of
from bench.models import SHAPES, random_meta_model
from bench.report import write_gpu_section

BENCH = Path(__file__).resolve().parent


PARTS = ("demo", "models", "decode", "profile", "quant", "batching", "probe")


def save(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_gpu_section(out / "RESULTS.md", results)
    print(json.dumps(results, indent=2), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU, to test that the script runs")
    p.add_argument("--out", type=Path, default=None, help="where gpu_results.json goes (default: bench/)")
    p.add_argument(
        "--only",
        nargs="+",
        choices=PARTS,
        default=None,
        help="run these parts (demo: the demo model; decode: the 7B's decode speed; profile: where a decode step's "
        "time goes (torch.profiler); quant: --quant 4/8; "
        "batching: 8 answers at once with continuous batching; probe: where the CUDA graphs' step loses time; "
        "models: --models_dir's switch and the GPU memory an unloaded model gives back) "
        "and merge them into gpu_results.json",
    )
    p.add_argument("--no_quant", action="store_true", help="skip the --quant 4 / --quant 8 figures")
    p.add_argument(
        "--no_compile",
        action="store_true",
        help="leave --compile out of the decode part (its first answer alone takes minutes); its last figures stay",
    )
    args = p.parse_args(argv)
    if args.smoke:
        device, dtype, shape, prompt_tokens, new_tokens, repeats = "cpu", torch.float32, "tiny", 16, 8, 1
    else:
        if not torch.cuda.is_available():
            raise SystemExit("error: bench/gpu.py needs a CUDA GPU; use --smoke to try it on the CPU.")
        device, dtype, shape, prompt_tokens, new_tokens, repeats = "cuda", torch.bfloat16, "7b", 128, 256, 3
    parts = [part for part in args.only or PARTS if not (args.no_quant and part == "quant")]
    out = args.out or (BENCH / "smoke" if args.smoke else BENCH)
    results_file = out / "gpu_results.json"
    results = json.loads(results_file.read_text()) if args.only and results_file.exists() else {}
    today = time.strftime("%Y-%m-%d")
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (smoke)"
    versions = f"on {name}, torch {torch.__version__}, transformers {transformers.__version__}"
    if args.only and results.get("device") and name not in results["device"]:
        results["device"] = f"{results['device']}; {name} ({', '.join(parts)})"  # each part's is in "measured"
    else:
        results["device"] = results.get("device") or name
    results["date"] = today if not args.only else f"{results.get('date', today).split(' to ')[0]} to {today}"
    results.setdefault(
        "setup",
        f"{shape} random Llama, {str(dtype).removeprefix('torch.')}, batch 1, "
        f"{prompt_tokens}-token prompt, {new_tokens} new tokens",
    )
    results.setdefault("measured", {})
    if "demo" in parts:  # first: no other model has run in this process yet
        results.update(demo_model_rates(device, dtype))
        results["measured"]["demo"] = f"{today}, {versions}"
        save(results, out)
    if "models" in parts and not args.smoke:  # before this process holds a model (on the CPU: bench/run.py's)
        from bench import switching
        from bench.settings import QUICK

        results.update(switching.run_on_gpu(QUICK))
        results["measured"]["models"] = f"{today}, {versions}; the demo model and a 0.5b random Llama, bf16"
        save(results, out)
    if {"decode", "profile", "quant", "batching", "probe"} & set(parts):
        max_seq_len = prompt_tokens + new_tokens + 16
        model = random_meta_model(SHAPES[shape], device=device, dtype=dtype, max_seq_len=max_seq_len)
        prompt = prompt_of(model, prompt_tokens)
    if "decode" in parts:
        figures, limit = decode_figures(
            model, prompt, new_tokens, repeats, 16 if args.smoke else 2048, with_compile=not args.no_compile
        )
        results.update(figures)
        results["measured"]["decode"] = f"{today}, {versions}; {limit}"
        save(results, out)
    if "profile" in parts:
        profiled = min(new_tokens, 64)
        results.update(profile_figures(model, prompt, profiled, out))
        results["measured"]["profile"] = f"{today}, {versions}; {profiled} tokens, the table in gpu_profile.txt"
        save(results, out)
    if "batching" in parts:
        results.update(batching_figures(model, prompt, new_tokens, 2 if args.smoke else 8, repeats))
        results["measured"]["batching"] = f"{today}, {versions}; 8 clients, each a thread of the model's process"
        save(results, out)
    if "probe" in parts:
        results.update(step_variants(model, prompt, new_tokens, repeats))
        results["measured"]["probe"] = f"{today}, {versions}"
        save(results, out)
    if "quant" in parts:
        results.update(quantized(model, prompt, new_tokens, repeats))
        results["measured"]["quant"] = f"{today}, {versions}, bitsandbytes {importlib.metadata.version('bitsandbytes')}"
        save(results, out)


if __name__ == "__main__":
    main()
