"""The linear layers of a model answering on the CPU, swapped for torch's own CPU kernels.

At batch 1 a decode step reads every weight once, so its time is the weights' bytes over the memory's bandwidth, if
the kernel keeps up. transformers' layers call `F.linear`, whose bf16 kernel at one row does not (a Llama of
Qwen2.5-0.5B's shape, 2-core Xeon with AMX, a bare forward loop: 12.4 tokens/s in bf16, 13.2 in fp32, which reads
twice the bytes). Here, where the model is on the CPU, in one process, with no LoRA adapter left unmerged:

- bf16 weights are prepacked for oneDNN (`torch.ops.mkldnn._linear_pointwise`, what inductor's freezing does): 17.4
  tokens/s on that model;
- `--quant 8`: int8 weights, one scale per output channel (`torch._weight_int8pack_mm`, gpt-fast's recipe), 1.00
  bytes a weight (llama.cpp's Q8_0: 1.06): 23 tokens/s;
- `--quant 4`: int4 weights in groups of 64 with a bf16 scale and zero point each (`torch._weight_int4pack_mm_for_cpu`),
  0.5625 bytes a weight (Q4_0's): 31 tokens/s.

A vision model's image side keeps its weights (`keeps_weights`): it runs once a prompt. The output layer keeps its
bf16 weights, prepacked whatever `--quant` says: oneDNN reads a matrix that wide faster than the int8 kernel reads its
half (32000 x 896: 2.3 ms, int8 2.0, `F.linear` 3.4), and the output layer's precision is the answer's. Where it is
tied to the embeddings, its packed copy is memory the model did not take before (32000 x 896: 57 MB). bench/cpu.py
measures these against llama.cpp on the same weights.
"""

from __future__ import annotations

import functools
import itertools
import re

import torch
from torch import nn

INT4_GROUP = 64  # weights per int4 scale and zero point: 0.5625 bytes a weight, as llama.cpp's Q4_0


def native_bf16() -> str | None:
    """The instructions with which this CPU computes bf16 natively ("AMX", "AVX512-BF16"), or None."""
    capabilities = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    if capabilities.get("amx_bf16"):
        return "AMX"
    if capabilities.get("avx512_bf16"):
        return "AVX512-BF16"
    return None


