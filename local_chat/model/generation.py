"""The one generation path every front end stands on.

Short steps in the style of gpt-fast: `prefill` the prompt, `decode_one` token, `sample_next`, and
`generate_tokens`, a loop that yields each step's tokens and asks one `decide` callback whether to stop.
`AnswerStream` (model/answer_stream.py) turns one row's tokens into answer text and is where every stop decision
for that row is taken (EOS, stop string, cancel, length); a tensor-parallel runner can take it on one rank and share
it. The decode steps over a static cache (`--compile`'s, and on CUDA the CUDA graphs') are model/compiled.py's.
"""

from __future__ import annotations

import functools
import inspect
import secrets
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from local_chat.engine.interface import Sampling

from .compiled import StaticDecoding
from .constraints import TokenMask, decided_within
from .speculative import speculative_loop, why_no_speculation
from .vision_inputs import FamilyInputs


def logits_processors(sampling: Sampling) -> LogitsProcessorList:
    processors = LogitsProcessorList()
    if sampling.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty))
    if not sampling.greedy:
        processors.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k > 0:
            processors.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            processors.append(TopPLogitsWarper(sampling.top_p))
    return processors


def random_generator(sampling: Sampling, device: torch.device) -> torch.Generator | None:
    """A generator seeded per request, so every rank (and every rerun with the same seed) samples alike."""
    if sampling.greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(sampling.seed if sampling.seed is not None else secrets.randbits(63))
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
    out = forward(
        input_ids=input_ids,
        attention_mask=attention_mask,
        use_cache=True,
        logits_to_keep=1,
        **{keyword: cache},
        **extra,
    )
    return out.logits[:, -1, :]


def prefill(model, inputs: ModelInputs, cache) -> torch.Tensor:
    """Run the prompt (after its `cached` tokens) through the model, filling `cache`; return the next-token logits
    of each row."""
    extra = inputs.extra
    positions = extra.pop("position_ids", None)
    if positions is None:
        positions = _prefill_position_ids(inputs.attention_mask)
        positions = None if positions is None else positions[:, inputs.cached :]
    return _last_logits(
        model,
        inputs.input_ids[:, inputs.cached :],
        inputs.attention_mask,
        cache,
        cache_keyword(model),
        positions,
        **extra,
    )


def decode_one(
    forward, tokens: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor, cache, keyword: str, **extra
):
    """Feed one token per row at `positions` ([rows, 1]); `attention_mask` already covers it. `keyword` is the
    forward's name for the cache (`cache_keyword`); `extra`, what a vision family's decode steps take besides."""
    return _last_logits(forward, tokens[:, None], attention_mask, cache, keyword, positions, **extra)


