"""GGUF files, llama.cpp's format: which paths hold one, what their header says (gguf-py's `GGUFReader`), and their
tokenizer and chat template as transformers reads them (`AutoTokenizer.from_pretrained(..., gguf_file=...)`), so that
the prompt is rendered and tokenized here exactly as for a Hugging Face folder of the same family.

A GGUF model is a `.gguf` file, the first part of a split one (`NAME-00001-of-00003.gguf`: the others beside it), or a
folder holding one model's `.gguf` (and, for a vision model, an `mmproj*.gguf`: its image projector)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from local_chat.errors import UserError

SUFFIX = ".gguf"
MAGIC = b"GGUF"  # a GGUF file's first bytes
SPLIT_PART = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
INSTALL = 'pip install -e ".[gguf]"'
# gguf-py's architecture names where transformers' model_type differs (the family registry goes by model_type)
MODEL_TYPES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "deepseek2": "deepseek_v3",
               "phi3": "phi3", "command-r": "cohere", "gemma3n": "gemma3n", "lfm2moe": "lfm2_moe",
               "qwen2vl": "qwen2_vl", "qwen3vl": "qwen3_vl", "qwen3vlmoe": "qwen3_vl_moe", "glm4moe": "glm4_moe",
               "granitehybrid": "granitemoehybrid"}  # fmt: skip


@dataclass(frozen=True)
class GgufModel:
    """One GGUF model as its header describes it. `file_type`: llama.cpp's name of its weights' type ("Q8_0",
    "Q4_K_M", "BF16"); `size_bytes`: all its parts together."""

    path: Path  # the file llama.cpp opens (a split model's first part)
    parts: tuple[Path, ...]
    mmproj: Path | None
    architecture: str
    name: str
    file_type: str
    context: int | None  # what the model was trained for
    chat_template: str | None
    size_bytes: int

    @property
    def model_type(self) -> str:
        return MODEL_TYPES.get(self.architecture, self.architecture.replace("-", "_"))

    @property
    def described(self) -> str:
        """ "GGUF Q4_K_M · 4.1 GB": what the model line says of the file."""
        size = self.size_bytes
        shown = (
            f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB" if size >= 1e7 else f"{size / 1e6:.1f} MB"
        )
        return f"GGUF {self.file_type} · {shown}"


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file `path` names (itself, or the one model file in a folder that holds no Hugging Face weights), or
    None where `path` is not GGUF."""
    path = Path(path)
    if path.suffix.lower() == SUFFIX or (path.is_file() and starts_as_gguf(path)):  # Ollama's blobs have no suffix
        return path
    if not path.is_dir() or (path / "config.json").exists():
        return None
    models = [p for p in sorted(path.glob("*.gguf")) if is_model(p)]
    return models[0] if len(models) == 1 else None


def is_model(file: Path) -> bool:
    """Whether `file` (a .gguf) is a model's own file: not an image projector, nor a later part of a split model."""
    return not _is_mmproj(file) and _part_index(file) in (None, 1)


def gguf_name(file: Path) -> str:
    """The name a GGUF model goes by: its file's, without .gguf nor a split model's part number."""
    match = SPLIT_PART.match(file.name)
    return match["stem"] if match else file.name.removesuffix(SUFFIX)


def read_gguf(path: str | Path) -> GgufModel:
    """The header of the GGUF model at `path` (see `gguf_file`); one sentence for a file that is missing, truncated
    or not GGUF, and for a missing part of a split model."""
    file = gguf_file(path)
    if not Path(path).exists():
        raise UserError(f"{path} does not exist; check --pretrained_path (a .gguf file, or a folder holding one).")
    if file is None or not file.is_file():
        raise UserError(f"{path} is not a GGUF file; pass a .gguf file (or a folder holding one).")
    parts = _parts(file)
    reader = _reader(file)
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("tokenizer.ggml.")}
    architecture = str(fields.get("general.architecture", ""))
    if not architecture:
        raise UserError(f"{file.name} has no general.architecture in its header; it is not a model llama.cpp runs.")
    context = fields.get(f"{architecture}.context_length")
    return GgufModel(
        path=file,
        parts=parts,
        mmproj=image_projector(file),
        architecture=architecture,
        name=str(fields.get("general.name", file.stem)),
        file_type=_file_type(fields.get("general.file_type"), reader),
        context=int(context) if context is not None else None,
        chat_template=fields.get("tokenizer.chat_template"),
        size_bytes=sum(p.stat().st_size for p in parts),
    )


