"""Everything `MetaModel.from_pretrained` does before there is a model: paths, formats, dtype, device, --quant."""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from local_chat.defaults import DEFAULT_CONTEXT
from local_chat.errors import UserError

from . import checkpoint as ckpt
from . import vision_stem  # noqa: F401  (registers the demo model's vision tower with transformers)
from .cpu_linear import native_bf16
from .processors import load_processor, missing_package_error, text_tokenizer
from .tokenizer import HFTokenizer, Tokenizer, has_hf_tokenizer, load_tokenizer

DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
# Modules that stay in full precision under --quant: the output layer and a vision model's image side,
# wherever they sit (transformers matches these patterns from the start of a module's full name).
QUANT_SKIP_MODULES = ["lm_head"] + [
    rf".*\b{name}" for name in ("vision_tower", "multi_modal_projector", "vision_model", "visual", "mm_projector")
]
# bitsandbytes logs a notice about an optional kernel package at import, and a cast warning on every
# 8-bit layer call with fp32 inputs; neither is actionable for a chat user.
_NOISY_BNB_LOGGERS = ("bitsandbytes.backends.cpu.ops", "bitsandbytes.autograd._functions")


@dataclass
class Loaded:
    """What a loader hands to `MetaModel`."""

    model: Any
    tokenizer: Tokenizer
    processor: Any
    max_seq_len: int
    info: dict = field(default_factory=dict)
    cpu_kernels: bool = False  # whether its linear layers are to be swapped for the CPU's (model/cpu_linear.py)
    bits: int | None = None  # --quant's


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu.")
    return device


DTYPE_VARIABLE = "LOCAL_CHAT_DTYPE"  # the environment's default --dtype (the tests pin fp32 with it)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """--dtype as given, else `default_dtype`."""
    if dtype is None:
        dtype = os.environ.get(DTYPE_VARIABLE) or default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise UserError(f"Unknown dtype {dtype!r}; choose one of fp16, bf16, fp32.")
    return DTYPES[dtype]


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on a GPU and on a CPU that computes bf16 natively (AMX, AVX512-BF16): half the bytes of fp32 to read at
    every step. fp32 on other CPUs, which emulate bf16 slower than they compute fp32."""
    return torch.bfloat16 if device.type == "cuda" or native_bf16() else torch.float32


def dtype_shown(asked, device: torch.device, dtype: torch.dtype) -> str:
    """The dtype as the model line shows it, with why where the CPU's default chose it."""
    name = str(dtype).removeprefix("torch.")
    if asked is not None or os.environ.get(DTYPE_VARIABLE) or device.type != "cpu":
        return name
    native = native_bf16()
    return f"{name} (this CPU computes bf16 with {native})" if native else f"{name} (this CPU has no native bf16)"


def resolve_quant(quant) -> int | None:
    """None for no quantization, else 4 or 8 bits (True, like a bare --quant, means 4)."""
    if quant is None or quant is False:
        return None
    if quant is True:
        return 4
    if str(quant) in ("4", "8"):
        return int(quant)
    raise UserError(f"--quant takes 4 or 8 (bits), not {quant!r}.")


for _name in _NOISY_BNB_LOGGERS:  # before anything imports bitsandbytes
    logging.getLogger(_name).setLevel(logging.ERROR)


def _import_bitsandbytes() -> None:
    try:
        import bitsandbytes  # noqa: F401
    except Exception as exc:
        raise UserError(
            f"--quant needs bitsandbytes, which cannot run here ({type(exc).__name__}: {exc}); "
            "install it with pip install 'bitsandbytes>=0.50' or drop --quant."
        )


def quantization_config(bits: int | None, compute_dtype: torch.dtype):
    """transformers' `BitsAndBytesConfig`: NF4 with double quantization for 4 bits, LLM.int8 for 8."""
    if bits is None:
        return None
    _import_bitsandbytes()
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=bits == 4,
        load_in_8bit=bits == 8,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
        llm_int8_skip_modules=QUANT_SKIP_MODULES,
    )


