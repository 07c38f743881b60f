"""The one generation path every front end stands on.

Short steps in the style of gpt-fast: `prefill` the prompt, `decode_one` token, and `generate_tokens`, a loop that
yields each step's tokens, chosen and settled by a `TokenChoice` (model/token_choice.py), which asks one `decide`
callback whether to stop.
`AnswerStream` (model/answer_stream.py) turns one row's tokens into answer text and is where every stop decision
for that row is taken (EOS, stop string, cancel, length); a tensor-parallel runner can take it on one rank and share
it. The decode steps over a static cache (`--compile`'s, and on CUDA the CUDA graphs') are model/compiled.py's.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .compiled import StaticDecoding
from .speculative import speculative_loop, why_no_speculation
from .token_choice import TokenChoice
from .vision_inputs import FamilyInputs


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
    choice: TokenChoice,
    cache=None,
    static: StaticDecoding | None = None,
    max_new_tokens: int | None = None,
    guesses: dict | None = None,
    draft=None,
) -> Iterator[torch.Tensor]:
    """Yield the tokens of every row, one step at a time, chosen by `choice` (model/token_choice.py: its grammar,
    sampling and seed, its log-probabilities), until `choice.settle(tokens)` says the rows are finished.

    `choice.settle` sees each step's tokens before the model computes anything more, so a stop (EOS, stop string,
    cancel, length) costs no further forward pass. Closing this generator also stops the model. `cache`, a
    session's dynamic cache, holds the prompt's first `inputs.cached` tokens and, after, every token fed.
    With `static` the decode steps run through its forward (compiled, or replayed from CUDA graphs) over a pooled
    static cache sized for `max_new_tokens` (None: the longest); on CUDA each is queued before the tokens it
    follows are read back (the GPU never waits for `settle`; a stop costs that one queued step, whose token is fed
    too, and `settle` must not change the tokens, so no lockstep). Where the GPU has no room left for the CUDA
    graphs' static cache, the answer decodes eagerly over its dynamic cache.
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
        if guesses is not None and why_no_speculation(model, choice.sampling, static, rows, inputs) is None:
            yield from speculative_loop(model, logits, inputs, choice, cache, cache_keyword(model), guesses, draft)
            return
        queue_ahead = static is not None and static.queues_ahead
        yield from _token_loop(forward, logits, inputs, choice, cache, cache_keyword(model), masks, queue_ahead)


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
    forward, logits, inputs, choice: TokenChoice, cache, keyword, masks, queue_ahead
) -> Iterator[torch.Tensor]:
    """From the prefill's `logits`, decide (`choice`) and decode a step at a time. With `queue_ahead`, each step's
    forward pass is queued on the device before that step's tokens are read back for `choice.settle`: the device
    never waits for Python between steps, and a stop costs the one step already queued."""
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
        tokens = choice.choose(logits)
        shown = tokens
        if queue_ahead:
            read_back = start_host_copy(tokens)  # queued before the next step, so it waits for this one alone
            logits = forward_pass(tokens)
            shown = read_back()
        # in lockstep (never queued ahead: `shown` is `tokens`), `settle` may put rank 0's in it
        finished = choice.settle(shown)
        yield shown  # after `settle`, so the consumer sees this step's text before the next forward pass
        if finished:
            return
        if not queue_ahead:
            logits = forward_pass(tokens)
