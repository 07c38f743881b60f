"""Random models for the benchmarks, in the shapes the figures are about, loaded the way users load theirs.

No checkpoint can be downloaded here, and speed and footprint depend on shapes, not on trained weights. The
tokenizer is synthetic too: every id decodes to one to three ASCII characters, so a random model's output is
always valid text and the streaming path does all its usual work (incremental detokenizing, stop checks).
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from local_chat.model.meta import MetaModel


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    kv_heads: int | None = None

    def llama_config(self, max_positions: int = 4096):
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads or self.heads,
            intermediate_size=self.intermediate,
            max_position_embeddings=max_positions,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            tie_word_embeddings=False,
        )


SHAPES = {
    "tiny": Shape(hidden=64, layers=2, heads=4, intermediate=192, vocab=1024),
    "small": Shape(hidden=256, layers=4, heads=4, intermediate=768, vocab=4096),  # the demo model's size
    "100m": Shape(hidden=768, layers=12, heads=12, intermediate=2048, vocab=8192),  # 97M parameters
    "0.5b": Shape(hidden=1024, layers=24, heads=16, intermediate=4096, vocab=32000),  # 468M parameters
    # Qwen2.5-0.5B's and 1.5B's shapes with a 32k vocabulary (bench/cpu.py ties their embeddings, as Qwen2.5's are)
    "qwen0.5b": Shape(hidden=896, layers=24, heads=14, intermediate=4864, vocab=32000, kv_heads=2),  # 386M tied
    "qwen1.5b": Shape(hidden=1536, layers=28, heads=12, intermediate=8960, vocab=32000, kv_heads=2),  # 1.2B tied
    "7b": Shape(hidden=4096, layers=32, heads=32, intermediate=11008, vocab=32000),  # Llama-2-7B's shape
}


def synthetic_tokenizer(vocab_size: int, with_eos: bool = True):
    """A byte-level BPE tokenizer of exactly `vocab_size` ids: <unk> <s> </s>, the 128 ASCII bytes, then pairs
    and triples of printable characters. Without EOS, a model using it answers until the length limit."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    byte_chars = [_byte_level_char(b) for b in range(128)]
    printable = [_byte_level_char(b) for b in range(33, 127)]
    vocab = {token: i for i, token in enumerate(["<unk>", "<s>", "</s>"] + byte_chars)}
    merges = []
    for parts in itertools.chain(itertools.product(printable, repeat=2), itertools.product(printable, repeat=3)):
        if len(vocab) >= vocab_size:
            break
        vocab["".join(parts)] = len(vocab)
        merges.append(("".join(parts[:-1]), parts[-1]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>" if with_eos else None, unk_token="<unk>"
    )


def _byte_level_char(byte: int) -> str:
    """The character GPT-2's byte-level alphabet uses for `byte`."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    if byte in printable:
        return chr(byte)
    return chr(256 + [b for b in range(256) if b not in printable].index(byte))


def save_random_llama(shape: Shape, folder: Path, dtype=torch.bfloat16, seed: int = 0, with_eos: bool = True) -> Path:
    """A random Llama of `shape` with the synthetic tokenizer, as a Hugging Face folder."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = shape.llama_config()
    if not with_eos:
        config.eos_token_id = None
    model = LlamaForCausalLM._from_config(config, dtype=dtype)
    if not with_eos:
        model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    synthetic_tokenizer(shape.vocab, with_eos).save_pretrained(folder)
    return folder


def random_meta_model(
    shape: Shape, device="cpu", dtype=torch.float32, seed: int = 0, max_seq_len: int = 2048, compile: bool = False
) -> MetaModel:
    """A random Llama of `shape` built in memory on `device` (no disk round trip for a 7B model)."""
    from transformers import LlamaForCausalLM

    from local_chat.model.tokenizer import HFTokenizer

    torch.manual_seed(seed)
    with torch.device(device):  # built in `dtype` on `device`: a 7B model never exists in fp32 or on the CPU
        llma = LlamaForCausalLM._from_config(shape.llama_config(max_seq_len), dtype=dtype).eval()
    return MetaModel(
        llma,
        HFTokenizer(synthetic_tokenizer(shape.vocab)),
        max_seq_len=max_seq_len,
        info={"architecture": f"random Llama {shape}"},
        compile=compile,
    )


@contextmanager
def eos_ignored(model: MetaModel):
    """Generate exactly the asked number of tokens (the benchmarks compare equal amounts of work)."""
    saved = (model.tokenizer.eos_ids, model.llma.generation_config.eos_token_id)
    model.tokenizer.eos_ids, model.llma.generation_config.eos_token_id = set(), None
    try:
        yield model
    finally:
        model.tokenizer.eos_ids, model.llma.generation_config.eos_token_id = saved
