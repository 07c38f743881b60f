"""The model the launchers' flags name: checked, spread over processes or GPUs as asked, loaded, and compiled before
the first answer. Imports torch and transformers only when it runs, like launchers/flags.py."""

from __future__ import annotations

import functools
import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from local_chat.defaults import DEFAULT_CONTEXT, DEMO_MODEL
from local_chat.errors import UserError

from .flags import api_keys, check_port_free, first_free_port, logins
from .settings import LaunchSettings

if TYPE_CHECKING:
    from local_chat.engine.llama_cpp import LlamaCppEngine
    from local_chat.engine.remote import RemoteEngine
    from local_chat.model.local_engine import LocalEngine


# flags that choose or load a local model, at anything but their defaults (nothing is loaded with --api_base)
MODEL_FLAGS = (
    "pretrained_path",
    "llama_type",
    "llama_config",
    "tokenizer_path",
    "dtype",
    "quant",
    "device",
    "compile",
    "no_cuda_graphs",
    "gpu_ids",
    "trust_remote_code",
    "lora",
    "merge_lora",
    "draft_model",
)


def check_serving_flags(args: LaunchSettings) -> LaunchSettings:
    """Refuse flags that cannot work, or are malformed, with one sentence each, before the model loads; the settings
    to go on with: with --models_dir, the checkpoints found listed, and the one --model picks chosen
    (`choose_listed_model`)."""
    check_engine_flags(args)
    if args.models_dir:
        args = choose_listed_model(args)
    if args.api_base is None and not args.models_dir and gguf_checkpoint(args) is not None:
        check_gguf_flags(args)
    elif args.api_base is None:
        check_adapters_and_draft(args, ranks=parallel_plan(args)[0])
    if args.auth is not None:
        logins(args.auth)
    if args.api_key is not None:
        api_keys(args.api_key)
    if args.concurrency is not None and args.concurrency < 1:
        raise UserError(f"--concurrency {args.concurrency}: give 1 or more.")
    if args.max_upload_mb <= 0:
        raise UserError(f"--max_upload_mb {args.max_upload_mb}: give a size above 0.")
    if args.mcp_config is not None:
        from local_chat.tools import read_config

        read_config(args.mcp_config)  # a malformed file is told now
    from local_chat.web import parse_provider

    parse_provider(args.web_search)  # an unknown provider, or one without its key, is told now
    for flag in ("embedding_model", "reranker"):
        folder = getattr(args, flag, None)
        if folder is not None and not os.path.exists(os.path.join(folder, "config.json")):
            raise UserError(f"--{flag} {folder} has no config.json; give a local transformers model's folder.")
    if args.tool_timeout <= 0 or args.max_tool_rounds < 1:
        raise UserError("--tool_timeout must be above 0 seconds and --max_tool_rounds 1 or more.")
    return args


def check_adapters_and_draft(args: LaunchSettings, ranks: int) -> None:
    """--lora's names, --merge_lora with one of them, and what they and --draft_model cannot go with yet (`ranks`:
    the processes or GPUs the model spreads over). (An adapter folder that does not fit is told once the model has
    loaded, and left out: model/adapters.py.)"""
    adapters = lora_adapters(args.lora)
    if args.merge_lora and len(adapters) != 1:
        raise UserError(
            f"--merge_lora folds one --lora adapter into the model; give one (--lora names {len(adapters)})."
        )
    if adapters and args.models_dir:
        raise UserError("--lora goes with --pretrained_path; with --models_dir, put the adapter folders in it.")
    for flag, given in (("--lora", adapters), ("--draft_model", args.draft_model)):
        if given and ranks > 1:
            raise UserError(f"{flag} works on one device for now; leave out --n_gpus (or --gpu_ids) or {flag}.")


# flags of a model loaded by transformers, which a GGUF file (llama.cpp's) cannot take, with why
NOT_FOR_GGUF = {
    "quant": "it is quantized already",
    "dtype": "its weights keep the file's type",
    "compile": "llama.cpp runs its own kernels",
    "lora": "PEFT adapters go over a Hugging Face folder",
    "merge_lora": "PEFT adapters go over a Hugging Face folder",
    "draft_model": "speculative decoding runs over a Hugging Face folder",
    "llama_type": "it is not an Accessory checkpoint",
    "llama_config": "it is not an Accessory checkpoint",
    "tokenizer_path": "its tokenizer is inside it",
    "trust_remote_code": "it runs no Python code",
}


