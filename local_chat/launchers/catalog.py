"""--models_dir: the checkpoints found in folders, listed before anything loads. Each has an id (its folder's name;
`org/name` for a snapshot of the Hugging Face cache; `@2`, `@3` for a name seen again), its family, its size on
disk, whether it sees images and whether it fits the free memory in the dtype (or quantization) it would load in.
The checks are static (weights present, config readable, architecture known): a checkpoint that fails them is listed
with its one sentence, and the others still work. `--model ID` picks the one the app starts with. A PEFT LoRA
adapter's folder (adapter_config.json) is listed as "BASE + NAME" where its config's base_model_name_or_path names a
listed checkpoint (its path, its id, or the last part of a hub id), and with its sentence where none is."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from local_chat.defaults import DEFAULT_CONTEXT
from local_chat.errors import UserError
from local_chat.model.checkpoint import ACCESSORY_SHARD, HF_WEIGHT_PATTERNS, META_SHARD
from local_chat.model.gguf import gguf_file, gguf_name, image_projector, is_model, split_parts, starts_as_gguf

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}  # a config's dtype: bytes a weight is stored in
QUANT_SHARE = {4: 0.28, 8: 0.53}  # of the 16-bit bytes (bench/quant.py's footprints)
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"  # a manifest's layer that is the model's GGUF


@dataclass(frozen=True)
class ListedModel:
    id: str
    path: Path
    family: str
    size: int  # bytes of its weight files
    sees_images: bool = False
    fits: bool | None = None  # in the free memory, as it would load; None: not known
    problem: str | None = None  # why it cannot load, one sentence
    positions: int | None = None  # its config's max_position_embeddings: its context is at most that
    adapter: str | None = None  # a LoRA adapter's name (its folder's); its id is "BASE + NAME"
    base: str | None = None  # an adapter's base: the listed checkpoint's id (before that: its config's words)
    hears: bool = False  # it takes recordings (Qwen2-Audio, Qwen2.5-Omni)

    def context(self, max_seq_len: int | None) -> int:
        """Its context as it would load with `max_seq_len` (--max_seq_len, default DEFAULT_CONTEXT)."""
        asked = max_seq_len or DEFAULT_CONTEXT
        return min(asked, self.positions) if self.positions else asked

    def line(self) -> str:
        """How the terminal lists it."""
        if self.problem is not None:
            return f"{self.id}: {self.problem}"
        if self.adapter is not None:
            return f"{self.id} (LoRA adapter over {self.base}, {self.size / 2**20:.1f} MiB)"
        facts = [self.family, f"{self.size / 2**30:.1f} GiB" if self.size >= 2**30 else f"{self.size / 2**20:.0f} MiB"]
        facts += ["sees images"] if self.sees_images else []
        facts += ["hears"] if self.hears else []
        facts += ["does not fit the free memory"] if self.fits is False else []
        return f"{self.id} ({', '.join(facts)})"


def find_models(
    folders: list[str], load_bytes: int, quant: int | None, free: int | None, settings: dict | None = None
) -> list[ListedModel]:
    """The checkpoints in `folders` (each a folder of checkpoint folders, or of the Hugging Face cache's), in order;
    `load_bytes`: a weight's bytes in the dtype they would load in; `free`: the memory free for them (None: not
    known); `settings`: --models_config's, by id (what it gives an Accessory checkpoint, it need not hold)."""
    found: list[ListedModel] = []
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise UserError(f"--models_dir {folder} is not a folder; give one that holds checkpoint folders.")
        for name, path in _candidates(folder):
            taken = sum(1 for m in found if m.id == name or m.id.startswith(name + "@"))
            model_id = f"{name}@{taken + 1}" if taken else name
            listed = _listed(model_id, path, (load_bytes, quant), free, set((settings or {}).get(model_id, ())))
            found.append(listed)
    return [_placed(model, found) if model.adapter is not None else model for model in found]


def _placed(adapter: ListedModel, found: list[ListedModel]) -> ListedModel:
    """An adapter named after its base, where its config's base_model_name_or_path is a listed checkpoint."""
    if adapter.problem is not None:
        return adapter
    said = str(adapter.base or "")
    path = Path(said).expanduser()
    for model in found:
        if model.adapter is None and model.problem is None:
            same_path = path.is_dir() and path.resolve() == model.path.resolve()
            if same_path or model.id in (said, path.name) or said.endswith("/" + model.id):
                return replace(adapter, id=f"{model.id} + {adapter.adapter}", base=model.id)
    return replace(
        adapter,
        problem=f"its base {said!r} (base_model_name_or_path in its adapter_config.json) is not among the checkpoints "
        "listed; put the base's folder in --models_dir, or serve it with --pretrained_path BASE --lora.",
    )


