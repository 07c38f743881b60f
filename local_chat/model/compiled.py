"""Decode steps over pooled static KV caches: `--compile`'s (a compiled forward, gpt-fast's recipe) and, on CUDA, the
plain launch's (the eager forward replayed from CUDA graphs, model/graphs.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer


class StaticDecoding:
    """Decode steps through `forward` over a preallocated (static) KV cache, pooled per batch size and length.

    Every decode step of a request has the same shapes (one token per row, a cache of fixed length, one
    full-length attention mask), so on CUDA it replays as a CUDA graph, recorded once per shape. Each step attends
    over the whole static cache, so a request gets one sized to what it may hold (its prompt and answer), rounded
    up to a power of two from 256, at most `max_cache_len`: a short answer does not read thousands of empty
    positions every step. The prefill stays eager, over a dynamic cache (prompt lengths vary), and is copied into
    the static cache for the decode steps. Static caches are pooled per batch size and length and reused, so their
    addresses stay fixed for the recorded graphs; a request that finds none free gets a new one.
    """

    SHORTEST = 256  # tokens: the smallest static cache a request gets
    optional = False  # whether an answer may decode without it where its static cache does not fit in memory

    def __init__(self, model, max_cache_len: int, forward):
        self.model = model
        self.max_cache_len = max_cache_len
        self.forward = forward
        # Each decode step is queued before the last step's tokens are read back only where the device runs ahead
        # of Python (CUDA). On the CPU a forward pass runs as it is called: queuing it first would show every token,
        # the first one too, a step late and spend a step after a stop.
        self.queues_ahead = model.device.type == "cuda"
        # by batch size and length: each with the length its last request wrote, where known
        self._free: dict[tuple[int, int], list[tuple[StaticCache, int | None]]] = {}
        self._lock = threading.Lock()
        # what the decode steps add can be copied back out only where every layer keeps every position (no
        # sliding window): only then may a session keep its cache between turns
        self.keeps_sessions = all(type(layer) is StaticLayer for layer in self._new_cache(max_cache_len).layers)

    def _new_cache(self, length: int) -> StaticCache:
        return StaticCache(config=self.model.config, max_cache_len=length)

    def cache_length(self, tokens: int) -> int:
        """The length of the static cache for a request that may hold `tokens` (prompt and answer)."""
        return min(self.max_cache_len, max(self.SHORTEST, 1 << (tokens - 1).bit_length()))

    @contextmanager
    def cache(self, prefilled: DynamicCache, length: int, copy_back: bool) -> Iterator[StaticCache]:
        """A pooled static cache of `length` holding what `prefilled` holds. With `copy_back`, the keys and values
        the decode steps add are appended to `prefilled` after (a session keeps it for its next turn)."""
        batch_size = prefilled.layers[0].keys.shape[0]
        with self._lock:
            pool = self._free.setdefault((batch_size, length), [])
            cache, last_written = pool.pop() if pool else (self._new_cache(length), None)
        held = prefilled.get_seq_length()
        self._empty(cache, held, last_written)
        try:
            for index, layer in enumerate(prefilled.layers):  # as the prefill itself would have written them
                cache.update(layer.keys, layer.values, index)
            if not copy_back:
                prefilled = None  # its memory goes back now
            yield cache
        finally:
            written = None  # known only where it is read anyway (reading it waits for the device)
            if copy_back:
                written = int(cache.get_seq_length())
                for index, layer in enumerate(cache.layers):
                    prefilled.update(layer.keys[:, :, held:written], layer.values[:, :, held:written], index)
            with self._lock:
                pool.append((cache, written))

    @staticmethod
    def _empty(cache: StaticCache, keep: int, written: int | None) -> None:
        """Empty a pooled `cache` for a request whose copy overwrites its first `keep` positions. Where the last
        request's length is known (`written`: a session's turn reads it to copy its tokens back), only the positions
        it wrote beyond `keep` are zeroed; else all are (`reset`, which took 16 ms of the 350 ms to the first piece
        of a turn after a 2,056-token history, ~100M-parameter Llama, 2-core CPU). Zeroed, not left stale: the
        steps' attention masks them, but a masked NaN would still poison the sums."""
        if written is None:
            cache.reset()
            return
        for layer in cache.layers:
            layer.keys[:, :, keep:written].zero_()
            layer.values[:, :, keep:written].zero_()
        cache.crop(-written)  # transformers' crop takes the number of tokens to remove, negated

    @staticmethod
    def decode_masks(attention_mask: torch.Tensor, length: int) -> Iterator[torch.Tensor]:
        """One mask for every step: the prompt's padding, then ones to the cache's `length` (the causal mask hides
        the positions not written yet)."""
        full = attention_mask.new_ones((attention_mask.shape[0], length))
        full[:, : attention_mask.shape[1]] = attention_mask
        while True:
            yield full


class CompiledDecoding(StaticDecoding):
    """`--compile`: decode steps run a `torch.compile`d forward (gpt-fast's recipe). The forward is compiled with the
    batch size and cache length dynamic, so no new length compiles it again (batch size 1, which torch specializes,
    gets a graph of its own)."""

    name = "torch.compile, static KV cache"
    # gpt-fast's settings: CUDA graphs (what transformers' default mode, "reduce-overhead", gives) and inductor's
    # coordinate descent tuning, which turns a batch-1 matrix multiply on a GPU into a tuned reduction kernel
    # instead of a cuBLAS call. torch.compile takes a mode or options, not both.
    OPTIONS = {"triton.cudagraphs": True, "coordinate_descent_tuning": True}

    def __init__(self, model, max_cache_len: int):
        from transformers import CompileConfig

        super().__init__(
            model, max_cache_len, model.get_compiled_call(CompileConfig(dynamic=True, mode=None, options=self.OPTIONS))
        )
