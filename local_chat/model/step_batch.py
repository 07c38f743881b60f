"""A batch of our own, whose rows each decide their tokens as the one-at-a-time path does (a `TokenChoice` per row,
model/token_choice.py: its own grammar, seed, repetition penalty and log-probabilities). It runs the answers
transformers' continuous batch cannot give (held to a grammar, with log-probabilities, a seed or a penalty, about an
image) beside it, and every answer of the models that batch cannot run: multi-head latent attention (DeepSeek V3,
Kimi K2, GLM-4.7-Flash: their cache holds latents whose keys and values differ in width), hybrid models whose layers
keep a running state (Mamba's, linear attention's, LFM2's convolutions: Granite 4, Nemotron-H, Qwen3.5, LFM2) and
models whose layers differ in head size (Gemma 4).

It runs over the model's own cache (transformers' `DynamicCache` and its layers, as the one-at-a-time path does):
each answer that joins is prefilled alone (with its image, where it has one), from its session's cache where it
has one (so a conversation's earlier turns are not computed again), and its cache becomes one more row of the
batch's, left-padded to the longest row (a running state has no length: its rows are simply stacked). Every step
then feeds one token per row, each at its own position (Qwen2-VL's 3-D positions too), with a mask over the padding,
through the model's ordinary forward. Each row's token is settled on the batch's thread by its `TokenChoice`, whose
`AnswerStream` takes every stop decision (an end-of-answer token, a stop string, Stop, the length); a row leaves at
the step boundary after its answer ended, or once its reader left (a closed connection); its cache goes back to its
session, and the padding no row needs is dropped. A family whose decode steps take more than a token and a position
(Mllama's cross-attention mask) keeps the one-at-a-time path.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

from local_chat.engine.interface import FinishReason
from local_chat.errors import described

from .batching import AnswerRow, BatchFailed, forwards_take_turns, outputs_until_done
from .constraints import apply_together
from .cpu_threads import hand_back_workers
from .generation import cache_keyword, decode_one, prefill
from .prefix_cache import keeps_states, media_key
from .session_cache import SessionCaches


def why_no_step_batch(llma) -> str | None:
    """Which part of the model the step batch cannot run (it stacks each layer's cache as the sessions keep it:
    every position's keys and values, or a running state), or None."""
    kinds = set(getattr(llma.config.get_text_config(), "layer_types", None) or ())
    if "indexed_attention" in kinds:
        return "its indexed (sparse) attention layers"
    if keeps_states(llma.config) and kinds & {"sliding_attention", "chunked_attention", "hybrid_sliding"}:
        return "its sliding-window layers beside layers that keep a running state"
    return None


@dataclass(eq=False)  # rows are told apart by identity
class _Row:
    """One answer in the batch: what the batch thread keeps of it."""

    answer: AnswerRow
    outputs: queue.Queue  # its tokens, then `_Left` once it left the batch, or the exception that failed it
    session: object = None  # the key its cache is kept under after (`SessionCaches.take` gives it)
    media: str | None = None  # its images' and clips' key, for its session's cache
    sampled: list[int] = field(default_factory=list)
    length: int = 0  # tokens its cache holds
    leaving: bool = False  # its answer ended, or its reader is done with it

    @property
    def inputs(self):
        return self.answer.inputs

    @property
    def next_token(self) -> int:
        return self.sampled[-1]

    def gone(self) -> bool:
        return self.leaving or self.answer.stream.cancelled()


class StepBatcher:
    """Answers computed together one step at a time over the model's own cache, on one thread of their own."""

    def __init__(self, llma, sessions: SessionCaches, places: int, cache_tokens: int, why_not_paged: str = ""):
        self.llma, self.sessions, self.places, self.cache_tokens = llma, sessions, places, cache_tokens
        self.why_not_paged = why_not_paged  # why transformers' continuous batching does not run it
        self._keyword = cache_keyword(llma)
        self._joining: queue.Queue = queue.Queue()
        self._rows: list[_Row] = []
        self._cache = None
        self._length = 0  # the batch cache's length: its longest row's, the others left-padded to it
        self._stopping = threading.Event()
        self.answers = 0  # how many answers the batch took
        self._forwards_alone_again = forwards_take_turns(llma)
        self._thread = threading.Thread(target=self._run, name="step-batch", daemon=True)
        self._thread.start()

    def describe(self) -> str:
        return (
            f"a step batch over the model's own cache, up to {self.places} answers per step, {self.cache_tokens} "
            f"tokens of cache (transformers' continuous batching cannot run this model: {self.why_not_paged})"
            + self.images_note()
        )

    def images_note(self) -> str:
        """What the model panel says of answers about an image, where they cannot join ("" where they can)."""
        if not self.sessions.cross_attention_layers:
            return ""
        return "; answers about an image run on their own (this family's decode steps take a cross-attention mask)"

    @staticmethod
    def why_not(row: AnswerRow) -> str | None:
        """Why an answer cannot be computed in this batch (each row decides its tokens on its own: grammars, seeds,
        penalties and log-probabilities are its own), or None."""
        if extra := row.inputs.family.decode():
            return f"this family's decode steps take its {', '.join(sorted(extra))} too"
        return None

    def stop(self) -> None:
        self._stopping.set()
        self._joining.put(None)
        self._thread.join(timeout=10.0)
        self._forwards_alone_again()

    def tokens(self, answer: AnswerRow) -> Iterator[int]:
        """Yield the answer's tokens as the batch settles them (`answer.choice`, on the batch's thread), until its
        stream is done or cancelled; the row then leaves the batch. `answer.session`: the conversation's cache to
        start from, and to keep the answer's in after. Raises `BatchFailed` if the batch fails it."""
        row, stream = _Row(answer, queue.Queue()), answer.stream
        self._joining.put(row)
        try:
            for token in outputs_until_done(row.outputs, stream, self._stopped):
                if isinstance(token, _Left):  # Stop, seen by the batch
                    stream.finish(FinishReason.CANCELLED)
                    return
                if isinstance(token, BaseException):
                    raise BatchFailed(f"{type(token).__name__}: {token}") from token
                yield token
        finally:
            row.leaving = True

    def _stopped(self) -> str | None:
        return None if self._thread.is_alive() else "the batch stopped"

    # ----- the batch's thread -----

    @torch.inference_mode()
    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._leave()  # first: a conversation's next turn may be waiting to join, for the cache it keeps
                self._admit()
                self._leave()  # an answer that ended at its first token
                if self._rows:
                    self._step()
            except Exception as error:  # a failed forward pass: its answers fail, the batch starts over
                for row in self._rows:
                    row.outputs.put(error)
                self._rows, self._cache, self._length = [], None, 0
        for row in self._rows:
            row.outputs.put(RuntimeError("the batch stopped"))

    def _admit(self) -> None:
        """Take the answers waiting to join, while there is room (waiting for one when none runs)."""
        while len(self._rows) < self.places:
            if not self._rows:
                hand_back_workers()  # idle until an answer comes, maybe for long (model/cpu_threads.py)
            try:
                row = self._joining.get(block=not self._rows)
            except queue.Empty:
                return
            if row is None:  # `stop`
                return
            if row.gone():
                continue
            try:
                self._join(row)
            except Exception as error:
                row.outputs.put(error)
            if self._rows and self._tokens_held() > self.cache_tokens:
                return  # full: the others wait for rows to leave

    def _tokens_held(self) -> int:
        return len(self._rows) * self._length

    def _join(self, row: _Row) -> None:
        """Prefill `row` alone (over its session's cache) and add its cache to the batch's."""
        inputs, stream = row.inputs, row.answer.stream
        if row.answer.session is not None:
            row.media = media_key(inputs.family.images)
        cache, row.session = self.sessions.take(row.answer.session, inputs, row.media)
        if cache is None:
            cache = self.sessions.new_cache()
        logits = prefill(self.llma, inputs, cache)
        if not stream.token_ids:  # in the batch from its start: its prompt's tokens its session's cache held
            stream.cached_tokens = inputs.cached
        row.length = inputs.input_ids.shape[1]
        self._rows.append(row)
        self.answers += 1
        if self._cache is None:
            self._cache, self._length = cache, row.length
        else:
            self._length = stack_rows(self._cache, self._length, cache, row.length)
        self._sample(row, logits)

    def _step(self) -> None:
        """One token for every row, in one forward pass."""
        rows, length = self._rows, self._length + 1
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            mask[i, length - row.length - 1 :] = 1
        device = self.llma.device
        logits = decode_one(
            self.llma,
            torch.tensor([row.next_token for row in rows], device=device),
            mask.to(device),
            _positions(rows, device),
            self._cache,
            self._keyword,
        )
        self._length = length
        apply_together(logits, [row.answer.choice.mask for row in rows])
        for i, row in enumerate(rows):
            row.length += 1
            self._sample(row, logits[i : i + 1], masked=True)

    def _sample(self, row: _Row, logits: torch.Tensor, masked: bool = False) -> None:
        """The row's next token, chosen and settled by its `TokenChoice` (its stream takes every stop decision);
        `masked`: its grammar's mask is applied already."""
        choice = row.answer.choice
        tokens = choice.choose(logits, masked)
        row.sampled.append(int(tokens[0]))
        if choice.settle(tokens):
            row.leaving = True  # its answer ended: it leaves at the step boundary
        row.outputs.put(row.next_token)

    def _leave(self) -> None:
        """Take the rows whose answers are done out of the batch, their caches back to their sessions."""
        leaving = [row for row in self._rows if row.gone()]
        if not leaving:
            return
        for row in leaving:
            row.outputs.put(_Left())  # a reader waiting for a token after Stop wakes now
            if row.session is not None:
                kept = row_cache(self._cache, self._rows.index(row), self._length - row.length)
                self.sessions.keep(row.session, row.inputs, kept, row.sampled, row.media)
        staying = [i for i, row in enumerate(self._rows) if row not in leaving]
        self._rows = [self._rows[i] for i in staying]
        if not self._rows:
            self._cache, self._length = None, 0
            return
        longest = max(row.length for row in self._rows)
        select_rows(self._cache, staying, self._length - longest, self.llma.device)
        self._length = longest


class _Left:
    """The row left the batch (read only by a reader still waiting for a token: one whose answer was stopped)."""


def _positions(rows: list[_Row], device) -> torch.Tensor:
    """Each row's position for its next token ([rows, 1]); [3, rows, 1] where a row's family counts positions in
    three dimensions (Qwen2-VL's: a row of text has the same position in each)."""
    plain = torch.tensor([[row.length] for row in rows], device=device)
    each = [row.inputs.family.decode_positions(plain[i : i + 1]) for i, row in enumerate(rows)]
    if all(position.dim() == 2 for position in each):
        return plain
    return torch.cat([p if p.dim() == 3 else p[None].expand(3, -1, -1) for p in each], dim=1)


# ----- the cache's rows (the layers of transformers' DynamicCache) -----


def _states(layer) -> Iterator[tuple[dict, int]]:
    """A running-state layer's state tensors (Mamba's convolution and SSM states, linear attention's), as
    (dict, key) places."""
    if isinstance(layer, LinearAttentionCacheLayerMixin):
        for i in range(layer.number_of_states):
            if layer.is_conv_states_initialized[i]:
                yield layer.conv_states, i
            if layer.is_recurrent_states_initialized[i]:
                yield layer.recurrent_states, i


def _has_keys(layer) -> bool:
    return isinstance(layer, DynamicLayer) and layer.is_initialized and layer.keys is not None


def _left_padded(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Keys or values ([rows, heads, tokens, width]) left-padded with zeros to `length` tokens."""
    return torch.nn.functional.pad(tensor, (0, 0, length - tensor.shape[-2], 0))


def stack_rows(batch, batch_length: int, row, row_length: int) -> int:
    """Add `row`'s cache (one answer's, `row_length` tokens) under `batch`'s, each left-padded to the longer of
    the two; returns that length."""
    length = max(batch_length, row_length)
    for mine, theirs in zip(batch.layers, row.layers, strict=True):
        if _has_keys(mine):
            mine.keys = torch.cat([_left_padded(mine.keys, length), _left_padded(theirs.keys, length)])
            mine.values = torch.cat([_left_padded(mine.values, length), _left_padded(theirs.values, length)])
        for (states, i), (its, j) in zip(_states(mine), _states(theirs), strict=True):
            states[i] = torch.cat([states[i], its[j]])
    return length


def select_rows(cache, rows: list[int], padding: int, device: torch.device) -> None:
    """Keep only `rows` of `cache` (on `device`), and drop its first `padding` positions (padding in every row
    kept)."""
    index = torch.tensor(rows, device=device)
    for layer in cache.layers:
        if _has_keys(layer):
            layer.keys = layer.keys.index_select(0, index)[:, :, padding:]
            layer.values = layer.values.index_select(0, index)[:, :, padding:]
        for states, i in _states(layer):
            states[i] = states[i].index_select(0, index)


def row_cache(cache, row: int, padding: int):
    """A copy of one row of `cache` as a cache of its own, without its `padding` (to keep it as its session's)."""
    alone = copy.copy(cache)
    alone.layers = []
    for layer in cache.layers:
        mine = copy.copy(layer)
        for name, value in vars(layer).items():  # a running-state layer's states and flags, in dicts of its own
            if isinstance(value, dict):
                setattr(mine, name, dict(value))
        if _has_keys(layer):
            mine.keys = layer.keys[row : row + 1, :, padding:].clone()
            mine.values = layer.values[row : row + 1, :, padding:].clone()
        for states, i in _states(mine):
            states[i] = states[i][row : row + 1].clone()
        alone.layers.append(mine)
    return alone


# ----- which batch a model gets -----


def why_not_paged(llma) -> str | None:
    """Which part of the model transformers' continuous batching (its paged cache: one key and one value width,
    full or sliding attention in every layer) cannot hold, or None."""
    config = llma.config.get_text_config()
    if not hasattr(llma, "init_continuous_batching"):
        return f"{type(llma).__name__} has none"
    if getattr(config, "kv_lora_rank", None):
        return "its multi-head latent attention"
    try:
        config.head_dim  # noqa: B018 (Gemma 4's differs between layers: reading it raises)
    except AttributeError:
        pass
    except Exception:
        return "its layers' different head sizes"
    kinds = sorted(set(getattr(config, "layer_types", None) or ()) - {"full_attention", "sliding_attention"})
    if kinds:
        return f"its {' and '.join(kinds)} layers"
    return None


class Batches:
    """A model's batches: transformers' continuous batch (`paged`) where it runs the model, with the step batch
    (`stepped`) beside it for the answers its sampler cannot give; else the step batch alone. `beside_why_not`: why
    no step batch runs beside the continuous one ("" where one does)."""

    def __init__(self, paged, stepped: StepBatcher | None, beside_why_not: str = ""):
        self.paged, self.stepped, self.beside_why_not = paged, stepped, beside_why_not

    def take(self, row: AnswerRow) -> tuple[object | None, str | None]:
        """(the batch that computes `row`, None), or (None, why no batch can)."""
        why = None
        for batcher in (self.paged, self.stepped):
            if batcher is not None:
                why = batcher.why_not(row)
                if why is None:
                    return batcher, None
        return None, why

    @property
    def answers(self) -> int:
        """How many answers the batches took."""
        return sum(batcher.answers for batcher in (self.paged, self.stepped) if batcher is not None)

    def describe(self) -> str:
        if self.paged is None:
            return self.stepped.describe()
        if self.stepped is None:
            return f"{self.paged.describe()}; the answers it cannot give run on their own ({self.beside_why_not})"
        return (
            f"{self.paged.describe()}, and beside it a step batch over the model's own cache for the answers held to "
            "a grammar, with log-probabilities, a seed or a repetition penalty, or about an image"
            + self.stepped.images_note()
        )

    def stop(self) -> None:
        for batcher in (self.stepped, self.paged):  # the first started makes the forward passes take turns
            if batcher is not None:
                batcher.stop()


def start_batcher(llma, sessions: SessionCaches, places: int, cache_tokens: int, check: Callable) -> tuple:
    """(Batches, None), or (None, why there is none): transformers' continuous batching where it can run the model,
    and the step batch beside it or instead of it; `check(batcher)` runs one answer through each first."""
    from .batching import ContinuousBatcher

    paged = stepped = None
    why_paged = why_not_paged(llma)
    if why_paged is None:
        try:
            paged = _checked(ContinuousBatcher(llma, places, cache_tokens), check)
        except Exception as error:  # any failure here: the step batch, or one answer at a time
            why_paged = f"it failed: {described(error)}"
    why_step = why_no_step_batch(llma)
    failed = ""
    if why_step is None:
        try:
            stepped = _checked(StepBatcher(llma, sessions, places, cache_tokens, why_paged or ""), check)
        except Exception as error:
            failed = f"the step batch failed ({described(error)})"
    if paged is None and stepped is None:
        not_paged = f"transformers' continuous batching cannot run this model ({why_paged})"
        return None, f"{not_paged}, {'and ' + failed if failed else f'nor the step batch ({why_step})'}"
    return Batches(paged, stepped, failed or f"the step batch cannot run this model: {why_step}"), None


def _checked(batcher, check: Callable):
    try:
        check(batcher)
    except BaseException:
        batcher.stop()
        raise
    return batcher