def gguf_checkpoint(args: LaunchSettings) -> Path | None:
    """The GGUF file --pretrained_path names (model/gguf.py), or None."""
    from local_chat.model.gguf import gguf_file

    paths = checkpoint_paths(args)
    return gguf_file(paths[0]) if len(paths) == 1 else None


def check_gguf_flags(args: LaunchSettings) -> None:
    """A GGUF file with a flag that does not apply to it: one sentence, before anything loads."""
    given = [name for name in NOT_FOR_GGUF if getattr(args, name, None) not in (None, False, [], ())]
    given += ["n_gpus"] if args.n_gpus > 1 or args.gpu_ids else []
    if given:
        name = given[0]
        why = NOT_FOR_GGUF.get(name, "llama.cpp runs it in one process")
        raise UserError(f"--{name} does not apply to a GGUF file ({why}); leave it out.")


def lora_adapters(values: list[str] | None) -> dict[str, str]:
    """--lora's adapters, {name: folder}: NAME=DIR, or DIR named after its folder."""
    adapters: dict[str, str] = {}
    for value in values or ():
        name, _, folder = value.partition("=") if "=" in value else (Path(value).name, "", value)
        name = name.strip()
        if not name or not folder or "+" in name:
            raise UserError(f"--lora {value!r}: give NAME=DIR (a name without '+') or the adapter's folder.")
        if name in adapters:
            raise UserError(f"--lora names {name!r} twice; give each adapter a name of its own (NAME=DIR).")
        adapters[name] = folder
    return adapters


def check_before_the_server(args: LaunchSettings) -> LaunchSettings:
    """A browser launcher's flags told at once, before the web server's process starts (and long before the model
    loads): --port (free and a port number; where none is given, the first free one from the default, which the
    settings returned hold), and a --template that no model has (a model's own chat template is checked once it
    loads)."""
    from local_chat.prompting import checked_template
    from local_chat.templates.multi_turn import CHAT_TEMPLATE, template_names

    if args.port is not None:
        check_port_free(args.host, args.port)
    else:
        args = args.but(port=first_free_port(args.host))
    if args.template is not None:
        checked_template(args.template, [*template_names(), CHAT_TEMPLATE])
    return args


def choose_listed_model(args: LaunchSettings) -> LaunchSettings:
    """Print the checkpoints --models_dir holds (launchers/catalog.py) and start with the one --model names: the
    settings returned have its folder as --pretrained_path and its id as `served_name`, with all of them `listed`
    and --models_config's entries."""
    from local_chat.model.loading import resolve_device, resolve_dtype, resolve_quant

    from .catalog import find_models, free_memory, pick
    from .models_config import check_models_config, read_models_config

    device = resolve_device(args.device)
    load_bytes = resolve_dtype(args.dtype, device).itemsize
    settings = read_models_config(args.models_config)
    models = find_models(args.models_dir, load_bytes, resolve_quant(args.quant), free_memory(device.type), settings)
    check_models_config(settings, [model.id for model in models])
    check_gguf_settings(models, settings)
    print("Checkpoints found (--models_dir):", file=sys.stderr)
    for model in models:
        print(f"  {model.line()}", file=sys.stderr)
    chosen = pick(models, args.model)
    print(f"Starting with {chosen.id}; the others load when asked for.", file=sys.stderr)
    base = next((m for m in models if m.id == chosen.base), chosen)  # an adapter's: its base's folder
    return args.but(pretrained_path=(str(base.path),), served_name=chosen.id, listed=tuple(models),
                    model_settings=settings)  # fmt: skip


def check_gguf_settings(models: list, settings: dict[str, dict]) -> None:
    """A GGUF model's --models_config entry with a flag that does not apply to it: one sentence at start-up (the
    command line's flags are every model's defaults, and a GGUF file leaves those of transformers' models alone)."""
    from local_chat.model.gguf import gguf_file

    from .models_config import model_flags

    for model in models:
        if model.id in settings and gguf_file(model.path) is not None:
            try:
                check_gguf_flags(model_flags(LaunchSettings(), settings[model.id], model.id))
            except UserError as error:
                raise UserError(f"--models_config: {model.id}: {error}") from error


