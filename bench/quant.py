"""What --quant 4 and --quant 8 save on the CPU (torch's int4 and int8 kernels, model/cpu_linear.py): weight bytes
(quantization constants included) over bf16, loaded through `MetaModel.from_pretrained` from a Hugging Face folder,
as a user's checkpoint would be."""

from __future__ import annotations

import tempfile
from pathlib import Path

from local_chat.model.footprint import weight_bytes
from local_chat.model.meta import MetaModel

from .models import SHAPES, save_random_llama


def footprints(folder: Path, quant) -> tuple[int, int]:
    """(transformer blocks' bytes, whole model's bytes)."""
    model = MetaModel.from_pretrained(str(folder), quant=quant, dtype="bf16", device="cpu")
    if quant is not None:  # the loader must really have quantized, or the figure means nothing
        from local_chat.model.cpu_linear import Int4Linear, Int8Linear

        assert isinstance(model.llma.model.layers[0].mlp.down_proj, (Int4Linear, Int8Linear))
    return weight_bytes(model.llma.model.layers), weight_bytes(model.llma)


def run(settings) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
        folder = save_random_llama(SHAPES[settings.quant_shape], Path(tmp))
        blocks16, whole16 = footprints(folder, None)
        results = {}
        for bits in (4, 8):
            blocks, whole = footprints(folder, bits)
            results[f"quant{bits}_footprint"] = blocks / blocks16
            results[f"quant{bits}_footprint_whole"] = whole / whole16
    return results