def pick(models: list[ListedModel], wanted: str | None) -> ListedModel:
    """The model `--model` names (default: the first that can load); one sentence naming the ids otherwise."""
    usable = [m for m in models if m.problem is None and m.adapter is None]
    if wanted is None:
        if not usable:
            raise UserError("No checkpoint in --models_dir can load (see the list above); add one, or fix one.")
        return usable[0]
    chosen = next((m for m in models if m.id == wanted), None)
    if chosen is None:
        known = ", ".join(m.id for m in models) or "none"
        raise UserError(f"--model {wanted!r} is not among the checkpoints found ({known}); pick one of them.")
    if chosen.problem is not None:
        raise UserError(f"--model {wanted!r} cannot load: {chosen.problem}")
    return chosen


def _candidates(folder: Path) -> list[tuple[str, Path]]:
    """(name, path) of each checkpoint directly in `folder`: a folder, a GGUF file (by its name), a snapshot of a
    cached `models--org--name` (the one `refs/main` names, else the newest) as `org/name`, LM Studio's
    `PUBLISHER/REPO` folders of GGUF files; or, for Ollama's store, each model its manifests name."""
    if (folder / "manifests").is_dir() and (folder / "blobs").is_dir():
        return _ollama(folder)
    found = [(gguf_name(file), file) for file in sorted(folder.glob("*.gguf")) if is_model(file)]
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if gguf_file(child) is not None:
            found.append((child.name, child))
        elif _lm_studio_publisher(child):
            found += _lm_studio(child)
        elif child.name.startswith("models--"):
            snapshot, name = _snapshot(child), "/".join(child.name.split("--")[1:])
            files = [] if snapshot is None else [f for f in sorted(snapshot.glob("*.gguf")) if is_model(f)]
            if len(files) > 1 and not (snapshot / "config.json").exists():  # a GGUF repo's quantizations
                found += [(f"{name}/{gguf_name(file)}", file) for file in files]
            elif snapshot is not None:
                found.append((name, snapshot))
        elif _looks_like_checkpoint(child) or (child / "adapter_config.json").is_file():
            found.append((child.name, child))
    return found


def _ollama(store: Path) -> list[tuple[str, Path]]:
    """Ollama's store (~/.ollama/models): each manifest (manifests/HOST/NAMESPACE/NAME/TAG) names its model's GGUF
    blob; listed as Ollama names it ("NAME:TAG" in its library, else "NAMESPACE/NAME:TAG"). A manifest that cannot
    be read, or whose blob is missing, is listed with its sentence by `_listed` (its path then does not exist)."""
    found = []
    for manifest in sorted(p for p in (store / "manifests").glob("*/*/*/*") if p.is_file()):
        namespace, name, tag = manifest.parts[-3:]
        model_id = f"{name}:{tag}" if namespace == "library" else f"{namespace}/{name}:{tag}"
        try:
            layers = json.loads(manifest.read_text()).get("layers", [])
            digest = next(x["digest"] for x in layers if x.get("mediaType") == OLLAMA_MODEL_LAYER)
        except (OSError, ValueError, AttributeError, KeyError, StopIteration):
            found.append((model_id, manifest))  # listed with why it cannot load
            continue
        found.append((model_id, store / "blobs" / digest.replace(":", "-")))
    return found


def _lm_studio_publisher(folder: Path) -> bool:
    """LM Studio's PUBLISHER folder (~/.lmstudio/models/PUBLISHER/REPO/*.gguf): its folders hold GGUF files."""
    return not (folder / "config.json").exists() and any(
        any(repo.glob("*.gguf")) for repo in folder.iterdir() if repo.is_dir()
    )


def _lm_studio(publisher: Path) -> list[tuple[str, Path]]:
    """Each model in a publisher's folders as "PUBLISHER/REPO" (with its file's name where a folder holds several:
    the same model in several quantizations)."""
    found = []
    for repo in sorted(p for p in publisher.iterdir() if p.is_dir()):
        files = [file for file in sorted(repo.glob("*.gguf")) if is_model(file)]
        name = f"{publisher.name}/{repo.name}"
        found += [(name if len(files) == 1 else f"{name}/{gguf_name(file)}", file) for file in files]
    return found


def _snapshot(cached: Path) -> Path | None:
    snapshots, main = cached / "snapshots", cached / "refs" / "main"
    named = snapshots / main.read_text().strip() if main.is_file() else None
    if named is not None and named.is_dir():
        return named
    listed = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    return listed[-1] if listed else None


def _looks_like_checkpoint(folder: Path) -> bool:
    names = {p.name for p in folder.iterdir()}
    return bool(names & {"config.json", "params.json"}) or any(
        ACCESSORY_SHARD.match(n) or META_SHARD.match(n) for n in names
    )


