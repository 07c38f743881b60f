"""bench/gpu.py's parts `demo`, `decode` and `probe`: the demo model's first and later answers; the 7B shape's plain
launch, bare generate, no CUDA graphs and --compile against the bandwidth limit; two variants of the graphs' step."""

from __future__ import annotations

import functools
import statistics
import time

import torch

from bench.gpu_timing import bare_decode_rate, copy_bandwidth, forward_rate, measure, stream_decode_rate, synchronize
from bench.models import eos_ignored
from local_chat.defaults import DEMO_MODEL
from local_chat.model.footprint import weight_bytes
from local_chat.model.meta import MetaModel


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


def step_variants(model: MetaModel, prompt: str, new_tokens: int, repeats: int) -> dict:
    """Where the CUDA graphs' decode step loses time against the bandwidth limit: the plain launch's rate next to
    the same with each RMSNorm as torch's one fused kernel (`F.rms_norm`) instead of transformers' seven, and with
    cuDNN attention allowed (one plan per cache length, made in the eager warm-up step). A probe: neither is used."""

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
