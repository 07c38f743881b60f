"""Small random models and tokenizers, written in every checkpoint format the loader reads.

No model can be downloaded on our machines, so tests build their own: a sentencepiece and a byte-level BPE
tokenizer trained on a few sentences, a random Llama saved as a Hugging Face folder, as LLaMA2-Accessory
shards and as Meta shards, and a random LLaVA with a CLIP-like vision tower.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

# the sizes, and the 2026 families (their real classes, published templates and special tokens) with forced answers
from bench.families import QWEN_ADDED, TEXT_CONFIG, ForcedAnswer, qwen_tokenizer, save_tiny_qwen3  # noqa: F401

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "What is 12 plus 7? The answer is 19. What is 45 minus 3? The answer is 42.",
    "### Human: Hello there!\n### Assistant: Hello! How can I help you today?",
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.",
    "Héllo wörld, ça va? Grüße aus München. 你好，世界。 こんにちは 🙂 🚀 ✓",
    "A red circle and a blue square. A green triangle on a dark background.",
] * 20
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# a tool the tests offer reasoning models (OpenAI's shape)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def train_sentencepiece(folder: Path, vocab_size: int = 400) -> Path:
    """A Llama-style sentencepiece model: BPE, byte fallback, digits split, no normalization."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_prefix=str(folder / "tokenizer"),
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    (folder / "tokenizer.vocab").unlink()
    return folder / "tokenizer.model"


def train_byte_level_tokenizer(vocab_size: int = 400, chat_template: str | None = CHATML_TEMPLATE):
    """A byte-level BPE `PreTrainedTokenizerFast` with <s>, </s>, <pad>, <image> and ChatML markers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>", "<image>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=specials[4:],
    )
    if chat_template:
        hf.chat_template = chat_template
    return hf


def random_llama(vocab_size: int, seed: int = 0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **{**TEXT_CONFIG, **overrides}
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger logits than the default init, so greedy answers vary from token to token
        model.lm_head.weight.mul_(20)
    return model


def random_gpt2(vocab_size: int, seed: int = 0):
    """An architecture transformers has no tensor-parallel plan for."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab_size, n_positions=256, n_embd=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2
    )
    return GPT2LMHeadModel(config).eval()


def save_hf(model, folder: Path, tokenizer_model: Path | None = None, hf_tokenizer=None) -> Path:
    model.save_pretrained(folder)
    if tokenizer_model is not None:
        shutil.copy(tokenizer_model, folder / "tokenizer.model")
    if hf_tokenizer is not None:
        hf_tokenizer.save_pretrained(folder)
    return folder


# ----- Hugging Face Llama -> Accessory / Meta consolidated shards (the inverse of the loader's conversion) -----

_META_NAMES = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
}
_SPLIT = {"tok_embeddings": 1, "output": 0, "wq": 0, "wk": 0, "wv": 0, "wo": 1, "w1": 0, "w3": 0, "w2": 1}


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    out_dim, in_dim = w.shape
    return w.view(n_heads, 2, out_dim // n_heads // 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def meta_state_dict(model) -> dict[str, torch.Tensor]:
    config = model.config
    state = {}
    for name, tensor in model.state_dict().items():
        if name == "model.embed_tokens.weight":
            key = "tok_embeddings.weight"
        elif name == "model.norm.weight":
            key = "norm.weight"
        elif name == "lm_head.weight":
            key = "output.weight"
        else:
            _, _, layer, *local, leaf = name.split(".")
            key = f"layers.{layer}.{_META_NAMES['.'.join(local)]}.{leaf}"
            if local == ["self_attn", "q_proj"]:
                tensor = _unpermute(tensor, config.num_attention_heads)
            elif local == ["self_attn", "k_proj"]:
                tensor = _unpermute(tensor, config.num_key_value_heads)
        state[key] = tensor.clone()
    state["rope.freqs"] = torch.zeros(config.hidden_size // config.num_attention_heads // 2)
    return state


def split_shards(state: dict[str, torch.Tensor], n: int) -> list[dict[str, torch.Tensor]]:
    shards = [{} for _ in range(n)]
    for key, tensor in state.items():
        dim = _SPLIT.get(key.split(".")[-2])
        parts = tensor.chunk(n, dim=dim) if dim is not None else [tensor] * n
        for shard, part in zip(shards, parts):
            shard[key] = part.clone()
    return shards


def meta_params(config, vocab_size: int = -1) -> dict:
    return {
        "dim": config.hidden_size,
        "n_layers": config.num_hidden_layers,
        "n_heads": config.num_attention_heads,
        "n_kv_heads": config.num_key_value_heads,
        "vocab_size": vocab_size,
        "multiple_of": 32,
        "norm_eps": config.rms_norm_eps,
        "rope_theta": 10000.0,
    }


def save_accessory(
    model,
    folder: Path,
    tokenizer_model: Path | None = None,
    hf_tokenizer=None,
    shards: int = 2,
    llama_type: str | None = "llama",
) -> Path:
    """consolidated.NN-of-MM.model.pth ({"model": {"llma.*": ...}}) + config.json + meta.json + tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, shard in enumerate(split_shards(meta_state_dict(model), shards)):
        torch.save(
            {"model": {f"llma.{k}": v for k, v in shard.items()}},
            folder / f"consolidated.{i:02d}-of-{shards:02d}.model.pth",
        )
    (folder / "config.json").write_text(json.dumps(meta_params(model.config, model.config.vocab_size)))
    if llama_type:
        (folder / "meta.json").write_text(json.dumps({"llama_type": llama_type}))
    if tokenizer_model is not None:
        shutil.copy(tokenizer_model, folder / "tokenizer.model")
    if hf_tokenizer is not None:
        hf_tokenizer.save_pretrained(folder)
    return folder


def save_meta(model, folder: Path, tokenizer_model: Path, shards: int = 2) -> Path:
    """consolidated.NN.pth + params.json (vocab_size -1, as Llama-2's) + tokenizer.model."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, shard in enumerate(split_shards(meta_state_dict(model), shards)):
        torch.save(shard, folder / f"consolidated.{i:02d}.pth")
    (folder / "params.json").write_text(json.dumps(meta_params(model.config)))
    shutil.copy(tokenizer_model, folder / "tokenizer.model")
    return folder


def save_tiny_llava(
    folder: Path, seed: int = 0, image_size: int = 32, patch_size: int = 8, conv_stem: bool = False
) -> Path:
    """A random LLaVA (CLIP vision tower, projector, Llama) with its processor, as a Hugging Face folder.
    `conv_stem`: the demo model's tower, CLIP with convolutions in place of the patch embedding."""
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from local_chat.model.vision_stem import ConvStemCLIPVisionConfig

    tokenizer = train_byte_level_tokenizer()
    vision_config = ConvStemCLIPVisionConfig if conv_stem else CLIPVisionConfig
    vision = vision_config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=patch_size,
    )
    text = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2, **TEXT_CONFIG)
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        image_token="<image>",
        num_additional_image_tokens=1,
    )
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


LORA_TARGETS = ("q_proj", "v_proj", "o_proj", "down_proj")


def save_lora(base, folder: Path, seed: int, targets=LORA_TARGETS, rank: int = 4) -> Path:
    """A PEFT LoRA adapter over `base` (a copy of it is wrapped; `base` stays as it is), as PEFT's save_pretrained
    writes it: random pairs strong enough that greedy answers differ from the base's."""
    import copy

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets), init_lora_weights=False)
    adapted = get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():
        for name, weight in adapted.named_parameters():
            if "lora_B" in name:
                weight.mul_(30)
    adapted.save_pretrained(folder)
    return folder