class CpuLinear(nn.Module):
    """A linear layer over one of the CPU kernels: its input's rows in bf16 through `multiply`, the bias added, the
    output back in the input's shape and dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def multiply(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.multiply(x.reshape(-1, self.in_features).to(torch.bfloat16))
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class PackedLinear(CpuLinear):
    """bf16 weights that oneDNN has laid out for this CPU once, at load."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1))

    def multiply(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(rows, self.packed, None, "none", [], "")


class Int8Linear(CpuLinear):
    """int8 weights with one scale per output channel (symmetric)."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127
        self.register_buffer("weight_int8", (weight / scales[:, None]).round().clamp(-128, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(torch.bfloat16))

    def multiply(self, rows: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(rows, self.weight_int8, self.scales)


class Int4Linear(CpuLinear):
    """int4 weights in groups of `INT4_GROUP` along the input, each with a bf16 scale and zero point (asymmetric),
    packed for the CPU kernel."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        weight = linear.weight.detach().float().reshape(self.out_features, -1, INT4_GROUP)
        low, high = weight.amin(dim=-1, keepdim=True), weight.amax(dim=-1, keepdim=True)
        scales = (high - low).clamp(min=1e-8) / 15
        codes = ((weight - low) / scales).round().clamp(0, 15).to(torch.int32).reshape(self.out_features, -1)
        zeros = low + scales * 8  # the kernel reads a code q as (q - 8) * scale + zero
        self.register_buffer("weight_int4", torch._convert_weight_to_int4pack_for_cpu(codes, 1))
        scales_and_zeros = torch.stack(
            [scales.reshape(self.out_features, -1), zeros.reshape(self.out_features, -1)], -1
        )
        self.register_buffer("scales_and_zeros", scales_and_zeros.transpose(0, 1).contiguous().to(torch.bfloat16))

    def multiply(self, rows: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(rows, self.weight_int4, INT4_GROUP, self.scales_and_zeros)


# Layers a model calls one after the other on the same input (attention's q, k, v): merged into one layer, they read
# their weights in one pass, which a one-row kernel does faster than in several (bf16, 2-core Xeon: q, k and v of
# Qwen2.5-0.5B's shape in 114 us merged, 157 apart). Not the MLP's gate and up: merged, their 2,081-row prompt took
# oneDNN 30 ms a layer against 20 apart (one row: 758 us against 818), and prompts matter more.
SIBLINGS = (("q_proj", "k_proj", "v_proj"),)


class _LastOutput:
    """The merged layer's last (input, output), which the siblings share."""

    last: tuple[torch.Tensor, torch.Tensor] | None = None


class SiblingLinear(nn.Module):
    """One of `SIBLINGS`, as the columns `start:end` of a merged layer's output. The first sibling called on an input
    computes the merged layer; the others find its output for the same input (the same tensor) and take theirs. An
    input that is not the last one (a sibling called on its own) computes the merged layer again: never a wrong
    output, at worst a slower one."""

    def __init__(self, merged: CpuLinear, start: int, end: int, shared: _LastOutput, holds: bool):
        super().__init__()
        self.in_features, self.out_features, self.start, self.end = merged.in_features, end - start, start, end
        if holds:  # one sibling holds the merged layer (its weights counted once), the others reach it through it
            self.merged = merged
        self._merged, self._shared = [merged], shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = self._shared.last
        if last is None or last[0] is not x:
            last = self._shared.last = (x, self._merged[0](x))
        return last[1][..., self.start : self.end].contiguous()


def _swappable(layer: nn.Module, name: str, prefix: str, kind, kept: list[re.Pattern]) -> bool:
    """Whether `kind` can take the layer `name` (under `prefix`): a plain linear layer not kept, whose input an int4
    layer can split into whole groups."""
    if type(layer) is not nn.Linear or any(pattern.match(prefix + name) for pattern in kept):
        return False
    return not (kind is Int4Linear and layer.in_features % INT4_GROUP)


def _merge_siblings(module: nn.Module, kind, swappable) -> int:
    """Swap each group of `SIBLINGS` among `module`'s children (all plain linear layers of one input width that
    `swappable` allows) for `SiblingLinear`s over one `kind` layer; the number of layers swapped."""
    swapped = 0
    for names in SIBLINGS:
        layers = [getattr(module, name, None) for name in names]
        if not all(swappable(layer, name) for layer, name in zip(layers, names)):
            continue
        if len({layer.in_features for layer in layers}) > 1 or "Cross" in type(module).__name__:
            continue  # cross-attention reads keys and values from another input than its queries
        ends = list(itertools.accumulate(layer.out_features for layer in layers))
        merged = nn.Linear(layers[0].in_features, ends[-1], bias=any(layer.bias is not None for layer in layers))
        with torch.no_grad():
            merged.weight = nn.Parameter(torch.cat([layer.weight for layer in layers]), requires_grad=False)
            if merged.bias is not None:
                biases = [layer.bias if layer.bias is not None else layer.weight.new_zeros(layer.out_features)
                          for layer in layers]  # fmt: skip
                merged.bias = nn.Parameter(torch.cat(biases), requires_grad=False)
        merged_kind, shared = kind(merged), _LastOutput()
        for index, name in enumerate(names):
            start = ends[index - 1] if index else 0
            setattr(module, name, SiblingLinear(merged_kind, start, ends[index], shared, holds=index == 0))
        swapped += len(names)
    return swapped


def swap_linears(model: nn.Module, bits: int | None, keeps_weights: list[str]) -> str | None:
    """Swap `model`'s linear layers on the CPU for the kernels above (`bits`: None for bf16 weights, else 8 or 4), but
    those whose names match `keeps_weights` (patterns from the start of a module's name) and those a kernel cannot
    take (an int4 layer's input must split into whole groups), with `SIBLINGS` merged and a bf16 output layer
    prepacked; return what the model panel says of it, or None where nothing was swapped (a model in another dtype
    than bf16, without --quant)."""
    if bits is None and next(model.parameters()).dtype != torch.bfloat16:
        return None
    kind = {None: PackedLinear, 8: Int8Linear, 4: Int4Linear}[bits]
    kept = [re.compile(pattern) for pattern in keeps_weights]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    packed_head = type(head) is nn.Linear and head.weight.dtype == torch.bfloat16
    if packed_head:
        packed = PackedLinear(head)
        # Some models read `lm_head.weight` (its dtype): tied to the embeddings, it stays (they hold it); else only its
        # shape and dtype stay, its values live on in the packed copy, never in two copies.
        tied = head.weight is getattr(model.get_input_embeddings(), "weight", None)
        packed.weight = head.weight.detach() if tied else head.weight.detach().to("meta")
        model.set_output_embeddings(packed)
    swapped = 0
    for name, module in list(model.named_modules()):
        swappable = functools.partial(_swappable, prefix=f"{name}." if name else "", kind=kind, kept=kept)
        swapped += _merge_siblings(module, kind, swappable)
        for child_name, child in list(module.named_children()):
            if swappable(child, child_name):
                setattr(module, child_name, kind(child))
                swapped += 1
    if not swapped:
        return "the output layer: bf16 prepacked for oneDNN" if packed_head else None
    what = {None: "bf16 prepacked for oneDNN", 8: "int8 weights (torch's int8 kernel)", 4: "int4 weights"}[bits]
    return f"{swapped} linear layers: {what}" + ("; the output layer: bf16 prepacked" if packed_head else "")
