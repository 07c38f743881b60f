"""An answer as it streams: new tokens in, text out (incremental detokenizing, stop strings held back and cut),
with its finish reason, token counts and timings; and the stop decision for a batch of answers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch

from local_chat.engine.interface import Delta, FinishReason, TokenLogprob
from local_chat.errors import UserError

from .detokenize import IncrementalDetokenizer, StopStrings


class AnswerStream:
    """One answer: turns its tokens into text and takes every stop decision for it.

    `text` is what may be shown: it never holds a stop string nor ends with the start of one, and it only grows.
    It starts at the answer's first visible character: the space or newline a model puts after the template's
    "Response:" is not part of the answer (sentencepiece's decode drops that space too; byte-level tokenizers
    keep it). The step batch pushes tokens on its own thread while the answer's reader reads: a lock keeps each
    push, and each read, whole.
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
        self.eos_ids = eos_ids  # the tokens that end it (a batch that stops rows itself is told them too)
        self.max_new_tokens = max_new_tokens
        self._cancel = cancel
        self.guesses: dict[str, int] = {}  # speculative decoding's counts (model/speculative.py), where it guessed
        self._stopped = False
        self.token_ids: list[int] = []
        self.token_ends: list[int] = []  # where each token's text ends in the detokenized text
        self.logprobs: list = []  # each sampled token's TokenLogprob, when the request asked (see `sent_tokens`)
        self.text = ""
        self._visible_end = 0  # where `text` ends in the detokenized text
        self.finish_reason: FinishReason | None = None
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.cached_tokens = 0  # prompt tokens a session's cache held (set where a batch prefilled the prompt)
        self.detokenize_time = 0.0
        self._delivered = (0, 0)  # the characters of `text` and the tokens `next_delta` gave so far
        self._lock = threading.RLock()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def cancelled(self) -> bool:
        return self._stopped or (self._cancel is not None and self._cancel.is_set())

    def cancel(self) -> None:
        """Make the next token end the answer as cancelled."""
        self._stopped = True

    def finish(self, reason: FinishReason) -> None:
        with self._lock:
            if self.finish_reason is None:
                self.finish_reason = reason
                self.finished_at = time.perf_counter()

    def push(self, token_id: int) -> None:
        """Take the next sampled token; sets `finish_reason` when the answer is complete (a token after that is
        not taken)."""
        with self._lock:
            if not self.done:
                self._take(token_id)

    def _take(self, token_id: int) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if self.cancelled():
            return self.finish(FinishReason.CANCELLED)
        if token_id in self.eos_ids:
            return self.finish(FinishReason.STOP)
        self.token_ids.append(token_id)
        detokenize_started = time.perf_counter()
        self._detokenizer.add(token_id)
        self.detokenize_time += time.perf_counter() - detokenize_started
        full_text = self._detokenizer.text
        self.token_ends.append(len(full_text))
        hit = self._stops.find(full_text)
        self._visible_end = hit if hit >= 0 else self._stops.safe_length(full_text)
        self.text = full_text[: self._visible_end].lstrip()
        if hit >= 0:
            return self.finish(FinishReason.STOP)
        if len(self.token_ids) >= self.max_new_tokens:
            self.finish(FinishReason.LENGTH)

    def sent_tokens(self) -> int:
        """How many of the answer's tokens `text` shows: while it streams, those whose text it holds whole; once done,
        also the one it shows a part of (the text before a stop string that starts inside a token)."""
        if self.done:
            starts = [0, *self.token_ends[:-1]]
            return sum(1 for start in starts if start < self._visible_end) if self.token_ends else 0
        return sum(1 for end in self.token_ends if end <= self._visible_end)

    def next_delta(self, with_logprobs: bool) -> Delta | None:
        """What `text` shows since the last call (and, `with_logprobs`, the log-probabilities of the tokens it came
        from: `sent_tokens`), as one `Delta`; None where nothing is new."""
        with self._lock:
            characters, tokens = self._delivered
            shown_tokens = self.sent_tokens() if with_logprobs else 0
            if len(self.text) <= characters and shown_tokens <= tokens:
                return None
            self._delivered = (len(self.text), shown_tokens)
            return Delta(self.text[characters:], self.logprobs[tokens:shown_tokens])

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
            "guessed_tokens": self.guesses.get("guessed", 0),
            "accepted_tokens": self.guesses.get("accepted", 0),
        }


def answer_room(max_seq_len: int, prompt_tokens: int, max_gen_len: int) -> int:
    """How many tokens an answer to a prompt of `prompt_tokens` may have: `max_gen_len`, clamped to what the
    `max_seq_len`-token context leaves."""
    if not max_gen_len >= 1:
        raise UserError(f"The answer length (max_gen_len) is {max_gen_len}; ask for at least 1 token.")
    room = max_seq_len - prompt_tokens
    if room < 1:
        raise UserError(
            f"The prompt is {prompt_tokens} tokens long and leaves no room for an answer within the "
            f"{max_seq_len}-token context; shorten it or start a new conversation."
        )
    return max(1, min(max_gen_len, room))


def batch_decider(streams: Sequence[AnswerStream]) -> Callable[[torch.Tensor], bool]:
    """The `decide` callback for a batch: pushes each row's token to its stream; True once all are done."""

    def decide(tokens: torch.Tensor) -> bool:
        for stream, token in zip(streams, tokens.tolist()):
            if not stream.done:
                stream.push(token)
        return all(stream.done for stream in streams)

    return decide


def logprob_recorder(stream: AnswerStream, top: int, decode: Callable[[list[int]], str]):
    """The `observe` callback of `generate_tokens` that records each sampled token's log-probability in `stream`, with
    the `top` likeliest tokens."""

    def observe(logits: torch.Tensor, tokens: torch.Tensor) -> None:
        scores = torch.log_softmax(logits[0].float(), dim=-1)
        token = int(tokens[0])
        best = scores.topk(top) if top else None
        alternatives = [] if best is None else list(zip(best.indices.tolist(), best.values.tolist()))
        stream.logprobs.append(
            TokenLogprob(token, decode([token]), float(scores[token]), [(decode([i]), v) for i, v in alternatives])
        )

    return observe


class AnswersInFlight:
    """How many answers a model is computing now (`count`); `one_more()` counts one while it runs."""

    def __init__(self):
        self.count = 0
        self._lock = threading.Lock()

    @contextmanager
    def one_more(self):
        """Count an answer while it runs; gives how many others were running."""
        with self._lock:
            others = self.count
            self.count += 1
        try:
            yield others
        finally:
            with self._lock:
                self.count -= 1