def as_paths(pretrained_path: str | Path | Sequence[str | Path]) -> list[Path]:
    if isinstance(pretrained_path, (str, Path)):
        return [Path(pretrained_path)]
    paths = [Path(p) for p in pretrained_path]
    if not paths:
        raise UserError("No checkpoint path given; pass --pretrained_path.")
    return paths


def load(
    pretrained_path,
    *,
    llama_type=None,
    llama_config=None,
    tokenizer_path=None,
    with_visual=False,
    max_seq_len=DEFAULT_CONTEXT,
    mp_group=None,
    dtype=None,
    device=None,
    quant=None,
    trust_remote_code=False,
    cpu_kernels=True,
) -> Loaded:
    """Find the format of `pretrained_path` and load model, tokenizer and (for vision models) processor. On the CPU
    in one process, with `cpu_kernels`, --quant is left to model/cpu_linear.py (`Loaded.cpu_kernels`), else it is
    bitsandbytes'."""
    folders = as_paths(pretrained_path)
    formats = [ckpt.detect_format(folder) for folder in folders]
    pipeline = device == "auto"  # layers spread over every visible GPU by accelerate (--parallel pipeline)
    asked_dtype = dtype
    device = resolve_device("cuda" if pipeline else device)
    dtype = resolve_dtype(dtype, device)
    bits = resolve_quant(quant)
    tp_size = tensor_parallel_size(mp_group, bits)
    cpu_kernels = cpu_kernels and device.type == "cpu" and tp_size == 1
    common = dict(
        dtype=dtype,
        device="auto" if pipeline else device,
        bits=None if cpu_kernels else bits,
        max_seq_len=max_seq_len,
        tokenizer_path=tokenizer_path,
        tp_size=tp_size,
    )
    if "hf" in formats:
        if len(folders) > 1:
            raise UserError(
                "Several --pretrained_path folders are merged only for Accessory/Meta checkpoints; "
                f"pass the Hugging Face folder {folders[formats.index('hf')]} alone."
            )
        loaded = _load_hf(folders[0], with_visual=with_visual, trust_remote_code=bool(trust_remote_code), **common)
    else:
        loaded = _load_consolidated(
            folders, formats, llama_type=llama_type, llama_config=llama_config, with_visual=with_visual, **common
        )
    loaded.cpu_kernels, loaded.bits = cpu_kernels, bits
    loaded.info.update(
        path=", ".join(str(f) for f in folders),
        dtype=dtype_shown(asked_dtype, device, dtype),
        device=str(device)
        + (f" x {tp_size} ranks (tensor parallel)" if tp_size > 1 else "")
        + (f" x {torch.cuda.device_count()} GPUs (pipeline)" if pipeline else ""),
        quant=f"{bits}-bit" if bits else "none",
    )
    return loaded


def tensor_parallel_size(mp_group, bits: int | None) -> int:
    """How many ranks share each layer: the size of `mp_group` (which must hold every rank), or 1."""
    if mp_group is None:
        return 1
    import torch.distributed as dist

    size = dist.get_world_size(mp_group)
    if size > 1 and size != dist.get_world_size():
        raise UserError(
            f"mp_group holds {size} of the {dist.get_world_size()} ranks; tensor parallelism here "
            "spans every rank: pass a group of all ranks (dist.new_group(ranks=list(range(world)))."
        )
    if size > 1 and bits:
        raise UserError(
            "--quant cannot be combined with tensor parallel (bitsandbytes weights are not split "
            "over ranks); use --parallel pipeline to spread a quantized model over GPUs, or one GPU."
        )
    return size


