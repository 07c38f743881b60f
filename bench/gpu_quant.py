"""bench/gpu.py's part `quant`: the 7B shape saved and loaded back with --quant 4 and 8 (bitsandbytes), next to
torchao's weight-only int4 and int8 on the same weights: decode tokens/s and the weights' bytes."""

from __future__ import annotations

import tempfile

import torch

from bench.gpu_timing import free_memory, measure, stream_decode_rate
from bench.models import eos_ignored
from local_chat.model.footprint import weight_bytes
from local_chat.model.meta import MetaModel


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
            free_memory(model.device)
        for name, config in _torchao_configs().items():
            try:
                results.update(_torchao_rates(folder, model, name, config, prompt, new_tokens, repeats))
            except Exception as error:  # noqa: BLE001 (a candidate that fails is reported, not fatal)
                results[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            free_memory(model.device)
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
    free_memory(model.device)
    results = {f"{name}_weights_gb": (torch.cuda.memory_allocated(model.device) - before) / 1e9}
    results.update(_graphs_and_eager(loaded, name, prompt, new_tokens, 1))
    return results
