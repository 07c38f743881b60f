"""Constrained decoding: an answer that must follow a JSON schema (or be any JSON object) gets a token mask at every
step, so the model can only write what the schema allows, then its end. llguidance computes the masks
(`LLMatcher`, one per answer, over the model's tokenizer); bench/structured.py measured it beside xgrammar.

Compiled grammars are kept per model, the 64 used last (`MAX_GRAMMARS`); a schema that takes over a second to
compile, or passes llguidance's limits, is refused with a sentence naming the limit (the /v1 API's 400)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import torch

from local_chat.engine.interface import AnswerFormat
from local_chat.errors import UserError
from local_chat.prompting.answer_grammars import json_options

MAX_GRAMMARS = 64  # compiled grammars kept per model, the last used
MAX_COMPILE_S = 1.0  # a schema whose grammar takes longer to compile is refused


class Grammars:
    """The grammars one model's answers may be held to: compiled for its tokenizer once each, a fresh matcher per
    answer. `hf_tokenizer` must be a Hugging Face fast tokenizer; `vocab_size`, the width of the model's logits;
    `eos_ids`, the tokens that end an answer (the only ones allowed once the grammar is complete)."""

    def __init__(self, hf_tokenizer, vocab_size: int, eos_ids: set[int]):
        self._hf, self.vocab_size, self.eos_ids = hf_tokenizer, vocab_size, set(eos_ids)
        self._tokenizer = None
        self._compiled: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, answer_format: AnswerFormat):
        """A new `LLMatcher` at the start of `answer_format`'s grammar; `UserError` for a format it cannot hold."""
        key = answer_format.key
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = self._compile(answer_format)
                self._compiled[key] = compiled
                while len(self._compiled) > MAX_GRAMMARS:
                    self._compiled.popitem(last=False)
            self._compiled.move_to_end(key)
            return compiled.deep_copy()

    def _llg_tokenizer(self):
        import llguidance.hf

        if self._tokenizer is None:
            try:
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf, self.vocab_size, sorted(self.eos_ids) or None)
            except Exception as error:
                raise UserError(
                    f"This model's tokenizer ({type(self._hf).__name__}) cannot be used for a response_format "
                    f"({error}); ask without one."
                ) from error
        return self._tokenizer

    def _compile(self, answer_format: AnswerFormat):
        import llguidance

        tokenizer = self._llg_tokenizer()
        if answer_format.kind == "lark":
            grammar = llguidance.LLMatcher.grammar_from_lark(answer_format.grammar)
        else:
            schema = answer_format.held_schema
            try:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=json_options())
            except ValueError as error:
                raise UserError(f"The response_format's schema is not a JSON object ({error}).") from error
        started = time.perf_counter()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=_limits())
        seconds = time.perf_counter() - started
        if matcher.is_error():
            raise UserError(f"The response_format's schema cannot be enforced: {_first_line(matcher.get_error())}.")
        if seconds > MAX_COMPILE_S:
            raise UserError(
                f"The response_format's schema took {seconds:.1f} s to compile, over the {MAX_COMPILE_S:g} s limit; "
                "send a smaller schema."
            )
        return matcher


def _limits():
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


def _first_line(error: str) -> str:
    return error.strip().splitlines()[0].rstrip(".") if error.strip() else "unknown error"


def grammars_for(tokenizer, llma, eos_ids: set[int]) -> Grammars | None:
    """The `Grammars` of a model whose tokenizer llguidance can read (a Hugging Face fast tokenizer), else None (an
    Accessory or Meta sentencepiece tokenizer)."""
    hf = getattr(tokenizer, "hf", None)
    if hf is None or not getattr(hf, "is_fast", False):
        return None
    return Grammars(hf, llma.config.get_text_config().vocab_size, eos_ids)


