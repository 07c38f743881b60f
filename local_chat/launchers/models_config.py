"""--models_config FILE: per-model settings for --models_dir, one YAML file. Its top-level keys are model ids; each
holds flag names without their dashes (and the model's default system prompt and sampling), the command line's
flags being the defaults:

    qwen3-0.6b:
      dtype: bfloat16
      quant: 4
      temperature: 0.6
      system: You are a terse assistant.
    llama-2-7b-accessory:       # an Accessory checkpoint without a meta.json: what it lacks, given here
      llama_type: llama
      llama_config: [/models/llama-2-7b-accessory/params.json]
      tokenizer_path: /models/tokenizer.model

An unknown id, an unknown key or a bad value is one sentence at start-up."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

from local_chat.engine.interface import Sampling
from local_chat.errors import UserError

from .settings import LaunchSettings

# the flags that are a model's own (loading, context, template, its answers at once)
MODEL_KEYS = (
    "template",
    "image_transform",
    "llama_type",
    "llama_config",
    "tokenizer_path",
    "max_seq_len",
    "dtype",
    "quant",
    "device",
    "compile",
    "no_cuda_graphs",
    "n_gpus",
    "gpu_ids",
    "parallel",
    "trust_remote_code",
    "concurrency",
    "max_cached_sessions",
    "max_cache_mb",
)
SAMPLING_KEYS = tuple(f.name for f in fields(Sampling) if f.name != "seed")
OTHER_KEYS = ("system",)


def read_models_config(path: str | None) -> dict[str, dict]:
    """The settings of --models_config by model id (nothing without one); `check_models_config` checks them."""
    if path is None:
        return {}
    import yaml

    try:
        settings = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as error:
        raise UserError(f"--models_config {path} cannot be read ({error.strerror or error}); give a YAML file.")
    except yaml.YAMLError as error:
        raise UserError(f"--models_config {path} is not valid YAML ({str(error).splitlines()[0]}); fix it.")
    if not isinstance(settings, dict) or not all(isinstance(v, dict) for v in settings.values()):
        raise UserError(f"--models_config {path}: give model ids as top-level keys, each with its settings under it.")
    return settings


def check_models_config(settings: dict[str, dict], model_ids: list[str]) -> None:
    """The ids among `model_ids`, the keys known, the values of the right kind (flags as the command line reads
    them): else one sentence."""
    known = (*MODEL_KEYS, *SAMPLING_KEYS, *OTHER_KEYS)
    for model_id, entry in settings.items():
        if model_id not in model_ids:
            raise UserError(
                f"--models_config: there is no model {model_id!r} in --models_dir (the ids are {', '.join(model_ids)})."
            )
        unknown = [key for key in entry if key not in known]
        if unknown:
            raise UserError(
                f"--models_config: {model_id}: {unknown[0]!r} is not a per-model setting; use {', '.join(known)}."
            )
        model_flags(LaunchSettings(), entry, model_id)  # bad values: now, not when the model loads
        sampling_of(Sampling(), entry, model_id)
        if not isinstance(entry.get("system", ""), str):
            raise UserError(f"--models_config: {model_id}: system is {entry['system']!r}; give the prompt's text.")


def model_flags(args: LaunchSettings, entry: dict, model_id: str) -> LaunchSettings:
    """`args` with the flags of a model's entry in place of the command line's."""
    from .flags import parser

    tokens = []
    for key, value in entry.items():
        if key not in MODEL_KEYS:
            continue
        if isinstance(value, bool):
            tokens += [f"--{key}"] if value else []
        elif isinstance(value, list):
            tokens += [f"--{key}", *map(str, value)]
        else:
            tokens += [f"--{key}", str(value)]
    flags = parser("--models_config")

    def refuse(message: str):
        raise UserError(f"--models_config: {model_id}: {message}.")

    flags.error = refuse
    given = flags.parse_args(tokens, namespace=args)
    off = {key: False for key, value in entry.items() if value is False and key in MODEL_KEYS}
    return given.but(**off)  # a switch the command line turned on, off for this model


def sampling_of(defaults: Sampling, entry: dict, model_id: str) -> Sampling:
    """A model's answers' defaults: its generation config's, with its entry's sampling keys in their place."""
    given = {key: entry[key] for key in SAMPLING_KEYS if key in entry}
    for key, value in given.items():
        kind = type(getattr(Sampling(), key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise UserError(
                f"--models_config: {model_id}: {key} is {value!r}; give a number{' (whole)' * (kind is int)}."
            )
        given[key] = kind(value)
    try:
        return replace(defaults, **given)
    except UserError as error:
        raise UserError(f"--models_config: {model_id}: {error}") from None
