"""Accessory's tokenizer API (`encode(s, bos, eos)`, `decode(ids)`) over sentencepiece or Hugging Face tokenizers."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from local_chat.errors import UserError

HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+=*\s+\d+\s*$")


class SentencePieceTokenizer:
    """A `tokenizer.model` read with sentencepiece, exactly as LLaMA2-Accessory and Meta's code read it."""

    hf = None  # no chat template: such checkpoints use Accessory's conversation templates

    def __init__(self, model_path: str | Path):
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(model_path))
        self.bos_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
        self.eos_id = self.sp.eos_id() if self.sp.eos_id() >= 0 else None
        self.pad_id = self.sp.pad_id() if self.sp.pad_id() >= 0 else (self.eos_id or 0)
        self.n_words = self.sp.vocab_size()
        self.eos_ids = {self.eos_id} if self.eos_id is not None else set()

    def encode(self, s: str, bos: bool = True, eos: bool = False) -> list[int]:
        ids = self.sp.encode(s)
        return _add_specials(ids, self.bos_id if bos else None, self.eos_id if eos else None)

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    decode_with_specials = decode  # sentencepiece's control tokens carry no text

    def special_token_id(self, text: str) -> int | None:
        """The id of `text` when it is one control token (such as "</s>"), else None."""
        piece_id = self.sp.piece_to_id(text)
        return piece_id if self.sp.is_control(piece_id) and self.sp.id_to_piece(piece_id) == text else None


class HFTokenizer:
    """A Hugging Face tokenizer with Accessory's API; `hf` is the tokenizer itself (chat template included)."""

    def __init__(self, hf_tokenizer, always_bos: bool = False):
        self.hf = hf_tokenizer
        self.bos_id = hf_tokenizer.bos_token_id
        self.eos_id = hf_tokenizer.eos_token_id
        pad_id = hf_tokenizer.pad_token_id
        self.pad_id = pad_id if pad_id is not None else (self.eos_id if self.eos_id is not None else 0)
        self.n_words = len(hf_tokenizer)
        self.eos_ids = {self.eos_id} if self.eos_id is not None else set()
        # Accessory checkpoints always start with BOS; HF models get BOS only when their tokenizer adds it.
        self.adds_bos = always_bos or self._tokenizer_adds_bos()

    def _tokenizer_adds_bos(self) -> bool:
        if self.bos_id is None:
            return False
        return self.hf.encode("a", add_special_tokens=True)[:1] == [self.bos_id]

    def encode(self, s: str, bos: bool = True, eos: bool = False) -> list[int]:
        ids = self.hf.encode(s, add_special_tokens=False)
        # A prompt rendered by a chat template may already start with the BOS text: never add a second one.
        add_bos = bos and self.adds_bos and ids[:1] != [self.bos_id]
        return _add_specials(ids, self.bos_id if add_bos else None, self.eos_id if eos else None)

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def decode_with_specials(self, ids: Iterable[int]) -> str:
        """The text with the special tokens in it: where reasoning models mark their channels and tool calls."""
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def special_token_id(self, text: str) -> int | None:
        """The id of `text` when it is one special (added) token such as "<|im_end|>", else None."""
        token_id = self.hf.convert_tokens_to_ids(text)
        if token_id is None or token_id == self.hf.unk_token_id:
            return None
        return token_id if text in self.hf.all_special_tokens or text in self.hf.get_added_vocab() else None


Tokenizer = SentencePieceTokenizer | HFTokenizer


def _add_specials(ids: list[int], bos_id: int | None, eos_id: int | None) -> list[int]:
    return ([bos_id] if bos_id is not None else []) + list(ids) + ([eos_id] if eos_id is not None else [])


def has_hf_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in HF_TOKENIZER_FILES)


def _is_tiktoken_file(path: Path) -> bool:
    with open(path, "rb") as f:
        first_line = f.readline(4096)
    return bool(_TIKTOKEN_LINE.match(first_line))


def load_tokenizer(path: str | Path, always_bos: bool = False, trust_remote_code: bool = False) -> Tokenizer:
    """Load `tokenizer.model` (sentencepiece) or a folder of Hugging Face tokenizer files."""
    path = Path(path)
    if path.is_dir() and has_hf_tokenizer(path):
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        return HFTokenizer(hf, always_bos=always_bos)
    model_file = path / "tokenizer.model" if path.is_dir() else path
    if not model_file.is_file():
        raise UserError(
            f"No tokenizer found at {path}: expected tokenizer.model or tokenizer.json there; "
            "pass --tokenizer_path to point at one."
        )
    if _is_tiktoken_file(model_file):
        raise UserError(
            f"{model_file} is a tiktoken (Llama-3) tokenizer, which this loader does not read: convert the "
            "checkpoint with transformers' convert_llama_weights_to_hf.py and load that Hugging Face folder, "
            "or pass --tokenizer_path to a folder holding tokenizer.json."
        )
    try:
        return SentencePieceTokenizer(model_file)
    except (RuntimeError, OSError) as exc:
        raise UserError(f"{model_file} is not a sentencepiece tokenizer ({exc}); pass --tokenizer_path to a valid one.")
