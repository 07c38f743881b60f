"""Optional help for the documents' search (documents/context.py): `--embedding_model PATH`, a local
sentence-transformers folder (any transformers encoder: its mean-pooled, normalized output), whose nearest passages
are fused with BM25's by reciprocal rank; and `--reranker PATH`, a cross-encoder that orders the fused passages by
its score for the question. Both run on the CPU of the web server's process, loaded once; neither is needed.
"""

from __future__ import annotations

import struct
import threading
from pathlib import Path

from local_chat.errors import UserError

MAX_TOKENS = 256  # of a passage or a question, for either model
RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al.)


def _loaded(path: str, kind: str, loader):
    if not Path(path, "config.json").exists():
        raise UserError(f"{kind} {path} has no config.json; give a local sentence-transformers or transformers folder.")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path), loader(path).eval()
    except (OSError, ValueError) as error:
        raise UserError(f"{kind} {path} cannot be loaded ({error}).")


class Embedder:
    """A sentence encoder: texts to unit vectors."""

    def __init__(self, path: str):
        from transformers import AutoModel

        self.name = Path(path).name
        self.tokenizer, self.model = _loaded(path, "--embedding_model", AutoModel.from_pretrained)
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> list[bytes]:
        """Each text's vector, packed as float32 bytes."""
        import torch

        out = []
        with self._lock, torch.inference_mode():
            for start in range(0, len(texts), 32):
                batch = self.tokenizer(texts[start : start + 32], padding=True, truncation=True,
                                       max_length=MAX_TOKENS, return_tensors="pt")  # fmt: skip
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1)
                out += [struct.pack(f"{row.numel()}f", *row.tolist()) for row in pooled.float()]
        return out


class Reranker:
    """A cross-encoder: a score for each (question, passage) pair, higher is better."""

    def __init__(self, path: str):
        from transformers import AutoModelForSequenceClassification

        self.name = Path(path).name
        self.tokenizer, self.model = _loaded(path, "--reranker", AutoModelForSequenceClassification.from_pretrained)
        self._lock = threading.Lock()

    def scores(self, question: str, texts: list[str]) -> list[float]:
        import torch

        if not texts:
            return []
        with self._lock, torch.inference_mode():
            batch = self.tokenizer([question] * len(texts), texts, padding=True, truncation=True,
                                   max_length=2 * MAX_TOKENS, return_tensors="pt")  # fmt: skip
            logits = self.model(**batch).logits
        return logits[:, 0].float().tolist()


def nearest(question: bytes, vectors: list[tuple[int, bytes]], limit: int) -> list[int]:
    """The ids of the vectors nearest the question's (cosine of unit vectors), nearest first."""
    import numpy

    if not vectors:
        return []
    matrix = numpy.stack([numpy.frombuffer(vector, dtype=numpy.float32) for _, vector in vectors])
    order = numpy.argsort(-(matrix @ numpy.frombuffer(question, dtype=numpy.float32)))[:limit]
    return [vectors[i][0] for i in order]


def fused(rankings: list[list], k: int = RRF_K) -> list:
    """Items of several rankings (best first) in one ranking, by reciprocal rank fusion."""
    score: dict = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking):
            score[item] = score.get(item, 0.0) + 1.0 / (k + rank + 1)
    return sorted(score, key=lambda item: -score[item])
