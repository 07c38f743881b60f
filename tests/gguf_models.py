"""GGUF files for the tests, written by llama.cpp's own converter (bench/cpu.py fetches it) from tiny random Qwen3
models of the real class, with Qwen3's published chat template and Qwen2's pre-tokenizer (llama.cpp's "qwen2"), their
vocabularies ASCII (a random model's answers are whole characters, so llama.cpp's stream holds none back); and a tiny
Qwen2-VL (fixtures/vlm_families.py) with its image projector (`mmproj-*.gguf`) beside it.

llama.cpp computes these models' answers, so no hook can make them write a given answer (bench/families.py's
`ForcedAnswer`). `tiny_qwen3(answer=...)` sets the weights instead: every layer's output projections are zero, so
the last position's state is its token's embedding, and the output layer maps each token of the answer to the next
one (a bigram table): the model writes `answer` after any prompt that ends in a newline, then <|im_end|>."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from bench.cpu import convert
from bench.families import TEMPLATES, qwen_tokenizer, save_tiny_qwen3

QWEN_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

THINKING_ANSWER = "<think>Let me think</think>Paris"
CALL = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'  # one added token: a bigram writes no JSON
CALL_ANSWER = f"<tool_call>{CALL}</tool_call>"


def tiny_qwen3(folder: Path, answer: str | None = None, seed: int = 0, every_byte: bool = False) -> Path:
    """A random Qwen3ForCausalLM saved in `folder`; with `answer`, one that writes it (see the module's docstring).
    `every_byte`: a vocabulary with a token for each byte, as Qwen's (a character outside the corpus's is written
    byte by byte)."""
    template = (TEMPLATES / "qwen3.jinja").read_text()
    tokenizer = qwen_tokenizer(template, qwen_split=True, added=(CALL,), every_byte=every_byte)
    shaped = None if answer is None else functools.partial(_script, answer=answer)
    return save_tiny_qwen3(folder, seed, tokenizer=tokenizer, shaped=shaped)


def _script(model, tokenizer, answer: str) -> None:
    chain = tokenizer.encode("\n", add_special_tokens=False) + tokenizer.encode(answer, add_special_tokens=False)
    chain.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert len(set(chain)) == len(chain), f"a bigram cannot write {answer!r}: a token comes twice"
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        head = model.lm_head.weight
        head.zero_()
        for token, following in zip(chain, chain[1:]):
            head[following] = 10 * embeddings[token] / embeddings[token].norm()


def gguf_of(folder: Path, kind: str = "q8_0") -> Path:
    """`folder`'s model as a GGUF file of `kind` beside it (llama.cpp's converter)."""
    return convert(folder, kind, folder.parent / f"{folder.name}-{kind}.gguf", pre_tokenizer="qwen2")


def tiny_qwen2_vl(work: Path) -> Path:
    """A folder in `work` holding a random Qwen2VLForConditionalGeneration's language model as GGUF (Q8_0) and its
    image projector (`mmproj-...gguf`, F16), as vision models are published for llama.cpp."""
    from fixtures import vlm_families

    tokenizer = qwen_tokenizer(
        vlm_families.template("qwen2_vl"), qwen_split=True, every_byte=False, specials=QWEN_VISION_TOKENS
    )
    torch.manual_seed(0)
    model, processor, template, published_in = vlm_families._qwen_vl("2", tokenizer, vision_depth=3)
    vlm_families._sharpen(model.eval())
    source = vlm_families._save(model, processor, work / "qwen2-vl-hf", published_in, template)
    out = work / "qwen2-vl"
    out.mkdir()
    convert(source, "q8_0", out / "qwen2-vl-q8_0.gguf", pre_tokenizer="qwen2")
    convert(source, "f16", out / "mmproj-qwen2-vl-f16.gguf", mmproj=True)
    return out
