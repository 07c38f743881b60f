"""The one generation path every front end stands on.

Short steps in the style of gpt-fast: `prefill` the prompt, `decode_one` token, `sample_next`, and
`generate_tokens`, a loop that yields each step's tokens and asks one `decide` callback whether to stop.
`AnswerStream` turns one row's tokens into answer text and is where every stop decision for that row is
taken (EOS, stop string, cancel, length); a tensor-parallel runner can take it on one rank and share it.
"""
from __future__ import annotations

import functools
import inspect
import secrets
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .detokenize import IncrementalDetokenizer, StopStrings
from .errors import UserError
from .vision_inputs import FamilyInputs


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is picked; temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 0.95
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        """Settings no sampler can use are one sentence, whichever front end they came from."""
        problems = [(not self.temperature >= 0, f"temperature is {self.temperature}; set it to 0 (greedy) or more"),
                    (not 0 < self.top_p <= 1, f"top_p is {self.top_p}; set it above 0 and at most 1"),
                    (not self.top_k >= 0, f"top_k is {self.top_k}; set it to 0 (off) or more"),
                    (not self.repetition_penalty > 0,
                     f"repetition_penalty is {self.repetition_penalty}; set it above 0 (1 is off)")]
        for bad, sentence in problems:
            if bad:
                raise UserError(f"The {sentence}.")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def logits_processors(self) -> LogitsProcessorList:
        processors = LogitsProcessorList()
        if self.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(self.repetition_penalty))
        if not self.greedy:
            processors.append(TemperatureLogitsWarper(self.temperature))
            if self.top_k > 0:
                processors.append(TopKLogitsWarper(self.top_k))
            if self.top_p < 1.0:
                processors.append(TopPLogitsWarper(self.top_p))
        return processors

    def random_generator(self, device: torch.device) -> torch.Generator | None:
        """A generator seeded per request, so every rank (and every rerun with the same seed) samples alike."""
        if self.greedy:
            return None
        generator = torch.Generator(device=device)
        generator.manual_seed(self.seed if self.seed is not None else secrets.randbits(63))
        return generator