def check_engine_flags(args: LaunchSettings) -> None:
    """--api_base goes with --api_base_key, --model and --vision, and with no flag of a local model; --models_dir
    with --model, and with neither --api_base nor --pretrained_path."""
    if args.models_dir:
        if args.api_base is not None:
            raise UserError("--models_dir lists local checkpoints, and --api_base uses an engine's model: give one.")
        if args.pretrained_path is not None:
            raise UserError("--models_dir and --pretrained_path both name the checkpoint: pick it with --model ID.")
        if args.admins and not args.auth:
            raise UserError("--admins names logins of --auth: add --auth USER:PASSWORD (or a file of them).")
        unknown = [name for name in args.admins or () if name not in {user for user, _ in logins(args.auth)}]
        if unknown:
            raise UserError(f"--admins {unknown[0]!r} is not a login of --auth; name logins it has.")
        if args.max_loaded_models < 1:
            raise UserError(f"--max_loaded_models {args.max_loaded_models}: give 1 or more.")
        if args.idle_unload is not None and args.idle_unload <= 0:
            raise UserError(f"--idle_unload {args.idle_unload:g}: give the minutes, above 0.")
    elif args.max_loaded_models != 1 or args.idle_unload is not None or args.models_config is not None or args.admins:
        raise UserError(
            "--max_loaded_models, --idle_unload, --models_config and --admins go with --models_dir (the models loaded "
            "on demand)."
        )
    if args.api_base is None:
        alone = [f"--{name}" for name in ("api_base_key", "vision") if getattr(args, name)]
        alone += ["--model"] if args.model and not args.models_dir else []
        if alone:
            raise UserError(
                f"{' and '.join(alone)} {'go' if len(alone) > 1 else 'goes'} with --api_base URL (an engine's "
                "model); a local model is chosen with --pretrained_path (or --models_dir and --model)."
            )
        return
    if not args.api_base.startswith(("http://", "https://")):
        raise UserError(f"--api_base {args.api_base!r} is not a URL; give the engine's, like http://127.0.0.1:8000/v1.")
    local = [f"--{name}" for name in MODEL_FLAGS if getattr(args, name, None) not in (None, False)]
    local += ["--n_gpus"] if args.n_gpus != 1 else []
    local += ["--parallel"] if args.parallel != "tensor" else []
    if local:
        raise UserError(
            f"--api_base uses the engine's model, so {', '.join(local)} cannot apply: load the model in the engine "
            "(its own flags), or leave --api_base out to load it here."
        )
    if args.api_base_key is not None:
        api_keys(args.api_base_key)


def connect_engine(args: LaunchSettings, with_visual: bool = False):
    """The `RemoteEngine` of --api_base (engine/remote.py), its model chosen and checked."""
    from local_chat.engine.remote import RemoteEngine

    if with_visual and not args.vision:
        raise UserError(
            "This demo asks about images: add --vision if the engine's model sees them (its model list does not say)."
        )
    key = api_keys(args.api_base_key)[0] if args.api_base_key else None
    engine = RemoteEngine(args.api_base, key, args.model, sees_images=args.vision, context=args.max_seq_len)
    print(
        f"Engine: {engine.url}, model {engine.model}, context "
        f"{engine.max_seq_len if engine.context_known else 'not said (the engine refuses what does not fit)'}"
        f"{', prompts counted with its /tokenize' if engine.counts_with_tokenize else ''}.",
        file=sys.stderr,
        flush=True,
    )
    return engine


