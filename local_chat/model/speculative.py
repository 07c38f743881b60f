"""Speculative decoding from the prompt (--speculative ngram): several tokens per forward pass where the answer
repeats what came before (a quoted document, code being edited, a summary), the same tokens as plain decoding.

At each step the answer's latest tokens are looked up among every token so far (prompt and answer): where the last
few (an n-gram, the longest of `NGRAM_SIZES` found) appeared before, the tokens that followed them are the guess
(`NgramGuesser`, as transformers' prompt lookup and vLLM's n-gram speculation guess). The step feeds the model the
token just decided and the guess in one forward pass; each guessed token whose position's greedy choice it is, from
the first on, is accepted, and the first choice that differs is the next token, decided for free. The KV cache is cut
back past the rejected guesses. Every accepted token goes through the answer's `decide` one at a time, as plain
decoding's do, so stops, stop strings and Stop act inside a guessed run exactly as outside it (a stop mid-run cuts
the cache back to the tokens before it).

With --draft_model, a small model of the same tokenizer guesses instead (`DraftGuesser`: its greedy continuation).
A sampled answer checks its guesses by the rule of speculative sampling (`Checker`): its tokens are distributed as
plain sampling's (not the same draws: a seed repeats an answer only with the same --speculative). An answer held to a
grammar (a JSON schema) guesses the tokens the grammar forces (llguidance's fast-forward tokens: a schema's keys and
punctuation) or its n-gram guess cut to what the grammar takes, and each checked place is masked as the grammar
stands there. Answers one at a time only (the batch, a repetition penalty, a static cache, tensor parallel, a vision
family's decode inputs and layers that cannot be cut back keep plain decoding: `why_no_speculation`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from transformers import DynamicCache

from .prefix_cache import common_prefix_length
from .token_choice import TokenChoice

NGRAM_SIZES = (4, 3)  # the n-grams looked up, longest first (a 2-gram recurs by chance too often)
FIRST_GUESS, MAX_GUESS = 4, 16  # tokens guessed per step: at first, and at most (each step: 2 more after a guess
# taken whole, 1 fewer after one that was not, as transformers' assisted generation schedules it)


class NgramGuesser:
    """The guesses for an answer whose tokens so far (prompt and answer) are `ids`: an index of every n-gram's latest
    end, kept up to date as tokens come (`add`). Once a guess is taken, the next one goes on from where it came from
    for as long as the answer keeps following it (a quoted passage is followed to its end, not left for a later
    place where its last words also appear)."""

    def __init__(self, ids: list[int]):
        self.ids: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> where its latest occurrence ends (exclusive)
        self._follow: int | None = None  # where the tokens the answer follows go on
        self.add(ids)

    def add(self, tokens: list[int]) -> None:
        for token in tokens:
            if self._follow is not None:  # still following: the token is the next of the place followed
                self._follow = self._follow + 1 if self.ids[self._follow] == token else None
            self.ids.append(token)
            end = len(self.ids)
            for n in NGRAM_SIZES:
                if end > n:  # the n-gram ending one token back: the token after it is known
                    self._ends[tuple(self.ids[end - 1 - n : end - 1])] = end - 1

    def guess(self, most: int = MAX_GUESS) -> list[int]:
        """The tokens that follow the place the answer follows, else those that followed the latest earlier
        occurrence of the longest n-gram the ids end with."""
        if self._follow is None:
            for n in NGRAM_SIZES:
                if len(self.ids) > n and (end := self._ends.get(tuple(self.ids[-n:]))) is not None:
                    self._follow = end
                    break
        return self.ids[self._follow : self._follow + most] if self._follow is not None else []


class DraftGuesser:
    """The guesses of a small model of the same tokenizer (--draft_model): its greedy continuation of the answer's
    tokens so far, over a KV cache of its own kept in step with them (cut back to what they still share)."""

    def __init__(self, draft, ids: list[int]):
        from .generation import cache_keyword

        self.draft, self.ids, self.keyword = draft, list(ids), cache_keyword(draft)
        self._cache = DynamicCache()
        self._cached: list[int] = []  # the tokens whose keys and values the draft's cache holds

    def add(self, tokens: list[int]) -> None:
        self.ids.extend(tokens)

    @torch.inference_mode()
    def guess(self, most: int = MAX_GUESS) -> list[int]:
        kept = min(common_prefix_length(self._cached, self.ids), len(self.ids) - 1)
        _cut(self._cache, kept)
        fed, guess = self.ids[kept:], []
        for _ in range(most):
            guess.append(int(self._next_logits(fed).argmax()))
            fed = guess[-1:]
        self._cached = self.ids + guess[:-1]
        return guess

    def _next_logits(self, tokens: list[int]) -> torch.Tensor:
        start = self._cache.get_seq_length()
        device = self.draft.device
        positions = torch.arange(start, start + len(tokens), device=device)[None]
        out = self.draft(input_ids=torch.tensor([tokens], device=device), position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self.keyword: self._cache})  # fmt: skip
        return out.logits[0, -1]


def why_no_speculation(model, sampling, static, rows: int, inputs) -> str | None:
    """Why an answer decodes one token per pass, or None where it can guess."""
    if sampling.repetition_penalty != 1.0:
        return "a repetition penalty"
    if static is not None:
        return "a static cache"
    if rows != 1:
        return "a batch"
    if inputs.family.decode():
        return "a vision family's decode inputs"
    config = model.config.get_text_config()
    if set(getattr(config, "layer_types", None) or ["full_attention"]) != {"full_attention"}:
        return "layers that cannot be cut back"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window layers"
    return None


class Checker:
    """How a guess is checked, so that answers keep the model's own tokens: greedy, each guessed token must be the
    model's choice at its place; sampled, the standard rule for a guess that is certain (speculative sampling): each
    is taken with the probability the model gives it there, and where one is refused the next token is drawn from the
    model's distribution without it, so every token is distributed as plain sampling's."""

    def __init__(self, choice: TokenChoice):
        self.greedy = choice.sampling.greedy
        self.processors, self.generator = choice.processors, choice.generator  # the answer's own, as plain decoding's

    def first(self, logits: torch.Tensor) -> torch.Tensor:
        """The token chosen from one position's `logits` ([1, vocabulary])."""
        if self.greedy:
            return logits.argmax(dim=-1)
        return torch.multinomial(self._probabilities(logits), 1, generator=self.generator)[:, 0]

    def check(self, logits: torch.Tensor, guess: list[int]) -> tuple[int, int]:
        """(how many guessed tokens are taken, the token after them) from the logits of the decided token's place
        and of each guessed token's (`logits[i]` chooses the token after the i-th fed)."""
        if self.greedy:
            choices = logits.argmax(dim=-1).tolist()
            taken = 0
            while taken < len(guess) and choices[taken] == guess[taken]:
                taken += 1
            return taken, choices[taken]
        probabilities = self._probabilities(logits)
        draws = torch.rand(len(guess), generator=self.generator, device=logits.device).tolist()
        for taken, token in enumerate(guess):
            if draws[taken] >= float(probabilities[taken, token]):  # refused: drawn again, without it
                rest = probabilities[taken].clone()
                rest[token] = 0
                return taken, int(torch.multinomial(rest / rest.sum(), 1, generator=self.generator))
        return len(guess), int(torch.multinomial(probabilities[len(guess)], 1, generator=self.generator))

    def _probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.processors(None, logits.float()), dim=-1)


