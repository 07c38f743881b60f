"""LoRA adapters over a loaded base (--lora, model/adapters.py), in-process on a random Llama of
`settings.adapters_shape` with two PEFT adapters of rank 16 on every linear layer (what fine-tuning guides use).

- `adapters_switch_ms_more`: the time to first token of a one-token answer with adapter a right after one with
  adapter b (the layers switched), minus the same right after one with a (nothing switched): milliseconds.
- `adapters_decode_unmerged_over_base`: decode tokens/s of an answer with an adapter (PEFT's low-rank pairs beside
  each layer) over the base alone (the same checkpoint loaded without --lora), greedy, EOS ignored.
- `adapters_decode_merged_over_base`: the same with the adapter merged into the weights (--merge_lora).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch

from local_chat.engine import Request, Sampling, collect
from local_chat.model.meta import MetaModel

from .models import SHAPES, eos_ignored, save_random_llama
from .timing import interleaved_values, median_ratio

PROMPT = "Tell me a long story about a red circle, a blue square and a green triangle who travel from Paris to Tokyo."
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_adapter(base: Path, folder: Path, seed: int) -> Path:
    """A rank-16 PEFT LoRA adapter over every linear layer of the checkpoint at `base`, random (non-zero) pairs."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def decode_rate(model: MetaModel, tokens: int, adapter: str | None = None) -> float:
    end = collect(model.engine.stream(Request(PROMPT, Sampling(tokens, temperature=0.0), adapter=adapter))).end
    assert end.completion_tokens == tokens, end
    return end.decode_tokens_per_second


def first_token_ms(model: MetaModel, adapter: str, before: str) -> float:
    """Time to first token with `adapter`, right after an answer with `before`."""
    collect(model.engine.stream(Request(PROMPT, Sampling(1, temperature=0.0), adapter=before)))
    end = collect(model.engine.stream(Request(PROMPT, Sampling(1, temperature=0.0), adapter=adapter))).end
    return end.time_to_first_token * 1000


def run(settings) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        base = save_random_llama(SHAPES[settings.adapters_shape], Path(folder) / "base", dtype=torch.float32)
        a, b = (save_adapter(base, Path(folder) / name, seed) for name, seed in (("a", 1), ("b", 2)))
        plain = MetaModel.from_pretrained(str(base))
        with_adapters = MetaModel.from_pretrained(str(base), lora={"a": a, "b": b})
        merged = MetaModel.from_pretrained(str(base), lora={"a": a}, merge_lora=True)
        tokens, repeats = settings.adapters_tokens, settings.adapters_repeats
        with eos_ignored(plain), eos_ignored(with_adapters), eos_ignored(merged):
            rates = interleaved_values(
                {
                    "base": lambda: decode_rate(plain, tokens),
                    "unmerged": lambda: decode_rate(with_adapters, tokens, "a"),
                    "merged": lambda: decode_rate(merged, tokens),
                },
                repeats,
                settings.warmups,
            )
            firsts = interleaved_values(
                {
                    "switched": lambda: first_token_ms(with_adapters, "a", before="b"),
                    "same": lambda: first_token_ms(with_adapters, "a", before="a"),
                },
                repeats * 2,
                settings.warmups,
            )
    return {
        "adapters_switch_ms_more": statistics.median(firsts["switched"]) - statistics.median(firsts["same"]),
        "adapters_decode_unmerged_over_base": median_ratio(rates["unmerged"], rates["base"]),
        "adapters_decode_merged_over_base": median_ratio(rates["merged"], rates["base"]),
    }
