"""How many bytes a module's weights take, quantization constants included."""

import torch


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of parameters and buffers, plus bitsandbytes' quantization state (absmax, scales, code books)."""
    total = 0
    for tensor in list(module.parameters()) + list(module.buffers()):
        total += tensor.numel() * tensor.element_size()
        quant_state = getattr(tensor, "quant_state", None)  # 4-bit: absmax (nested), quant maps
        if quant_state is not None:
            total += sum(
                v.numel() * v.element_size() for v in quant_state.as_dict(packed=True).values() if torch.is_tensor(v)
            )
        scales = getattr(tensor, "SCB", None)  # 8-bit: one scale per row
        if torch.is_tensor(scales):
            total += scales.numel() * scales.element_size()
    return total