def placement(device: torch.device | str, tp_size: int) -> dict:
    """from_pretrained's placement arguments: the whole model on `device`, its layers over every visible GPU
    ("auto": accelerate's device map), or 1/N of each layer on each rank (tensor parallel)."""
    if device == "auto":
        return {"device_map": "auto"}
    if tp_size == 1:
        return {"device_map": {"": device}}
    from transformers.distributed import DistributedConfig

    return {"distributed_config": DistributedConfig(tp_size=tp_size)}


def has_tensor_parallel_plan(config) -> bool:
    """Whether transformers knows how to split this architecture over ranks (Llama, Mistral, Qwen2, LLaVA's
    language model... yes; GPT-2, OPT, Falcon, Bloom... no)."""
    return bool(getattr(config.get_text_config(), "base_model_tp_plan", None))


def unsplittable_model_type(pretrained_path, trust_remote_code: bool = False) -> str | None:
    """The model type of a Hugging Face checkpoint that tensor parallel cannot split, else None (Accessory and
    Meta checkpoints are Llamas: they split)."""
    folders = as_paths(pretrained_path)
    if len(folders) != 1 or ckpt.detect_format(folders[0]) != "hf":
        return None
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folders[0], trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        raise _hf_error(folders[0], exc)
    return None if has_tensor_parallel_plan(config) else config.model_type


def check_heads_divide(config, tp_size: int) -> None:
    text = config.get_text_config()
    heads, kv_heads = text.num_attention_heads, getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    if heads % tp_size or kv_heads % tp_size:
        raise UserError(
            f"This model has {heads} attention heads ({kv_heads} key/value heads), which do not divide "
            f"over {tp_size} ranks; choose --n_gpus that divides both, or --parallel pipeline."
        )


def _hf_error(folder: Path, exc: Exception) -> UserError:
    if "trust_remote_code" in str(exc):
        return UserError(
            f"{folder} ships its own Python code (auto_map in its config), which runs only with "
            "--trust_remote_code (trust_remote_code=True); add it only if you trust the checkpoint's "
            "authors."
        )
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(f"Cannot load the Hugging Face model in {folder}: {first_line}")


def _load_hf(
    folder: Path, *, with_visual, dtype, device, bits, max_seq_len, tokenizer_path, tp_size, trust_remote_code
) -> Loaded:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForMultimodalLM

    # Always an explicit True or False: left at None, transformers asks on the terminal whether to run the code.
    remote = dict(trust_remote_code=trust_remote_code)
    try:
        config = AutoConfig.from_pretrained(folder, **remote)
    except (OSError, ValueError, KeyError) as exc:
        raise _hf_error(folder, exc)
    speaks = hasattr(config, "thinker_config")  # Qwen2.5-Omni's: its thinker writes the text, its talker speaks it
    parts = config.thinker_config if speaks else config
    sees_images = hasattr(parts, "vision_config")
    if with_visual and not sees_images:
        raise UserError(
            f"{folder} holds a text-only model ({config.model_type}), but a vision model was asked for; "
            "use a LLaVA-style folder for image chat, or a text launcher for this model."
        )
    hears = hasattr(parts, "audio_config")  # Qwen2-Audio's, and the other models that take sound clips
    model_class = (
        AutoModelForMultimodalLM if hears else AutoModelForImageTextToText if sees_images else AutoModelForCausalLM
    )
    if tp_size > 1 and not has_tensor_parallel_plan(config):
        raise UserError(
            f"{folder} holds a {config.model_type} model, which transformers cannot split over ranks "
            "(it has no tensor-parallel plan); spread its layers over GPUs instead with --parallel "
            "pipeline (device='auto'), or run it in one process."
        )
    check_heads_divide(config, tp_size)
    try:
        # The processor first: one that cannot load says so before the weights are read. PIL image processors: our
        # transforms are PIL too, and torchvision is not a dependency (its wheel on PyPI does not load beside the CPU
        # build of torch; image processors that need it, Llama 4's, say so in a sentence).
        processor = load_processor(folder, config, remote) if sees_images or hears else None
        model = model_class.from_pretrained(
            folder,
            dtype=dtype,
            quantization_config=quantization_config(bits, dtype),
            **placement(device, tp_size),
            **remote,
            **({"enable_audio_output": False} if speaks else {}),  # the talker is not loaded: answers are text
        )
        model = model.thinker if speaks else model
        if processor is not None and tokenizer_path is None:
            tokenizer = HFTokenizer(text_tokenizer(processor))
        else:
            tokenizer = load_tokenizer(tokenizer_path or folder, trust_remote_code=trust_remote_code)
    except UserError:  # --quant without bitsandbytes, say: already a sentence
        raise
    except pickle.UnpicklingError:  # transformers reads .bin weights with weights_only=True
        raise ckpt.pickled_objects_error(next(folder.glob("pytorch_model*.bin"), folder))
    except ImportError as exc:  # a processor needs an optional package (torchvision for Llama 4's, say)
        raise missing_package_error(folder, config.model_type, exc)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise _hf_error(folder, exc)
    position_limit = getattr(config.get_text_config(), "max_position_embeddings", None) or max_seq_len
    model.eval()
    return Loaded(
        model,
        tokenizer,
        processor,
        min(max_seq_len, position_limit),
        {"format": "Hugging Face", "architecture": type(model).__name__},
    )