def sample_next(logits, seen_ids, sampling: Sampling, processors, generator) -> torch.Tensor:
    """Pick one token per row from the last logits."""
    scores = processors(seen_ids, logits.float()) if processors else logits
    if sampling.greedy:
        return scores.argmax(dim=-1)
    probs = torch.softmax(scores.float(), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


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
    sampling: Sampling,
    decide: Callable[[torch.Tensor], bool],
    cache=None,
    static: StaticDecoding | None = None,
    max_new_tokens: int | None = None,
    observe: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    mask: TokenMask | None = None,
    guesses: dict | None = None,
    draft=None,
) -> Iterator[torch.Tensor]:
    """Yield the sampled tokens of every row, one step at a time, until `decide(tokens)` returns True.

    `decide` sees each step's tokens before the model computes anything more, so a stop (EOS, stop string,
    cancel, length) costs no further forward pass. Closing this generator also stops the model. `cache`, a
    session's dynamic cache, holds the prompt's first `inputs.cached` tokens and, after, every token fed.
    With `static` the decode steps run through its forward (compiled, or replayed from CUDA graphs) over a pooled
    static cache sized for `max_new_tokens` (None: the longest); on CUDA each is queued before the tokens it
    follows are read back (the GPU never waits for `decide`; a stop costs that one queued step, whose token is fed
    too, and `decide` must not change the tokens, so no lockstep). Where the GPU has no room left for the CUDA
    graphs' static cache, the answer decodes eagerly over its dynamic cache. `observe(logits, tokens)`, if given,
    sees each step's logits and the tokens sampled from them, before `decide` does (log-probabilities are computed
    there). `mask`, where an answer must follow a grammar (model/constraints.py), masks each step's logits before
    anything else sees them, and takes each step's tokens as `decide` leaves them (in lockstep, rank 0's).
    `guesses`, where given (--speculative ngram), lets an answer guess several tokens per forward pass
    (model/speculative.py: the same tokens, or for a sampled answer the same distribution) and counts them into it:
    "guessed", "accepted"; `draft`: a small model of the same tokenizer that guesses instead (--draft_model).
    """
    kept = cache is not None
    # a model with sliding-window layers prefills into a cache that keeps every position, so that it can be copied
    cache = cache if kept else DynamicCache(config=None if static is not None else model.config)
    logits = prefill(model, inputs, cache)
    with ExitStack() as stack:
        static_cache = None
        if static is not None:
            length = static.cache_length(inputs.input_ids.shape[1] + (max_new_tokens or static.max_cache_len))
            static_cache = _static_cache(stack, static, cache, length, kept)
        if static_cache is not None:
            cache, forward, masks = static_cache, static.forward, static.decode_masks(inputs.attention_mask, length)
        else:
            static = None
            forward, masks = model, growing_masks(inputs.attention_mask)
        rows = inputs.input_ids.shape[0]
        if guesses is not None and why_no_speculation(model, sampling, static, rows, inputs) is None:
            yield from speculative_loop(
                model, logits, inputs, sampling, decide, cache, cache_keyword(model), observe, guesses, draft, mask
            )
            return
        yield from _token_loop(
            forward,
            logits,
            inputs,
            sampling,
            decide,
            cache,
            cache_keyword(model),
            masks,
            static is not None and static.queues_ahead,
            observe,
            mask,
        )


def _static_cache(stack: ExitStack, static: StaticDecoding, prefilled, length: int, copy_back: bool):
    """A pooled static cache holding what `prefilled` holds, for as long as `stack` is open; None where it does not
    fit in the GPU's memory and `static` can do without (the CUDA graphs: the answer decodes eagerly instead)."""
    try:
        return stack.enter_context(static.cache(prefilled, length, copy_back))
    except torch.OutOfMemoryError:
        if not static.optional:
            raise
        print(
            f"note: no GPU memory left for a {length}-token static cache: this answer decodes without CUDA graphs.",
            file=sys.stderr,
            flush=True,
        )
        return None


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


def _token_loop(
    forward, logits, inputs, sampling, decide, cache, keyword, masks, queue_ahead, observe, grammar_mask
) -> Iterator[torch.Tensor]:
    """From the prefill's `logits`, sample and decode a step at a time. With `queue_ahead`, each step's forward pass
    is queued on the device before that step's tokens are read back for `decide`: the device never waits for Python
    between steps, and a stop costs the one step already queued."""
    processors = logits_processors(sampling)
    generator = random_generator(sampling, inputs.input_ids.device)
    seen_ids = inputs.input_ids
    positions = inputs.attention_mask.long().sum(dim=-1, keepdim=True)  # where each row's next token goes
    step_extra = inputs.family.decode()

    def forward_pass(tokens):
        nonlocal positions
        logits = decode_one(
            forward, tokens, next(masks), inputs.family.decode_positions(positions), cache, keyword, **step_extra
        )
        positions = positions + 1
        return logits

    while True:
        if grammar_mask is not None:
            grammar_mask.apply(logits)
        tokens = sample_next(logits, seen_ids, sampling, processors, generator)
        if observe is not None:
            observe(logits, tokens)
        shown = tokens
        if queue_ahead:
            read_back = start_host_copy(tokens)  # queued before the next step, so it waits for this one alone
            logits = forward_pass(tokens)
            shown = read_back()
        # in lockstep (never queued ahead: `shown` is `tokens`), `decide` may put rank 0's in it
        finished = decided_within(decide, shown, grammar_mask)
        if processors:
            seen_ids = torch.cat([seen_ids, tokens[:, None]], dim=-1)
        yield shown  # after `decide`, so the consumer sees this step's text before the next forward pass
        if finished:
            return
        if not queue_ahead:
            logits = forward_pass(tokens)
