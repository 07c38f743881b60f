"""Reading checkpoints: which format a folder holds, and Accessory / Meta consolidated shards as HF Llama weights.

Model-parallel shards are merged per weight, q/k are permuted to Hugging Face's rotary layout and the names
are mapped to `LlamaForCausalLM`'s, so the rest of the project only ever sees an ordinary transformers model.
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from local_chat.errors import UserError

ACCESSORY_SHARD = re.compile(r"^consolidated\.(\d+)-of-(\d+)\.model\.pth$")
META_SHARD = re.compile(r"^consolidated\.(\d+)\.pth$")
HF_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")
SUPPORTED_LLAMA_TYPES = ("llama", "llama_peft")
# LLaMA2-Accessory's other model types (accessory/model/LLM/), each refused with why
MULTIMODAL_TYPES = ("llama_qformerv2", "llama_qformerv2_peft", "llama_ens", "llama_ens5", "llama_ens5p2", "llama_ens10",
                    "llama_ens_peft", "llama_ens_light", "llama_ens5_light", "llama_interleave",
                    "llama_media_generation_template", "mistral_sparse_ens", "mixtral_sparse_ens",
                    "mixtral_sparse_ens5")  # fmt: skip
# its Mixtral ("mistral" is its Mixtral: experts), InternLM, Falcon and LLaMA-Adapter, not renamed to transformers here
UNMAPPED_TYPES = ("mistral", "mistral_peft", "mistral_sparse", "mixtral", "mixtral_peft", "mixtral_sparse", "internlm",
                  "falcon", "llama_adapter")  # fmt: skip
# llama_peft's linears (accessory/model/peft.py): column-parallel ones split their outputs across model-parallel
# ranks (weight, bias and lora_b by rows), row-parallel ones their inputs (weight and lora_a by columns; the bias
# whole, added after the ranks' sum)
COLUMN_PARALLEL, ROW_PARALLEL = ("wq", "wk", "wv", "w1", "w3"), ("wo", "w2")

# Dimension along which Accessory/Meta (fairscale) model parallelism split each weight; None: replicated.
_SPLIT_DIM = {
    "tok_embeddings": 1,
    "output": 0,
    "wq": 0,
    "wk": 0,
    "wv": 0,
    "wo": 1,
    "w1": 0,
    "w3": 0,
    "w2": 1,
}
_HF_LAYER_NAMES = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w2": "mlp.down_proj",
    "feed_forward.w3": "mlp.up_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_HF_TOP_NAMES = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head"}
_IGNORED_KEYS = ("rope.freqs",)


@dataclass
class ConsolidatedCheckpoint:
    folder: Path
    kind: str  # "accessory" or "meta"
    shards: list[Path]


def detect_format(folder: Path) -> str | ConsolidatedCheckpoint:
    """'hf' for a Hugging Face folder, else the consolidated shards found; a clear error when neither."""
    if not folder.exists():
        raise UserError(f"Checkpoint path {folder} does not exist; check --pretrained_path.")
    if not folder.is_dir():
        raise UserError(f"Checkpoint path {folder} is a file; pass the folder that holds the checkpoint.")
    config = _read_json(folder / "config.json") if (folder / "config.json").is_file() else None
    if config is not None and "model_type" in config:
        if not any(any(folder.glob(p)) for p in HF_WEIGHT_PATTERNS):
            raise UserError(
                f"{folder} holds a Hugging Face config.json but no weights (model.safetensors or "
                "pytorch_model.bin); copy the weight files into that folder."
            )
        return "hf"
    for kind, pattern in (("accessory", ACCESSORY_SHARD), ("meta", META_SHARD)):
        shards = _shards(folder, pattern, kind)
        if shards:
            return ConsolidatedCheckpoint(folder, kind, shards)
    raise UserError(
        f"No checkpoint found in {folder}: looked for a Hugging Face folder (config.json with model.safetensors "
        "or pytorch_model.bin), LLaMA2-Accessory shards (consolidated.00-of-01.model.pth) and Meta shards "
        "(consolidated.00.pth)."
    )


def _shards(folder: Path, pattern: re.Pattern, kind: str) -> list[Path]:
    found = {}
    totals = set()
    for path in folder.iterdir():
        match = pattern.match(path.name)
        if match:
            found[int(match.group(1))] = path
            if kind == "accessory":
                totals.add(int(match.group(2)))
    if not found:
        return []
    expected = max(totals) if totals else max(found) + 1
    missing = [i for i in range(expected) if i not in found]
    if missing:
        name = (
            (lambda i: f"consolidated.{i:02d}-of-{expected:02d}.model.pth")
            if kind == "accessory"
            else (lambda i: f"consolidated.{i:02d}.pth")
        )
        raise UserError(
            f"{folder} is missing checkpoint shards: found {len(found)} of {expected}, "
            f"{', '.join(name(i) for i in missing)} absent; copy every shard into that folder."
        )
    return [found[i] for i in range(expected)]


def _read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"Cannot read {path}: {exc}; fix or remove that file.")


def merged_params(paths: list[Path]) -> dict:
    """Model arguments from JSON files merged left to right (later keys win)."""
    params: dict = {}
    for path in paths:
        if not path.is_file():
            raise UserError(f"Model config {path} does not exist; check --llama_config.")
        params.update(_read_json(path))
    return params


def find_model_config(folders: list[Path]) -> list[Path]:
    """config.json (Accessory) or params.json (Meta) of each folder, in order."""
    found = []
    for folder in folders:
        for name in ("config.json", "params.json"):
            if (folder / name).is_file():
                found.append(folder / name)
                break
    return found


def find_llama_type(folders: list[Path], checkpoints: list[ConsolidatedCheckpoint]) -> str:
    for folder in reversed(folders):
        if (folder / "meta.json").is_file():
            llama_type = _read_json(folder / "meta.json").get("llama_type")
            if llama_type:
                return llama_type
    if all(ckpt.kind == "meta" for ckpt in checkpoints):
        return "llama"
    raise UserError(f"Cannot tell the model type of {folders[-1]}: it has no meta.json; pass --llama_type llama.")


def check_llama_type(llama_type: str) -> None:
    if llama_type in MULTIMODAL_TYPES:
        raise UserError(
            f"llama_type {llama_type!r} is one of LLaMA2-Accessory's multimodal models (SPHINX, Q-Former), "
            "which this app does not load; for image chat pass a Hugging Face vision folder (LLaVA-style, or any "
            "image-text-to-text model) as --pretrained_path."
        )
    if llama_type in UNMAPPED_TYPES:
        raise UserError(
            f"llama_type {llama_type!r} is not read from Accessory's format: this loader reads llama and llama_peft "
            "(whose layers map onto transformers' Llama); pass the model as a Hugging Face folder instead."
        )
    if llama_type not in SUPPORTED_LLAMA_TYPES:
        raise UserError(
            f"llama_type {llama_type!r} is not supported: this loader reads {', '.join(SUPPORTED_LLAMA_TYPES)} "
            "checkpoints (Accessory or Meta format); for vision chat use a Hugging Face LLaVA-style folder "
            "with with_visual=True (--pretrained_path to that folder)."
        )


def _load_shard(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError:
        raise pickled_objects_error(path)
    except Exception as exc:  # a truncated file
        raise UserError(f"Cannot read checkpoint shard {path} ({type(exc).__name__}); the file may be incomplete.")
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    # Accessory prefixes its weights with "llma."; Meta's are bare.
    return {key.removeprefix("llma."): value for key, value in state.items()}


def pickled_objects_error(path: Path) -> UserError:
    return UserError(
        f"{path} holds pickled Python objects besides tensors, which could run code when loaded, and "
        "this app loads weights only (weights_only=True); use a safetensors copy of the checkpoint."
    )


def split_dim(key: str) -> int | None:
    """The dimension along which model parallelism split the tensor `key` (None: every rank holds it whole)."""
    parts = key.split(".")
    owner, linear = parts[-2], parts[-3] if len(parts) > 2 else ""
    if owner in ("lora_a", "lora_b"):  # llama_peft's LoRA pair of `linear`
        if linear in COLUMN_PARALLEL:
            return 0 if owner == "lora_b" else None
        return 1 if owner == "lora_a" else None
    if parts[-1] == "bias":
        return 0 if owner in COLUMN_PARALLEL else None
    return _SPLIT_DIM.get(owner)


def _merge_shards(shard_states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    merged = {}
    for key in shard_states[0]:
        if key in _IGNORED_KEYS:
            continue
        dim = split_dim(key)
        parts = [state[key] for state in shard_states]
        merged[key] = parts[0] if dim is None or len(parts) == 1 else torch.cat(parts, dim=dim)
    return merged


def fold_peft(weights: dict[str, torch.Tensor], params: dict) -> bool:
    """llama_peft's tensors (accessory/model/LLM/llama_peft.py) folded into plain llama weights: each LoRA pair
    merged into its linear's weight, W + B A (Accessory adds lora_b(lora_a(x)), unscaled); with `bias_tuning`
    (Accessory's default), a bias on every linear, zero where the checkpoints hold none. Whether the linears have
    biases."""
    for key in [k for k in weights if k.endswith(".lora_a.weight")]:
        linear = key.removesuffix(".lora_a.weight")
        lora_a, lora_b = weights.pop(key), weights.pop(f"{linear}.lora_b.weight", None)
        if lora_b is None or f"{linear}.weight" not in weights:
            raise UserError(f"{key} has no linear weight or lora_b beside it; a checkpoint file is missing.")
        weight = weights[f"{linear}.weight"]
        weights[f"{linear}.weight"] = (weight.float() + lora_b.float() @ lora_a.float()).to(weight.dtype)
    if not params.get("bias_tuning", True):
        return False
    for key in [k for k in weights if k.endswith(".weight") and k.split(".")[-2] in COLUMN_PARALLEL + ROW_PARALLEL]:
        weight = weights[key]
        weights.setdefault(key.removesuffix("weight") + "bias", torch.zeros(weight.shape[0], dtype=weight.dtype))
    return True


def load_consolidated_weights(checkpoints: list[ConsolidatedCheckpoint]) -> dict[str, torch.Tensor]:
    """Weights of all checkpoints in order (later ones override), shards merged, Accessory/Meta names kept."""
    weights: dict[str, torch.Tensor] = {}
    for ckpt in checkpoints:
        weights.update(_merge_shards([_load_shard(path) for path in ckpt.shards]))
    return weights


def _permute_for_hf_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Meta's rotary pairs adjacent dims (interleaved); HF's pairs the two halves of each head."""
    out_dim, in_dim = w.shape
    return w.view(n_heads, out_dim // n_heads // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def _hf_name(key: str) -> str:
    parts = key.split(".")
    if parts[0] == "layers" and len(parts) >= 4:
        local = ".".join(parts[2:-1])
        if local in _HF_LAYER_NAMES:
            return f"model.layers.{parts[1]}.{_HF_LAYER_NAMES[local]}.{parts[-1]}"
    elif len(parts) == 2 and parts[0] in _HF_TOP_NAMES:
        return f"{_HF_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise UserError(
        f"Unexpected tensor {key!r} in the checkpoint: it is not a llama or llama_peft model (another Accessory "
        "type?); pass --llama_type with the type it was trained as."
    )


def llama_config_from_params(
    params: dict, weights: dict[str, torch.Tensor], max_seq_len: int, tokenizer, biased: bool = False
):
    """A `LlamaConfig` from Accessory/Meta model arguments; sizes the params leave open come from the weights.
    `biased`: every linear has a bias (llama_peft's bias tuning)."""
    from transformers import LlamaConfig

    for required in ("dim", "n_layers", "n_heads"):
        if required not in params:
            raise UserError(f"The model config has no {required!r}; pass --llama_config with the model's params.json.")
    embed = weights.get("tok_embeddings.weight")
    w1 = weights.get("layers.0.feed_forward.w1.weight")
    if embed is None or w1 is None:
        raise UserError(
            "The checkpoint has no tok_embeddings or layers.0.feed_forward.w1 weights; it is not a llama model."
        )
    vocab_size = params.get("vocab_size", -1)
    return LlamaConfig(
        vocab_size=vocab_size if vocab_size and vocab_size > 0 else embed.shape[0],
        hidden_size=params["dim"],
        intermediate_size=_ffn_hidden_size(params) or w1.shape[0],
        num_hidden_layers=params["n_layers"],
        num_attention_heads=params["n_heads"],
        num_key_value_heads=params.get("n_kv_heads") or params["n_heads"],
        rms_norm_eps=params.get("norm_eps", 1e-5),
        rope_theta=params.get("rope_theta", 10000.0),
        max_position_embeddings=max_seq_len,
        tie_word_embeddings=False,
        attention_bias=biased,
        mlp_bias=biased,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
    )


def _ffn_hidden_size(params: dict) -> int | None:
    """Meta's feed-forward size rule: 2/3 of 4*dim, times ffn_dim_multiplier, rounded up to multiple_of."""
    if "multiple_of" not in params:
        return None
    hidden = int(2 * 4 * params["dim"] / 3)
    if params.get("ffn_dim_multiplier"):
        hidden = int(params["ffn_dim_multiplier"] * hidden)
    multiple_of = params["multiple_of"]
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def to_hf_state_dict(weights: dict[str, torch.Tensor], config, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Rename to `LlamaForCausalLM` keys, permute q/k, cast to `dtype`, and check every shape against `config`."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        expected = {k: v.shape for k, v in LlamaForCausalLM(config).state_dict().items()}
    head_dim = config.hidden_size // config.num_attention_heads
    state = {}
    for key in list(weights):
        tensor = weights.pop(key)  # drop our reference as we go: peak memory stays near one copy
        name = _hf_name(key)
        if name not in expected:
            raise UserError(
                f"Checkpoint tensor {key!r} has no place in a {config.num_hidden_layers}-layer model; "
                "the model config (params.json / config.json) does not match these weights."
            )
        if tuple(tensor.shape) != tuple(expected[name]):
            raise UserError(
                f"Checkpoint tensor {key!r} has shape {tuple(tensor.shape)} but the model config expects "
                f"{tuple(expected[name])}; the config (params.json / config.json / --llama_config) does not "
                "match these weights, or a shard is missing."
            )
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = _permute_for_hf_rotary(tensor, tensor.shape[0] // head_dim)
        elif name.endswith(("q_proj.bias", "k_proj.bias")):  # its rows follow the weight's
            tensor = _permute_for_hf_rotary(tensor[:, None], tensor.shape[0] // head_dim)[:, 0]
        state[name] = tensor.to(dtype)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise UserError(
            f"The checkpoint lacks {len(missing)} tensors the model config needs (first: {missing[0]}); "
            "the config says more layers than the weights hold, or a checkpoint file is missing."
        )
    return state
