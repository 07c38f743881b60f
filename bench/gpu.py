"""python bench/gpu.py [--smoke] [--only PART ...]: decode speed on a GPU against the memory-bandwidth limit.

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
Writes bench/gpu_results.json (after each part) and refreshes bench/RESULTS.md; `--only PART ...` (demo, models,
decode, quant, batching, probe) runs some parts and merges them into gpu_results.json, which records when, where and
with which versions each part was measured. --smoke runs a tiny shape on the CPU (its figures mean nothing) to
prove the script works. bench/gpu_check.sh is the one prepared run of a lent GPU machine.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import logging
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script of the checkout: bench/ is not installed

import torch  # noqa: E402
import transformers  # noqa: E402

from bench.models import SHAPES, eos_ignored, random_meta_model  # noqa: E402
from bench.run import write_gpu_section  # noqa: E402
from bench.stream import bare_generate_ids  # noqa: E402
from local_chat.defaults import DEMO_MODEL  # noqa: E402
from local_chat.engine import End, Request, Sampling  # noqa: E402
from local_chat.model.footprint import weight_bytes  # noqa: E402
from local_chat.model.generation import generate_tokens  # noqa: E402
from local_chat.model.meta import MetaModel  # noqa: E402

BENCH = Path(__file__).resolve().parent


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

    for _ in generate_tokens(
        model.llma,
        model.engine.encoder.prepare_inputs([prompt]),
        Sampling(temperature=0.0),
        decide,
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


def demo_model_rates(device: str, dtype: torch.dtype, new_tokens: int = 64, later: int = 5) -> dict:
    """The demo model's decode tokens/s on its first answer in this process, and the median of the next ones.

    A first answer meets sequence lengths the process has not seen: any per-shape setup (cuDNN attention builds
    a plan per length) lands there, which is what a user's first answer feels."""
    model = MetaModel.from_pretrained(str(DEMO_MODEL), device=device, dtype=dtype)
    prompt = "### Instruction:\nTell me a long story.\n\n### Response:"
    with eos_ignored(model):
        first = stream_decode_rate(model, prompt, new_tokens)
        rates = [stream_decode_rate(model, prompt, new_tokens) for _ in range(later)]
    return {"demo_first_answer_tok_s": first, "demo_later_answers_tok_s": statistics.median(rates)}