def _listed(model_id: str, path: Path, load: tuple[int, int | None], free: int | None, given: set) -> ListedModel:
    if path.parent.name == "blobs" and not path.is_file():
        return ListedModel(model_id, path, "GGUF", 0, problem=f"Ollama's blob {path.name} is missing.")
    if path.is_file() and path.parent.parent.parent.parent.name == "manifests":
        return ListedModel(model_id, path, "GGUF", 0, problem="its Ollama manifest names no model layer.")
    if (file := gguf_file(path)) is not None:
        return _gguf(model_id, file, free)
    if not (path / "config.json").is_file() and (path / "adapter_config.json").is_file():
        return _adapter(model_id, path)
    shards = [p for p in path.iterdir() if ACCESSORY_SHARD.match(p.name) or META_SHARD.match(p.name)]
    if shards:
        return _consolidated(model_id, path, shards, load, free, given)
    weights = [p for pattern in HF_WEIGHT_PATTERNS for p in path.glob(pattern) if not p.name.endswith(".json")]
    size = sum(p.stat().st_size for p in weights)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as error:
        return ListedModel(model_id, path, "?", size, problem=f"its config.json cannot be read ({error}).")
    family = str(config.get("model_type") or "?")
    if not weights:
        return ListedModel(model_id, path, family, 0, problem="it holds no weights (*.safetensors or *.bin).")
    if not _known(family):
        return ListedModel(
            model_id, path, family, size, problem=f"its model type {family!r} is not one this transformers knows."
        )
    stored = BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or "float32"), 4)
    positions = (config.get("text_config") or {}).get("max_position_embeddings") or config.get(
        "max_position_embeddings"
    )
    fits = _fits(size, stored, load, free)
    parts = config.get("thinker_config") or config  # Qwen2.5-Omni's thinker holds its vision and audio
    return ListedModel(model_id, path, family, size, "vision_config" in parts, fits, positions=positions,
                       hears="audio_config" in parts)  # fmt: skip


def _consolidated(
    model_id: str, path: Path, shards: list[Path], load: tuple[int, int | None], free: int | None, given: set
) -> ListedModel:
    """An Accessory or Meta consolidated checkpoint: loadable where it has its params and a tokenizer (or
    --models_config gives them, as `given` says)."""
    size = sum(p.stat().st_size for p in shards)
    kind = "Accessory" if any(ACCESSORY_SHARD.match(p.name) for p in shards) else "Meta"
    lacks = []
    if not ((path / "params.json").is_file() or (path / "config.json").is_file() or "llama_config" in given):
        lacks.append("its params.json (llama_config)")
    if not (any((place / "tokenizer.model").is_file() for place in (path, path.parent)) or "tokenizer_path" in given):
        lacks.append("a tokenizer.model (tokenizer_path)")
    if kind == "Accessory" and not ((path / "meta.json").is_file() or "llama_type" in given):
        lacks.append("a meta.json naming its llama_type (llama_type)")
    problem = (
        f"this {kind} checkpoint lacks {' and '.join(lacks)}; give {'it' if len(lacks) == 1 else 'them'} in "
        "--models_config, or load it with --pretrained_path and the flags."
        if lacks
        else None
    )
    fits = _fits(size, 2, load, free)  # Meta's and Accessory's releases are 16-bit
    return ListedModel(model_id, path, f"llama ({kind})", size, fits=fits, problem=problem)


def _gguf(model_id: str, file: Path, free: int | None) -> ListedModel:
    """A GGUF file (served by llama.cpp): its header is read when it loads; here only its first bytes, and whether an
    image projector (`mmproj*.gguf`) is beside it."""
    size = sum(p.stat().st_size for p in split_parts(file) if p.is_file())
    if not starts_as_gguf(file):
        return ListedModel(
            model_id, file, "GGUF", size, problem=f"{file.name} is not a GGUF file (it does not start with GGUF)."
        )
    fits = None if free is None else size <= free
    return ListedModel(
        model_id, file, "GGUF, llama.cpp", size, fits=fits, sees_images=image_projector(file) is not None
    )


def _adapter(name: str, path: Path) -> ListedModel:
    """A PEFT LoRA adapter's folder, with the base its config names (placed among the checkpoints by `_placed`)."""
    size = sum(p.stat().st_size for p in path.glob("adapter_model.*"))
    try:
        config = json.loads((path / "adapter_config.json").read_text())
        base = str(config.get("base_model_name_or_path") or "")
    except (OSError, ValueError, AttributeError) as error:
        return ListedModel(
            name, path, "LoRA adapter", size, adapter=name, problem=f"its adapter_config.json cannot be read ({error})."
        )
    if not size:
        return ListedModel(
            name, path, "LoRA adapter", 0, adapter=name, problem="it holds no adapter_model.safetensors."
        )
    return ListedModel(name, path, "LoRA adapter", size, adapter=name, base=base)


def _fits(size: int, stored: int, load: tuple[int, int | None], free: int | None) -> bool | None:
    """Whether weights of `size` bytes, `stored` bytes each, fit `free` bytes as they would load: (bytes each,
    quantization bits or None)."""
    load_bytes, quant = load
    each = QUANT_SHARE[quant] * 2 if quant else load_bytes
    return None if free is None else size / stored * each <= free


def _known(model_type: str) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return model_type in CONFIG_MAPPING_NAMES


def free_memory(device: str) -> int | None:
    """Bytes free for weights: the GPU's where the model goes to one, else MemAvailable (None where unknown)."""
    if device == "cuda":
        import torch

        return sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