def gguf_tokenizer(model: GgufModel):
    """The model's tokenizer and chat template as transformers reads them from the file (a fast tokenizer)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        try:
            hf = AutoTokenizer.from_pretrained(str(model.path.parent), gguf_file=model.path.name)
        except ValueError as error:  # transformers reads the config of some architectures only; the tokenizer
            if "is not supported yet" not in str(error):  # is built from `tokenizer.ggml.model`, whichever it is
                raise
            hf = PreTrainedTokenizerFast.from_pretrained(str(model.path.parent), gguf_file=model.path.name)
    except ImportError as error:
        raise UserError(f"Reading {model.path.name} needs gguf-py: install it with `{INSTALL}`.") from error
    except (ValueError, KeyError, NotImplementedError) as error:
        raise UserError(
            f"transformers cannot read the tokenizer of {model.path.name} ({model.architecture}: {error}); this "
            "architecture's GGUF files are not served yet."
        ) from error
    if model.chat_template and not hf.chat_template:
        hf.chat_template = model.chat_template
    return hf


def starts_as_gguf(file: Path) -> bool:
    """Whether `file` begins as a GGUF file does (its name aside: Ollama's blobs have none)."""
    with open(file, "rb") as f:
        return f.read(4) == MAGIC


def _reader(file: Path):
    try:
        from gguf import GGUFReader
    except ImportError as error:
        raise UserError(
            f"{file.name} is a GGUF file; serving one needs llama.cpp: install it with `{INSTALL}`."
        ) from error
    if not starts_as_gguf(file):
        raise UserError(f"{file} is not a GGUF file (it does not start with GGUF); pass a model's .gguf file.")
    try:
        reader = GGUFReader(file)
    except (ValueError, IndexError, OSError) as error:  # its tensors run past its end
        raise UserError(f"{file} is truncated or damaged ({error}): download it again.") from error
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > file.stat().st_size:
        raise UserError(f"{file} is truncated ({file.stat().st_size:,} of {end:,} bytes): download it again.")
    return reader


def _file_type(code, reader) -> str:
    """llama.cpp's name of the weights' type: the header's general.file_type, else the 2-D tensors' usual type."""
    from gguf import GGMLQuantizationType, LlamaFileType

    if code is not None:
        try:
            name = LlamaFileType(int(code)).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    types = [t.tensor_type for t in reader.tensors if len(t.shape) == 2]
    return GGMLQuantizationType(max(set(types), key=types.count)).name if types else "unknown"


def _part_index(file: Path) -> int | None:
    match = SPLIT_PART.match(file.name)
    return int(match["index"]) if match else None


def split_parts(file: Path) -> tuple[Path, ...]:
    """The files a model's `file` names: itself, or every part of a split model (there or not)."""
    match = SPLIT_PART.match(file.name)
    if match is None:
        return (file,)
    count = int(match["count"])
    return tuple(file.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))


def _parts(file: Path) -> tuple[Path, ...]:
    """`split_parts`, with one sentence for a later part passed, or a part missing."""
    parts = split_parts(file)
    if (index := _part_index(file)) not in (None, 1):
        raise UserError(f"{file.name} is part {index} of a split model; pass its first part (-00001-).")
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise UserError(
            f"{file.name} is split in {len(parts)} parts and {missing[0]} is not beside it; download it too."
        )
    return parts


def _is_mmproj(file: Path) -> bool:
    return file.name.lower().startswith("mmproj")


def image_projector(file: Path) -> Path | None:
    """The image projector beside a vision model's file (llama.cpp's `mmproj*.gguf`), if any."""
    found = sorted(p for p in file.parent.glob("*.gguf") if _is_mmproj(p))
    return found[0] if found else None