def quantized(model: MetaModel, prompt: str, new_tokens: int, repeats: int) -> dict:
    """Decode tokens/s and weight bytes of `model` saved and loaded back in 4 and 8 bits (bitsandbytes), with the
    plain launch's CUDA graphs and without; then other 4- and 8-bit kernels on the same weights (torchao's
    weight-only int4 and int8, if installed), each with the CUDA graphs: the candidates for `--quant`'s compute path.
    8 bits decode 64 tokens a run, once: eagerly they decode about 10 a second."""
    results = {"gpu_weights_gb": weight_bytes(model.llma) / 1e9}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-quant-") as folder:
        model.llma.save_pretrained(folder)
        model.tokenizer.hf.save_pretrained(folder)
        for bits in (4, 8):
            loaded = MetaModel.from_pretrained(
                folder, quant=bits, device=model.device.type, max_seq_len=model.max_seq_len
            )
            results.update(
                _graphs_and_eager(
                    loaded,
                    f"gpu_quant{bits}",
                    prompt,
                    *((new_tokens, repeats) if bits == 4 else (min(64, new_tokens), 1)),
                )
            )
            results[f"gpu_quant{bits}_weights_gb"] = weight_bytes(loaded.llma) / 1e9
            del loaded
            _free_memory(model.device)
        for name, config in _torchao_configs().items():
            try:
                results.update(_torchao_rates(folder, model, name, config, prompt, new_tokens, repeats))
            except Exception as error:  # noqa: BLE001 (a candidate that fails is reported, not fatal)
                results[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            _free_memory(model.device)
    return results


def _graphs_and_eager(model: MetaModel, name: str, prompt: str, new_tokens: int, repeats: int) -> dict:
    eager = MetaModel(model.llma, model.tokenizer, max_seq_len=model.max_seq_len, cuda_graphs=False)
    runs = {f"{name}_tok_s": lambda: stream_decode_rate(model, prompt, new_tokens)}
    runs[f"{name}_eager_tok_s"] = lambda: stream_decode_rate(eager, prompt, new_tokens)
    with eos_ignored(model):
        results = measure(runs, repeats, model.device)
    if model.engine.graphs is not None:
        results[f"{name}_graphs"] = str(model.engine.graphs.forward.recorded())
    return results


def _torchao_configs() -> dict:
    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig
    except ImportError:
        return {}
    return {
        "gpu_torchao_int4": Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d"),
        "gpu_torchao_int8": Int8WeightOnlyConfig(),
    }


def _torchao_rates(folder, model: MetaModel, name: str, config, prompt: str, new_tokens: int, repeats: int) -> dict:
    """Decode tokens/s of the checkpoint in `folder` with torchao's `config` on every linear layer but the output
    layer (bitsandbytes leaves it too), and the GPU memory its weights take."""
    from torchao.quantization import quantize_

    before = torch.cuda.memory_allocated(model.device)
    loaded = MetaModel.from_pretrained(folder, device=model.device.type, max_seq_len=model.max_seq_len)
    quantize_(loaded.llma, config, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and "lm_head" not in fqn)
    _free_memory(model.device)
    results = {f"{name}_weights_gb": (torch.cuda.memory_allocated(model.device) - before) / 1e9}
    results.update(_graphs_and_eager(loaded, name, prompt, new_tokens, 1))
    return results


def step_variants(model: MetaModel, prompt: str, new_tokens: int, repeats: int) -> dict:
    """Where the CUDA graphs' decode step loses time against the bandwidth limit: the plain launch's rate next to
    the same with each RMSNorm as torch's one fused kernel (`F.rms_norm`) instead of transformers' seven, and with
    cuDNN attention allowed (one plan per cache length, made in the eager warm-up step). A probe: neither is used."""
    import functools

    def fused_rms_norm(norm, hidden):
        return torch.nn.functional.rms_norm(hidden, (hidden.shape[-1],), norm.weight, norm.variance_epsilon)

    norms = [m for m in model.llma.modules() if type(m).__name__ == "LlamaRMSNorm"]
    plain = MetaModel(model.llma, model.tokenizer, max_seq_len=model.max_seq_len)
    fused = MetaModel(model.llma, model.tokenizer, max_seq_len=model.max_seq_len)
    cudnn = MetaModel(model.llma, model.tokenizer, max_seq_len=model.max_seq_len)

    def with_fused_norms(run):
        for norm in norms:
            norm.forward = functools.partial(fused_rms_norm, norm)
        try:
            return run()
        finally:
            for norm in norms:
                del norm.forward

    def with_cudnn(run):
        torch.backends.cuda.enable_cudnn_sdp(True)
        try:
            return run()
        finally:
            torch.backends.cuda.enable_cudnn_sdp(False)

    runs = {
        "gpu_probe_plain_tok_s": lambda: stream_decode_rate(plain, prompt, new_tokens),
        "gpu_probe_fused_norm_tok_s": lambda: with_fused_norms(lambda: stream_decode_rate(fused, prompt, new_tokens)),
        "gpu_probe_cudnn_tok_s": lambda: with_cudnn(lambda: stream_decode_rate(cudnn, prompt, new_tokens)),
    }
    with eos_ignored(model):
        return measure(runs, repeats, model.device)


def _free_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def save(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_results.json").write_text(json.dumps(results, indent=2) + "\n")
    write_gpu_section(out / "RESULTS.md", results)
    print(json.dumps(results, indent=2), flush=True)


def answer_rate(model: MetaModel, prompt: str, new_tokens: int) -> tuple[float, float, list[int]]:
    """(seconds to the first token, tokens/s over the whole answer, its tokens) of one greedy answer."""
    request = Request(prompt, Sampling(new_tokens, temperature=0.0))
    started = time.perf_counter()
    first = None
    for event in model.engine.stream(request):
        first = first or time.perf_counter() - started
        if isinstance(event, End):
            assert event.completion_tokens == new_tokens, event
            return first, new_tokens / (time.perf_counter() - started), event.token_ids
    raise AssertionError("the stream ended without its End")


def crowd_rate(model: MetaModel, prompts: list[str], new_tokens: int) -> tuple[float, list[float], list[list[int]]]:
    """(total tokens/s, each one's time to first token, each one's tokens) of greedy answers to `prompts` asked at
    once, each on a thread of its own (as the model's process serves the app's clients)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda prompt: answer_rate(model, prompt, new_tokens), prompts))
    return len(prompts) * new_tokens / (time.perf_counter() - started), [a[0] for a in answers], [a[2] for a in answers]


def transformers_batch_rate(model: MetaModel, prompts: list[str], new_tokens: int) -> float:
    """Total tokens/s of transformers' own continuous batching (`generate_batch`, what `transformers serve
    --continuous-batching` runs) on the same prompts, with its default configuration."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    ids = [model.tokenizer.encode(prompt, bos=True, eos=False) for prompt in prompts]
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1)
    # its default cache takes a share of all memory: on the CPU (--smoke) a small one
    batching = ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=512) if model.device.type == "cpu" else None
    run = functools.partial(model.llma.generate_batch, generation_config=config, continuous_batching_config=batching)
    run(ids[:2])  # warm up
    synchronize(model.device)
    started = time.perf_counter()
    outputs = run(ids)
    synchronize(model.device)
    assert all(len(o.generated_tokens) == new_tokens for o in outputs.values())
    return len(prompts) * new_tokens / (time.perf_counter() - started)


def batching_figures(model: MetaModel, prompt: str, new_tokens: int, clients: int, repeats: int) -> dict:
    """Greedy answers of `clients` threads at once with continuous batching, against one alone, against one alone
    on the one-at-a-time path (batching off), and against transformers' own continuous batching."""
    prompts = [f"{prompt} {n}" for n in range(clients)]
    with eos_ignored(model):
        answer_rate(model, prompts[0], 8)  # warm up
        alone_path = [answer_rate(model, prompts[0], new_tokens) for _ in range(repeats)]
        batching = model.engine.start_batching(clients)
        crowd_rate(model, prompts[:2], 8)  # warm up the batch's shapes
        alone, crowds, firsts = [], [], []
        for _ in range(repeats):
            alone.append(answer_rate(model, prompts[0], new_tokens))
            rate, waits, tokens = crowd_rate(model, prompts, new_tokens)
            crowds.append(rate)
            firsts += waits
        reference = [answer_rate(model, p, new_tokens)[2] for p in prompts]  # each alone (one at a time)
        model.engine.stop_batching()
        theirs = transformers_batch_rate(model, prompts, new_tokens)
    alone_rate = statistics.median(a[1] for a in alone)
    crowd = statistics.median(crowds)
    return {
        "gpu_batching": batching,
        "gpu_batching_crowd_tok_s": crowd,
        "gpu_batching_alone_tok_s": alone_rate,
        "gpu_batching_crowd_over_alone": crowd / alone_rate,
        "gpu_batching_alone_over_one_at_a_time": alone_rate / statistics.median(a[1] for a in alone_path),
        "gpu_batching_wait_p90_over_alone": sorted(firsts)[int(0.9 * len(firsts))]
        / statistics.median(a[0] for a in alone),
        "gpu_transformers_cb_tok_s": theirs,
        "gpu_batching_over_transformers_cb": crowd / theirs,
        "gpu_batching_same_tokens_as_alone": sum(a == b for a, b in zip(tokens, reference)) / clients,
    }


PARTS = ("demo", "models", "decode", "quant", "batching", "probe")


def first_answer_seconds(llma, tokenizer, max_seq_len: int, prompt: str, new_tokens: int) -> float:
    """Seconds from weights already on the device to the end of the first answer of the plain launch (a new
    `MetaModel` over them, as `demos/generate.py` makes one): recording its CUDA graphs included."""
    started = time.perf_counter()
    model = MetaModel(llma, tokenizer, max_seq_len=max_seq_len)
    with eos_ignored(model):
        stream_decode_rate(model, prompt, new_tokens)
    synchronize(model.device)
    return time.perf_counter() - started


def decode_figures(
    model: MetaModel, prompt: str, new_tokens: int, repeats: int, megabytes: int, with_compile: bool
) -> tuple[dict, str]:
    """The plain launch (CUDA graphs where the device has them), the same without CUDA graphs, bare generate and
    --compile on `model`, and the bandwidth limit they are held against; also that limit's terms, in words.
    `model` must not have answered yet: its first answer is timed first."""
    results = {
        "gpu_default_first_answer_s": first_answer_seconds(
            model.llma, model.tokenizer, model.max_seq_len, prompt, new_tokens
        )
    }
    eager = MetaModel(model.llma, model.tokenizer, max_seq_len=model.max_seq_len, cuda_graphs=False)
    runs = {
        "gpu_generate_tok_s": lambda: bare_decode_rate(model, prompt, new_tokens),
        "gpu_stream_tok_s": lambda: stream_decode_rate(model, prompt, new_tokens),
        "gpu_eager_tok_s": lambda: stream_decode_rate(eager, prompt, new_tokens),
    }
    if with_compile:
        compiled = MetaModel(model.llma, model.tokenizer, max_seq_len=model.max_seq_len, compile=True)
        runs["gpu_compile_tok_s"] = lambda: stream_decode_rate(compiled, prompt, new_tokens)
        runs["gpu_compile_forward_tok_s"] = lambda: forward_rate(compiled, prompt, new_tokens)
    if model.engine.graphs is not None:
        runs["gpu_graphs_forward_tok_s"] = lambda: forward_rate(model, prompt, new_tokens)
    with eos_ignored(model):  # and `eager` and `compiled`, which share its model and tokenizer
        results.update(measure(runs, repeats, model.device))
    read_per_token = weight_bytes(model.llma) - weight_bytes(model.llma.get_input_embeddings())
    bandwidth = copy_bandwidth(model.device, megabytes)
    results["gpu_limit_tok_s"] = bandwidth / read_per_token
    results["stream_over_generate"] = results["gpu_stream_tok_s"] / results["gpu_generate_tok_s"]
    results["gpu_stream_over_limit"] = results["gpu_stream_tok_s"] / results["gpu_limit_tok_s"]
    results["gpu_stream_over_eager"] = results["gpu_stream_tok_s"] / results["gpu_eager_tok_s"]
    if with_compile:
        results["compile_over_limit"] = results["gpu_compile_tok_s"] / results["gpu_limit_tok_s"]
        results["compile_forward_over_limit"] = results["gpu_compile_forward_tok_s"] / results["gpu_limit_tok_s"]
    graphs = model.engine.graphs.forward.recorded() if model.engine.graphs is not None else None
    words = f"copy bandwidth {bandwidth / 1e9:.0f} GB/s, {read_per_token / 1e9:.2f} GB read per token; "
    words += f"CUDA graphs: {model.engine.info['cuda_graphs']}" + (f" {graphs}" if graphs else "")
    return results, words


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU, to test that the script runs")
    p.add_argument("--out", type=Path, default=None, help="where gpu_results.json goes (default: bench/)")
    p.add_argument(
        "--only",
        nargs="+",
        choices=PARTS,
        default=None,
        help="run these parts (demo: the demo model; decode: the 7B's decode speed; quant: --quant 4/8; "
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
        from bench.run import QUICK

        results.update(switching.run_on_gpu(QUICK))
        results["measured"]["models"] = f"{today}, {versions}; the demo model and a 0.5b random Llama, bf16"
        save(results, out)
    if {"decode", "quant", "batching", "probe"} & set(parts):
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