def parallel_plan(args: LaunchSettings) -> tuple[int, str, str]:
    """(ranks, mode, device): how many processes or GPUs the model spreads over, "tensor" or "pipeline", and
    "cuda" or "cpu"."""
    import torch

    from local_chat.model.parallel import torchrun_world

    world = torchrun_world()
    size = world or (len(args.gpu_ids) if args.gpu_ids else args.n_gpus)
    if size < 1:
        raise UserError(f"--n_gpus {size}: give at least 1.")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if size == 1 or world:
        return size, "tensor", device
    if args.device is None and device == "cpu":
        raise UserError(
            f"--n_gpus {size} was asked for but no GPU is visible; add --device cpu to run {size} "
            "CPU processes instead."
        )
    if device == "cuda":
        visible = torch.cuda.device_count()
        wanted = args.gpu_ids or list(range(size))
        if max(wanted) >= visible:
            raise UserError(
                f"{size} GPUs were asked for ({', '.join(map(str, wanted))}) but {visible} "
                f"{'is' if visible == 1 else 'are'} visible; lower --n_gpus or fix --gpu_ids."
            )
    if args.parallel == "pipeline" and device != "cuda":
        raise UserError(
            "--parallel pipeline spreads layers over GPUs; on the CPU use tensor parallel "
            "(--n_gpus N --device cpu runs N processes)."
        )
    if args.parallel == "tensor" and (kind := unsplittable(args)):
        if device != "cuda":
            raise UserError(
                f"This {kind} model cannot be split over processes (transformers has no tensor-parallel "
                "plan for it); run it in one process, or on GPUs, where pipeline mode runs it."
            )
        return size, "pipeline", device  # load_engine says so
    return size, args.parallel, device


def unsplittable(args: LaunchSettings) -> str | None:
    """The model type of the checkpoint the flags name, when tensor parallel cannot split it."""
    from local_chat.model.loading import unsplittable_model_type

    return unsplittable_model_type(checkpoint_paths(args), args.trust_remote_code)


def checkpoint_paths(args: LaunchSettings) -> list[str]:
    """--pretrained_path (a --config file may give one path as a plain string), else the built-in demo model."""
    if args.pretrained_path is None:
        if not (DEMO_MODEL / "config.json").exists():
            raise UserError(
                f"The built-in demo model is missing from {DEMO_MODEL}; build it with "
                "`python -m demo_model`, or pass --pretrained_path."
            )
        return [str(DEMO_MODEL)]
    return [args.pretrained_path] if isinstance(args.pretrained_path, str) else list(args.pretrained_path)


def load_engine(args: LaunchSettings, with_visual: bool = False) -> LocalEngine | RemoteEngine:
    """The engine of the model the flags name: a `LocalEngine` (the built-in demo model when no --pretrained_path is
    given) on one device or spread as --n_gpus, --gpu_ids and --parallel say (see model/parallel.py for the process
    layout). `with_visual`: refuse a text-only model (the image demos); a vision model loads with its vision tower
    either way. With --api_base, no model loads: the engine's is used (`connect_engine`)."""
    if args.api_base is not None:
        return connect_engine(args, with_visual)
    if (gguf := gguf_checkpoint(args)) is not None:
        return load_gguf(gguf, args, with_visual)
    from local_chat.model.parallel import start_ranks, torchrun_world

    size, mode, device = parallel_plan(args)
    if args.gpu_ids:  # before CUDA starts here or in a worker: rank r then uses the r-th listed GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, args.gpu_ids))
    if device == "cpu" and size > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # transformers places tensor-parallel shards on any visible GPU
    if size == 1 and not torchrun_world():
        return load_shard(args, with_visual, None)
    if mode == "pipeline":
        why = "" if args.parallel == "pipeline" else " (chosen for you: tensor parallel cannot split this model)"
        print(f"Parallel mode: pipeline, the layers spread over {size} GPUs{why}.", file=sys.stderr)
        return load_shard(args, with_visual, None, device="auto")
    if os.environ.get("RANK", "0") == "0":  # under torchrun, once
        print(
            f"Parallel mode: tensor parallel over {size} {'GPUs' if device == 'cuda' else 'CPU processes'}.",
            file=sys.stderr,
        )
    return start_ranks(
        size,
        device,
        functools.partial(load_shard, args, with_visual),
        args.master_addr,
        args.master_port or free_port(),
    )


GGUF_SLOTS = 4  # answers at a time over a GGUF file where --concurrency is not given (llama.cpp's default)


def load_gguf(path: Path, args: LaunchSettings, with_visual: bool) -> LlamaCppEngine:
    """The engine of a GGUF file (engine/llama_cpp.py): llama.cpp's server in this process, with --concurrency slots
    of --max_seq_len tokens each."""
    from local_chat.engine.llama_cpp import LlamaCppEngine
    from local_chat.model.gguf import read_gguf

    model = read_gguf(path)
    if with_visual and model.mmproj is None:
        raise UserError(
            f"{path.name} has no image projector beside it (an mmproj*.gguf in its folder), so it cannot see images; "
            "put the model's mmproj file there, or use app.py for text."
        )
    slots = args.concurrency or GGUF_SLOTS
    engine = LlamaCppEngine(model, args.max_seq_len or DEFAULT_CONTEXT, slots, len(os.sched_getaffinity(0)))
    print(f"llama.cpp serves {path.name} ({model.architecture}, {model.described}).", file=sys.stderr, flush=True)
    return engine