@dataclass
class ModelInputs:
    """A left-padded batch of prompts, with what a vision model's processor made for it (`family`); the prefill
    runs only the tokens after the first `cached`, and passes the image inputs only `with_images`."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    family: FamilyInputs = field(default_factory=FamilyInputs)
    cached: int = 0  # leading tokens whose keys and values the cache passed along already holds
    with_images: bool = True

    @property
    def extra(self) -> dict:
        """What the prefill passes to the model besides token ids, mask and cache."""
        return self.family.prefill(self.cached, self.with_images)


def _prefill_position_ids(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """Positions that skip left padding; None lets the model count from 0 when there is no padding."""
    if bool(attention_mask.all()):
        return None
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def cache_keyword(model) -> str:
    """The name the model's forward takes its KV cache by: `cache` from transformers 5.24 on (there
    `past_key_values` prints a deprecation warning, and it goes in 5.40); `past_key_values` before, and in remote
    code written for it."""
    return _cache_keyword(type(model))


@functools.cache
def _cache_keyword(model_class: type) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _last_logits(forward, input_ids, attention_mask, cache, keyword: str, position_ids=None, **extra) -> torch.Tensor:
    if position_ids is not None:
        extra["position_ids"] = position_ids
    out = forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, logits_to_keep=1,
                  **{keyword: cache}, **extra)
    return out.logits[:, -1, :]


def prefill(model, inputs: ModelInputs, cache) -> torch.Tensor:
    """Run the prompt (after its `cached` tokens) through the model, filling `cache`; return the next-token logits
    of each row."""
    extra = inputs.extra
    positions = extra.pop("position_ids", None)
    if positions is None:
        positions = _prefill_position_ids(inputs.attention_mask)
        positions = None if positions is None else positions[:, inputs.cached:]
    return _last_logits(model, inputs.input_ids[:, inputs.cached:], inputs.attention_mask, cache, cache_keyword(model),
                        positions, **extra)


def decode_one(forward, tokens: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor, cache,
               keyword: str, **extra):
    """Feed one token per row at `positions` ([rows, 1]); `attention_mask` already covers it. `keyword` is the
    forward's name for the cache (`cache_keyword`); `extra`, what a vision family's decode steps take besides."""
    return _last_logits(forward, tokens[:, None], attention_mask, cache, keyword, positions, **extra)


def sample_next(logits, seen_ids, sampling: SamplingParams, processors, generator) -> torch.Tensor:
    """Pick one token per row from the last logits."""
    scores = processors(seen_ids, logits.float()) if processors else logits
    if sampling.greedy:
        return scores.argmax(dim=-1)
    probs = torch.softmax(scores.float(), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


class CompiledDecoding:
    """`--compile`: decode steps run a `torch.compile`d forward over a preallocated (static) KV cache.

    This is gpt-fast's recipe: every decode step of a request has the same shapes (one token per row, a cache of
    fixed length, one full-length attention mask), so on CUDA it replays as a CUDA graph, recorded once per shape.
    Each step attends over the whole static cache, so a request gets one sized to what it may hold (its prompt and
    answer), rounded up to a power of two from 256, at most `max_cache_len`: a short answer does not read thousands
    of empty positions every step. The forward is compiled with the batch size and cache length dynamic, so no
    new length compiles it again (batch size 1, which torch specializes, gets a graph of its own). The prefill
    stays eager, over a dynamic cache as without `--compile` (prompt lengths vary), and is copied into the static
    cache for the decode steps. Static caches are pooled per batch size and length and reused, so their addresses
    stay fixed for the recorded graphs; a request that finds none free gets a new one.
    """

    SHORTEST = 256  # tokens: the smallest static cache a request gets
    # gpt-fast's settings: CUDA graphs (what transformers' default mode, "reduce-overhead", gives) and inductor's
    # coordinate descent tuning, which turns a batch-1 matrix multiply on a GPU into a tuned reduction kernel
    # instead of a cuBLAS call. torch.compile takes a mode or options, not both.
    OPTIONS = {"triton.cudagraphs": True, "coordinate_descent_tuning": True}

    def __init__(self, model, max_cache_len: int):
        from transformers import CompileConfig

        self.model = model
        self.max_cache_len = max_cache_len
        self.forward = model.get_compiled_call(CompileConfig(dynamic=True, mode=None, options=self.OPTIONS))
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


def growing_masks(attention_mask: torch.Tensor) -> Iterator[torch.Tensor]:
    """The attention mask of each decode step over a dynamic cache: one more column per step."""
    ones = attention_mask.new_ones((attention_mask.shape[0], 1))
    while True:
        attention_mask = torch.cat([attention_mask, ones], dim=-1)
        yield attention_mask


@torch.inference_mode()
def generate_tokens(
    model,
    inputs: ModelInputs,
    sampling: SamplingParams,
    decide: Callable[[torch.Tensor], bool],
    cache=None,
    compiled: CompiledDecoding | None = None,
    max_new_tokens: int | None = None,
) -> Iterator[torch.Tensor]:
    """Yield the sampled tokens of every row, one step at a time, until `decide(tokens)` returns True.

    `decide` sees each step's tokens before the model computes anything more, so a stop (EOS, stop string,
    cancel, length) costs no further forward pass. Closing this generator also stops the model. `cache`, a
    session's dynamic cache, holds the prompt's first `inputs.cached` tokens and, after, every token fed.
    With `compiled` the decode steps run compiled over a pooled static cache sized for `max_new_tokens` (None: the
    longest); on CUDA each is queued before the tokens it follows are read back (the GPU never waits for `decide`;
    a stop costs that one queued step, whose token is fed too, and `decide` must not change the tokens, so no
    lockstep).
    """
    kept = cache is not None
    # a model with sliding-window layers prefills into a cache that keeps every position, so that it can be copied
    cache = cache if kept else DynamicCache(config=None if compiled is not None else model.config)
    logits = prefill(model, inputs, cache)
    with ExitStack() as stack:
        if compiled is not None:
            length = compiled.cache_length(inputs.input_ids.shape[1] + (max_new_tokens or compiled.max_cache_len))
            cache = stack.enter_context(compiled.cache(cache, length, copy_back=kept))
            forward, masks = compiled.forward, compiled.decode_masks(inputs.attention_mask, length)
        else:
            forward, masks = model, growing_masks(inputs.attention_mask)
        yield from _token_loop(forward, logits, inputs, sampling, decide, cache, cache_keyword(model), masks,
                               compiled is not None and compiled.queues_ahead)


def start_host_copy(tokens: torch.Tensor) -> Callable[[], torch.Tensor]:
    """Start copying a GPU's `tokens` to the host now; the returned function waits for that copy alone and gives it.

    A read of the tokens themselves (`.tolist()`) is queued behind whatever was queued after them: behind the next
    step's forward pass, it would wait for that whole step, and the device would then idle while Python queues the
    one after."""
    if tokens.device.type != "cuda":
        return lambda: tokens
    copy = tokens.to("cpu", non_blocking=True)  # into pinned memory, queued now
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(tokens.device))

    def read_back() -> torch.Tensor:
        copied.synchronize()
        return copy

    return read_back


def _token_loop(forward, logits, inputs, sampling, decide, cache, keyword, masks,
                queue_ahead) -> Iterator[torch.Tensor]:
    """From the prefill's `logits`, sample and decode a step at a time. With `queue_ahead`, each step's forward pass
    is queued on the device before that step's tokens are read back for `decide`: the device never waits for Python
    between steps, and a stop costs the one step already queued."""
    processors = sampling.logits_processors()
    generator = sampling.random_generator(inputs.input_ids.device)
    seen_ids = inputs.input_ids
    positions = inputs.attention_mask.long().sum(dim=-1, keepdim=True)  # where each row's next token goes
    step_extra = inputs.family.decode()

    def forward_pass(tokens):
        nonlocal positions
        logits = decode_one(forward, tokens, next(masks), inputs.family.decode_positions(positions), cache, keyword,
                            **step_extra)
        positions = positions + 1
        return logits

    while True:
        tokens = sample_next(logits, seen_ids, sampling, processors, generator)
        shown = tokens
        if queue_ahead:
            read_back = start_host_copy(tokens)  # queued before the next step, so it waits for this one alone
            logits = forward_pass(tokens)
            shown = read_back()
        finished = decide(shown)  # in lockstep (never queued ahead: `shown` is `tokens`), may put rank 0's in it
        if processors:
            seen_ids = torch.cat([seen_ids, tokens[:, None]], dim=-1)
        yield shown  # after `decide`, so the consumer sees this step's text before the next forward pass
        if finished:
            return
        if not queue_ahead:
            logits = forward_pass(tokens)


class AnswerStream:
    """One answer: turns its tokens into text and takes every stop decision for it.

    `text` is what may be shown: it never holds a stop string nor ends with the start of one, and it only grows.
    It starts at the answer's first visible character: the space or newline a model puts after the template's
    "Response:" is not part of the answer (sentencepiece's decode drops that space too; byte-level tokenizers
    keep it).
    """

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        eos_ids: set[int],
        stop_strings: Sequence[str],
        max_new_tokens: int,
        cancel: threading.Event | None = None,
    ):
        self._detokenizer = IncrementalDetokenizer(decode)
        self._stops = StopStrings(stop_strings)
        self._eos_ids = eos_ids
        self._max_new_tokens = max_new_tokens
        self._cancel = cancel
        self._stopped = False
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.detokenize_time = 0.0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def cancelled(self) -> bool:
        return self._stopped or (self._cancel is not None and self._cancel.is_set())

    def cancel(self) -> None:
        """Make the next token end the answer as cancelled."""
        self._stopped = True

    def finish(self, reason: str) -> None:
        self.finish_reason = reason
        self.finished_at = time.perf_counter()

    def push(self, token_id: int) -> None:
        """Take the next sampled token; sets `finish_reason` when the answer is complete."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if self.cancelled():
            return self.finish("cancelled")
        if token_id in self._eos_ids:
            return self.finish("stop")
        self.token_ids.append(token_id)
        detokenize_started = time.perf_counter()
        self._detokenizer.add(token_id)
        self.detokenize_time += time.perf_counter() - detokenize_started
        full_text = self._detokenizer.text
        hit = self._stops.find(full_text)
        self.text = full_text[: hit if hit >= 0 else self._stops.safe_length(full_text)].lstrip()
        if hit >= 0:
            return self.finish("stop")
        if len(self.token_ids) >= self._max_new_tokens:
            self.finish("length")

    def summary(self, prompt_tokens: int) -> dict:
        """Token counts and timings for the last piece of a stream."""
        finished_at = self.finished_at or time.perf_counter()
        first = self.first_token_at or finished_at
        total = finished_at - self.started
        decode_time = finished_at - first
        completion = len(self.token_ids)
        return {
            "finish_reason": self.finish_reason,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "time_to_first_token": first - self.started,
            "total_time": total,
            "tokens_per_second": completion / total if total > 0 else 0.0,
            "decode_tokens_per_second": (completion - 1) / decode_time if completion > 1 and decode_time > 0 else 0.0,
            "detokenize_time": self.detokenize_time,
            "token_ids": list(self.token_ids),  # the answer's tokens (its stop token, if any, not among them)
        }


def batch_decider(streams: Sequence[AnswerStream]) -> Callable[[torch.Tensor], bool]:
    """The `decide` callback for a batch: pushes each row's token to its stream; True once all are done."""

    def decide(tokens: torch.Tensor) -> bool:
        for stream, token in zip(streams, tokens.tolist()):
            if not stream.done:
                stream.push(token)
        return all(stream.done for stream in streams)

    return decide
