"""How a step's tokens are decided, for every loop that makes them: the plain loop (model/generation.py, which also
serves the compiled and tensor-parallel paths), speculative decoding's checker (model/speculative.py) and the step
batch (model/step_batch.py, one `TokenChoice` per row).

A step is two calls. `choose(logits)`: the grammar's mask (model/constraints.py), the logits processors (repetition
penalty, temperature, top-k, top-p), a draw with the answer's own generator (its seed), and the log-probabilities
recorded. `settle(tokens)`: `decide` (each row's `AnswerStream`, model/answer_stream.py: the end-of-answer tokens,
stop strings, Stop and the length, with the typed `FinishReason`), then the grammar and the penalty's seen tokens
moved past the tokens as `decide` leaves them (in lockstep, rank 0's). transformers' continuous batch
(model/batching.py) samples on its own: it takes only the answers its sampler gives exactly.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from local_chat.engine.interface import Sampling

from .constraints import TokenMask


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


def sample_next(logits, seen_ids, sampling: Sampling, processors, generators: list) -> torch.Tensor:
    """Pick one token per row from the last logits, each row drawn with its own generator of `generators` (so that
    a seeded row draws in a batch what it draws alone)."""
    scores = processors(seen_ids, logits.float()) if processors else logits
    if sampling.greedy:
        return scores.argmax(dim=-1)
    probs = torch.softmax(scores.float(), dim=-1)
    if len(generators) == 1:
        return torch.multinomial(probs, num_samples=1, generator=generators[0]).squeeze(1)
    return torch.cat([torch.multinomial(probs[i : i + 1], 1, generator=g) for i, g in enumerate(generators)])[:, 0]


class TokenChoice:
    """The decisions of one answer's rows (rows that share their sampling: one answer, or a left-padded batch of
    them) at every step. `prompt_ids`: the rows' prompts, which a repetition penalty counts; `decide(tokens)`:
    whether every row is finished, given the step's tokens; `mask`: the rows' grammars, if any; `observe(logits,
    tokens)`: sees each step's logits and tokens (log-probabilities are recorded there)."""

    def __init__(
        self,
        sampling: Sampling,
        prompt_ids: torch.Tensor,
        decide: Callable[[torch.Tensor], bool],
        mask: TokenMask | None = None,
        observe: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    ):
        self.sampling, self.decide, self.mask, self.observe = sampling, decide, mask, observe
        self.processors = logits_processors(sampling)
        # one per row, each seeded alike where the request has a seed (a row draws what it would draw alone)
        self.generators = [random_generator(sampling, prompt_ids.device) for _ in range(prompt_ids.shape[0])]
        self.seen_ids = prompt_ids if sampling.repetition_penalty != 1.0 else None

    @property
    def generator(self) -> torch.Generator | None:
        """A single row's (speculative decoding's checker draws with it)."""
        return self.generators[0]

    def choose(self, logits: torch.Tensor, masked: bool = False) -> torch.Tensor:
        """Each row's token from its next-token `logits` ([rows, vocabulary]; masked in place, unless `masked`
        already: the step batch masks its rows together, `apply_together`)."""
        if self.mask is not None and not masked:
            self.mask.apply(logits)
        tokens = sample_next(logits, self.seen_ids, self.sampling, self.processors, self.generators)
        if self.observe is not None:
            self.observe(logits, tokens)
        return tokens

    def settle(self, tokens: torch.Tensor) -> bool:
        """Whether the rows are finished with `tokens` (`decide`'s answer; in lockstep it may put rank 0's tokens in
        them); where they go on, the grammar and the seen tokens move past them."""
        finished = self.decide(tokens)
        if not finished and self.mask is not None:
            self.mask.advance(tokens)
        if self.seen_ids is not None:
            self.seen_ids = torch.cat([self.seen_ids, tokens.to(self.seen_ids.device)[:, None]], dim=-1)
        return finished