def load_shard(
    args: LaunchSettings, with_visual: bool, mp_group, device: str | None = None, followers=None
) -> LocalEngine:
    """This process's model's engine: the model whole, or its share of each layer within `mp_group` (`followers`:
    rank 0's, see model/parallel.py)."""
    from local_chat.model.meta import MetaModel
    from local_chat.model.prefix_cache import PrefixCaches

    paths = checkpoint_paths(args)
    max_cache_mb = args.max_cache_mb  # the browser launchers' flags
    engine = MetaModel.from_pretrained(
        paths if len(paths) > 1 else paths[0],
        llama_type=args.llama_type,
        llama_config=args.llama_config,
        tokenizer_path=args.tokenizer_path,
        with_visual=with_visual,
        max_seq_len=args.max_seq_len or DEFAULT_CONTEXT,
        dtype=args.dtype,
        device=device or args.device,
        quant=args.quant,
        compile=args.compile,
        cuda_graphs=not args.no_cuda_graphs,
        mp_group=mp_group,
        trust_remote_code=args.trust_remote_code,
        lora=lora_adapters(args.lora),
        merge_lora=args.merge_lora,
        speculative=args.speculative,
        draft_model=args.draft_model,
        prefix_caches=PrefixCaches(
            args.max_cached_sessions,
            None if max_cache_mb is None else int(max_cache_mb * 2**20),
        ),
        followers=followers,
    ).engine
    tell_adapters(engine.summary())
    return engine


def tell_adapters(summary) -> None:
    """--lora: the terminal names the models the adapters are chosen as ("BASE + NAME"), or the merged one."""
    from local_chat.engine.interface import checkpoint_name

    if summary.adapter:
        print(f"LoRA adapter merged into the weights: serving {checkpoint_name(summary)}.", file=sys.stderr)
    elif summary.adapters:
        named = [checkpoint_name(replace(summary, adapter=name)) for name in summary.adapters]
        print(f"LoRA adapters: {', '.join(named)} (each chosen as a model).", file=sys.stderr)
    for name, why in summary.adapter_problems:
        print(f"warning: {why} It is left out; the others are served.", file=sys.stderr)


def compile_before_answering(engine: LocalEngine, batch_sizes: Iterable[int] = (1,)) -> None:
    """--compile: compile the decode step for the batch sizes to come now, not in the middle of the first answer.
    Call it once the model's threads are set: torch compiles again for another thread count."""
    if engine.compiled is None:
        return
    print(
        "Compiling the decode step for --compile (minutes for a large model on a GPU the first time)...",
        file=sys.stderr,
        flush=True,
    )
    print(f"Compiled the decode step in {engine.compile_decoding(batch_sizes):.0f} s.", file=sys.stderr, flush=True)


BATCH_PLACES = 8  # answers at a time where --concurrency is not given and the model can batch them
ENGINE_PLACES = 64  # answers at a time with --api_base where --concurrency is not given: the engine batches them


def start_batching(engine: LocalEngine | LlamaCppEngine, args: LaunchSettings) -> LaunchSettings:
    """Batch the answers that run at the same time where the model allows it (model/batching.py); the settings
    with --concurrency settled: as given, else 8 with batching and 1 without (a GGUF file's: llama.cpp's slots).
    The terminal says which."""
    from local_chat.engine.llama_cpp import LlamaCppEngine

    slots = engine.slots if isinstance(engine, LlamaCppEngine) else None
    places = args.concurrency or slots or BATCH_PLACES
    cache_bytes = None if args.max_cache_mb is None else int(args.max_cache_mb * 2**20)
    print("Batching: " + engine.start_batching(places, cache_bytes) + ".", file=sys.stderr, flush=True)
    if args.concurrency is not None:
        return args
    return args.but(concurrency=places if engine.batcher is not None or slots else 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