class TokenMask:
    """The masks of a batch's rows at each step: a row with a matcher may only take the tokens its grammar allows
    next (once the grammar is complete, only one of `eos_ids`); a row without one, or whose answer has ended, is left
    as it is."""

    def __init__(self, matchers: list, eos_ids: set[int]):
        self.matchers, self.eos_ids = list(matchers), eos_ids
        self._bitmask = self._shifts = None

    def apply(self, logits: torch.Tensor) -> None:
        """Mask `logits` ([rows, vocab]) in place for this step."""
        import llguidance.torch as llg_torch

        if self._bitmask is None:
            self._bitmask = llg_torch.allocate_token_bitmask(len(self.matchers), logits.shape[-1])
            self._shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
        for row, matcher in enumerate(self.matchers):
            if matcher is None or matcher.is_error():
                self._bitmask[row].fill_(-1)
            else:
                llg_torch.fill_next_token_bitmask(matcher, self._bitmask, row)
        # the bits unpacked here: llguidance's own apply is a torch.compile'd kernel, whose first call (seconds on the
        # CPU) would fall in a user's first answer, and which took 250 us a step on a 4,096-token vocabulary (this: 70)
        words = self._bitmask.to(logits.device, non_blocking=True)
        allowed = ((words[:, :, None] >> self._shifts) & 1).bool().flatten(1)[:, : logits.shape[-1]]
        logits.masked_fill_(~allowed, float("-inf"))

    def guess_within(self, guess: list[int], most: int) -> list[int]:
        """For one row (speculative decoding's): the tokens its grammar forces from here, if any, else `guess`; cut to
        `most`, to the grammar's end tokens and to the longest start the grammar takes."""
        matcher = self.matchers[0]
        if matcher is None or matcher.is_error():
            return []
        guess = (matcher.compute_ff_tokens() or guess)[:most]
        before_end = next((i for i, token in enumerate(guess) if token in self.eos_ids), len(guess))
        return guess[: matcher.validate_tokens(guess[:before_end])]

    def apply_along(self, logits: torch.Tensor, guess: list[int]) -> None:
        """For one row: mask `logits` ([len(guess) + 1, vocab], the places after the decided token and after each
        of `guess`'s, which `guess_within` gave) as its grammar will stand at each place; the grammar is left where
        it was."""
        matcher = self.matchers[0]
        for place, token in enumerate(guess):
            self.apply(logits[place : place + 1])
            matcher.consume_token(token)
        self.apply(logits[len(guess) :])
        matcher.rollback(len(guess))

    def advance(self, tokens: torch.Tensor) -> None:
        """Each row's grammar takes the token its row was given; a row given an end token has ended."""
        for row, token in enumerate(tokens.tolist()):
            if token in self.eos_ids:
                self.matchers[row] = None
            elif self.matchers[row] is not None:
                self.matchers[row].consume_token(token)


def apply_together(logits: torch.Tensor, masks: list[TokenMask | None]) -> None:
    """Mask each row of `logits` ([rows, vocab]) by its own one-row `TokenMask` (None: a row left free), in one pass
    over the rows held to a grammar (the step batch's: unpacking each row's bits alone cost it 0.1 ms a row)."""
    held = [i for i, mask in enumerate(masks) if mask is not None]
    if not held:
        return
    index = torch.tensor(held, device=logits.device)
    rows = logits.index_select(0, index)
    TokenMask([masks[i].matchers[0] for i in held], set()).apply(rows)
    logits.index_copy_(0, index, rows)


NO_GRAMMARS = (
    "This model's tokenizer (an Accessory or Meta checkpoint's sentencepiece tokenizer) cannot be held to a "
    "response_format; load the model as a Hugging Face folder, or ask without response_format."
)


def token_mask(grammars: Grammars | None, formats: list[AnswerFormat | None]) -> TokenMask | None:
    """The `TokenMask` of a batch whose rows must follow `formats` (None: a row left free); None where none must.
    A row ends at one of the grammars' end tokens. `UserError` where a format cannot be held: a model without
    `grammars`, a schema refused."""
    if not any(formats):
        return None
    if grammars is None:
        raise UserError(NO_GRAMMARS)
    return TokenMask([grammars.matcher(f) if f is not None else None for f in formats], grammars.eos_ids)