def _find_tokenizer(folders: list[Path]) -> Path:
    """The last folder (or its parent, where Meta's downloads keep it) that holds a tokenizer."""
    for folder in reversed(folders):
        for candidate in (folder, folder.parent):
            if (candidate / "tokenizer.model").is_file() or has_hf_tokenizer(candidate):
                return candidate
    raise UserError(
        f"No tokenizer found in {folders[-1]} (looked for tokenizer.model and tokenizer.json); pass --tokenizer_path."
    )


def _load_consolidated(
    folders,
    formats,
    *,
    llama_type,
    llama_config,
    with_visual,
    dtype,
    device,
    bits,
    max_seq_len,
    tokenizer_path,
    tp_size,
) -> Loaded:
    from transformers import LlamaForCausalLM

    if with_visual:
        raise UserError(
            f"{folders[-1]} is a text-only Accessory/Meta checkpoint, but a vision model was asked for; "
            "image chat needs a Hugging Face LLaVA-style folder."
        )
    llama_type = llama_type or ckpt.find_llama_type(folders, formats)
    ckpt.check_llama_type(llama_type)
    config_files = [Path(p) for p in ([llama_config] if isinstance(llama_config, (str, Path)) else llama_config or [])]
    config_files = config_files or ckpt.find_model_config(folders)
    if not config_files:
        raise UserError(
            f"{folders[-1]} has no config.json or params.json; pass --llama_config with the model's params."
        )
    params = ckpt.merged_params(config_files)
    tokenizer = load_tokenizer(tokenizer_path or _find_tokenizer(folders), always_bos=True)
    weights = ckpt.load_consolidated_weights(formats)
    biased = ckpt.fold_peft(weights, params) if llama_type == "llama_peft" else False
    config = ckpt.llama_config_from_params(params, weights, max_seq_len, tokenizer, biased)
    check_heads_divide(config, tp_size)
    state = ckpt.to_hf_state_dict(weights, config, dtype)
    model = LlamaForCausalLM.from_pretrained(
        None,
        config=config,
        state_dict=state,
        dtype=dtype,
        quantization_config=quantization_config(bits, dtype),
        **placement(device, tp_size),
    )
    del state
    model.eval()
    kind = "LLaMA2-Accessory" if formats[-1].kind == "accessory" else "Meta"
    shards = sum(len(f.shards) for f in formats)
    return Loaded(
        model,
        tokenizer,
        None,
        max_seq_len,
        {"format": f"{kind} ({shards} shard{'s' if shards > 1 else ''})", "architecture": llama_type},
    )
