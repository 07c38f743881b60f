"""The launch settings: every launcher's flags, parsed once into one frozen record (`LaunchSettings`, which
launchers/flags.py's `FlagParser.parse_args` makes), then what start-up settles beside them: the port found free, the
model --models_dir starts with, --concurrency once the model says how many answers it batches. Nothing changes a record:
a settled value makes a new one (`but`), which the steps after it are given."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from local_chat.defaults import (
    IMAGE_TRANSFORM,
    MAX_CACHED_SESSIONS,
    MAX_TOOL_ROUNDS,
    MAX_UPLOAD_MB,
    TOOL_TIMEOUT_S,
    WEB_SEARCH,
)


@dataclass(frozen=True)
class LaunchSettings:
    """The flags of the browser launchers (app.py, demos/*.py) and of the command line (demos/generate.py): a field a
    launcher has no flag for stays at its default here. Lists come as tuples."""

    # the model (launchers/flags.py's add_model_flags, every launcher)
    pretrained_path: tuple[str, ...] | None = None
    llama_type: str | None = None
    llama_config: tuple[str, ...] | None = None
    tokenizer_path: str | None = None
    max_seq_len: int | None = None
    dtype: str | None = None
    quant: int | None = None
    device: str | None = None
    compile: bool = False
    no_cuda_graphs: bool = False
    n_gpus: int = 1
    gpu_ids: tuple[int, ...] | None = None
    parallel: str = "tensor"
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    api_base: str | None = None
    api_base_key: str | None = None
    model: str | None = None
    models_dir: tuple[str, ...] | None = None
    models_config: str | None = None
    admins: tuple[str, ...] | None = None
    max_loaded_models: int = 1
    idle_unload: float | None = None
    vision: bool = False
    trust_remote_code: bool = False
    lora: tuple[str, ...] | None = None
    merge_lora: bool = False
    speculative: str = "ngram"
    draft_model: str | None = None
    template: str | None = None
    # serving (the browser launchers)
    image_transform: str = IMAGE_TRANSFORM
    host: str = "127.0.0.1"
    port: int | None = None
    share: bool = False
    auth: str | None = None
    api_key: str | None = None
    max_upload_mb: float = MAX_UPLOAD_MB
    history_db: str | None = None
    no_history: bool = False
    concurrency: int | None = None
    max_cached_sessions: int = MAX_CACHED_SESSIONS
    max_cache_mb: float | None = None
    mcp_config: str | None = None
    tool_timeout: float = TOOL_TIMEOUT_S
    max_tool_rounds: int = MAX_TOOL_ROUNDS
    web_search: str = WEB_SEARCH
    web_allow_private: bool = False
    embedding_model: str | None = None
    reranker: str | None = None
    stt_model: str | None = None
    tts_model: str | None = None
    # the command line (demos/generate.py)
    prompts: tuple[str, ...] | None = None
    data: Path | None = None
    limit: int | None = None
    system: str | None = None
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 0.95
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    batch_size: int = 1
    json_schema: Path | None = None
    tools: Path | None = None
    adapter: str | None = None
    output: Path | None = None
    config: Path | None = None
    # settled at start-up, not flags
    served_name: str | None = None  # the model's name on /v1: --models_dir's chosen id, an engine's model
    listed: tuple = ()  # --models_dir: the checkpoints found (launchers/catalog.py)
    model_settings: dict = field(default_factory=dict)  # --models_config: each model's entry
    model_entry: dict = field(default_factory=dict)  # a --models_dir model's own process: its entry

    @classmethod
    def from_flags(cls, namespace: argparse.Namespace) -> LaunchSettings:
        """The record of argparse's `namespace`: a flag without a field is a mistake of the code, told at once."""
        given = vars(namespace)
        unknown = sorted(set(given) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"flags without a field in LaunchSettings: {', '.join(unknown)}")
        return cls(**{name: tuple(value) if isinstance(value, list) else value for name, value in given.items()})

    def flags(self) -> argparse.Namespace:
        """The record as argparse's namespace, for a parser that reads more flags over it (--models_config)."""
        return argparse.Namespace(**vars(self))

    def but(self, **settled) -> LaunchSettings:
        """A new record, with `settled` in place of this one's values."""
        return replace(self, **settled)
