"""The plain launch's decode steps on CUDA: the eager forward, replayed from CUDA graphs over pooled static caches.

Eager PyTorch launches each of a step's few hundred kernels from Python, and for a model the size of Llama-2-7B
at batch 1 the GPU spends most of the step waiting for the next launch (30 tokens/s on an H100 whose memory
allows 220). A CUDA graph records a step's kernels once and replays them in one call, as llama.cpp and vLLM do.
No compiler is involved: the graph holds the very kernels the eager step runs, so the first answer does not wait
minutes for inductor (`--compile`), and the tokens are the ones the static cache's eager step gives.

A graph is recorded the first time a pooled static cache (model/compiled.py) takes a step of a given shape: that
step runs eagerly (it is the warm-up CUDA asks for), then the same step is recorded, and the next ones replay it.
A graph bakes in the addresses of the tensors it reads and writes, so each one keeps its own input buffers, which
each replay first fills, and the cache it was recorded over (the pool keeps its caches for good). Graphs share one
memory pool: the steps they record run one at a time, and each step's logits are copied out before the next.
A model whose step cannot be recorded (an operation in it reads a value back to the host, as bitsandbytes' 8-bit
outlier search does: `LocalEngine` does not try that one) decodes eagerly over its static caches from the first
failure on, and the terminal says why, once.
"""

from __future__ import annotations

import sys
import threading

import torch

from .compiled import StaticDecoding


class GraphedDecoding(StaticDecoding):
    """Decode steps replayed from CUDA graphs over pooled static caches (`--no_cuda_graphs` turns it off)."""

    optional = True  # an answer whose static cache does not fit decodes eagerly, as with --no_cuda_graphs

    def __init__(self, model, max_cache_len: int):
        super().__init__(model, max_cache_len, DecodeGraphs(model))


class _Recorded:
    """One recorded decode step: the input buffers each replay fills, and the logits it writes."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: dict[str, torch.Tensor], logits: torch.Tensor):
        self.graph = graph
        self.inputs = inputs
        self.logits = logits

    def replay(self, tensors: dict[str, torch.Tensor]):
        for name, buffer in self.inputs.items():
            buffer.copy_(tensors[name])
        self.graph.replay()
        return _Output(self.logits.clone())  # the next replay writes over the graph's own


class _Output:
    """What `decode_one` reads of a forward's output."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits


class DecodeGraphs:
    """Called as the model's forward for one decode step over a static cache: replays the step's CUDA graph,
    recording it first where this cache and these shapes have none."""

    def __init__(self, model):
        self.model = model
        self._recorded: dict[tuple, _Recorded | None] = {}  # None: could not be recorded, runs eagerly
        self.failed = False  # a step could not be recorded: every step runs eagerly
        self._lock = threading.Lock()
        self._pool = None  # the memory pool every graph records into (made with the first)
        self._stream = None  # the side stream graphs are warmed up and recorded on

    def recorded(self) -> dict[str, list[tuple[int, int]]]:
        """The (batch size, cache length) of each decode step recorded as a graph, and of each that runs eagerly."""
        shapes = {"graphs": [], "eager": []}
        for key, recorded in self._recorded.items():
            mask_shape = next(part[1] for part in key if part[0] == "attention_mask")
            shapes["graphs" if recorded is not None else "eager"].append(mask_shape)
        return shapes

    def __call__(self, **kwargs):
        tensors = {name: value for name, value in kwargs.items() if isinstance(value, torch.Tensor)}
        key = self._key(kwargs, tensors)
        recorded = self._recorded.get(key, False)
        if recorded is None or (recorded is False and self.failed):
            return self.model(**kwargs)
        if recorded is False:
            return self._first_step(key, kwargs, tensors)
        return recorded.replay(tensors)

    @staticmethod
    def _key(kwargs: dict, tensors: dict[str, torch.Tensor]) -> tuple:
        """What a graph is recorded for: the cache object (its tensors' addresses), each tensor's shape and dtype,
        and every other argument's value."""
        parts = []
        for name, value in sorted(kwargs.items()):
            if name in tensors:
                parts.append((name, tuple(value.shape), value.dtype, value.device))
            elif isinstance(value, (bool, int, float, str, type(None))):
                parts.append((name, value))
            else:  # the cache
                parts.append((name, id(value)))
        return tuple(parts)

    def _first_step(self, key: tuple, kwargs: dict, tensors: dict[str, torch.Tensor]):
        """Run this step eagerly on the side stream (CUDA's warm-up before a capture), then record it."""
        with self._lock:
            if self._stream is None:
                self._stream = torch.cuda.Stream(self.model.device)
                self._pool = torch.cuda.graph_pool_handle()
            stream, main = self._stream, torch.cuda.current_stream(self.model.device)
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                logits = self.model(**kwargs).logits
            main.wait_stream(stream)
            self._recorded[key] = self._record(kwargs, tensors, stream)
            return _Output(logits.clone())

    def _record(self, kwargs: dict, tensors: dict[str, torch.Tensor], stream) -> _Recorded | None:
        inputs = {name: value.clone() for name, value in tensors.items()}
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
                logits = self.model(**{**kwargs, **inputs}).logits
        except Exception as error:  # noqa: BLE001 (any failure to record means: run the steps eagerly)
            self.failed = True
            print(
                "note: this model's decode step could not be recorded as a CUDA graph "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                "it decodes without them, as with --no_cuda_graphs.",
                file=sys.stderr,
                flush=True,
            )
            return None
        return _Recorded(graph, inputs, logits)