@torch.inference_mode()
def speculative_loop(
    forward, logits, inputs, choice: TokenChoice, cache, keyword: str, figures: dict | None = None, draft=None
) -> Iterator[torch.Tensor]:
    """`_token_loop`'s steps (model/generation.py), each feeding the decided token and its guess at once (the
    prompt's n-grams', or the `draft` model's), checked by a `Checker` over `choice`'s processors and generator, and
    each token taken settled by `choice` as plain decoding's are. `figures`, if given, counts the guessed tokens
    ("guessed") and those taken ("accepted"). With a grammar (`choice.mask`, one row's), the guess is the tokens the
    grammar forces, else the guess cut to what the grammar takes, and each place's logits are masked as the grammar
    stands there."""
    ids = inputs.input_ids[0].tolist()
    guesser = DraftGuesser(draft, ids) if draft is not None else NgramGuesser(ids)
    checker = Checker(choice)
    grammar_mask, observe = choice.mask, choice.observe
    most = FIRST_GUESS
    mask = inputs.attention_mask
    position = int(mask.sum())
    ones = mask.new_ones((1, 1 + MAX_GUESS))
    counts = figures if figures is not None else {}
    counts.setdefault("guessed", 0), counts.setdefault("accepted", 0)
    if grammar_mask is not None:
        grammar_mask.apply(logits)
    token = checker.first(logits)
    while True:
        if observe is not None:
            observe(logits, token)
        finished = choice.settle(token)
        yield token
        if finished:
            return
        decided = int(token[0])
        guesser.add([decided])
        guess = guesser.guess(most)
        if grammar_mask is not None:
            guess = grammar_mask.guess_within(guess, max(most, 1))
        fed = torch.tensor([[decided, *guess]], device=token.device)
        mask = torch.cat([mask, ones[:, : fed.shape[1]]], dim=-1)
        positions = torch.arange(position, position + fed.shape[1], device=token.device)[None]
        out = forward(input_ids=fed, attention_mask=mask, position_ids=positions, use_cache=True,
                      logits_to_keep=fed.shape[1], **{keyword: cache})  # fmt: skip
        step_logits = out.logits[0]
        if grammar_mask is not None:
            grammar_mask.apply_along(step_logits, guess)
        accepted, following = checker.check(step_logits, guess)
        counts["guessed"] += len(guess)
        counts["accepted"] += accepted
        if guess:
            most = min(MAX_GUESS, most + 2) if accepted == len(guess) else max(1, most - 1)
        for index in range(accepted):  # each accepted guess, as plain decoding would have decided it
            token = fed[0, 1 + index : 2 + index]
            if observe is not None:
                observe(step_logits[index : index + 1], token)
            finished = choice.settle(token)
            try:
                yield token
            except GeneratorExit:  # the reader left (for the batch, say): the cache keeps the tokens before this one
                _cut(cache, position + 1 + index)
                raise
            if finished:  # the same
                _cut(cache, position + 1 + index)
                return
        guesser.add(guess[:accepted])
        position += 1 + accepted
        _cut(cache, position)
        mask = mask[:, :position]
        logits = step_logits[accepted : accepted + 1]
        token = torch.tensor([following], device=token.device)


def _cut(cache, length: int) -> None:
    """`cache` cut back to its first `length` tokens (the rejected guesses' keys and values gone)."""
    surplus = cache.get_seq_length() - length
    if surplus > 0:
        for layer in cache.layers:
            layer.crop(-surplus)
