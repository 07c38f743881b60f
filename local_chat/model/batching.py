"""Continuous batching: answers wanted at the same time computed together, one batch per decode step.

transformers' `ContinuousBatchingManager` does the batching (a paged KV cache, its scheduler, prefix sharing between
requests and across a conversation's turns); this module only feeds it and reads it. It is a second source of tokens
for `LocalEngine.answer_steps`, not a second generation path: each token it makes is settled by the answer's
`TokenChoice` (model/token_choice.py), whose `AnswerStream` takes every stop decision (EOS, stop strings, cancel,
length) as it does for the one-at-a-time path, and a stop cancels the request in the batch.

Which answers it takes (`LocalEngine.answer_steps`, `Batches.take` in model/step_batch.py): only those that start
while another is in flight (an answer alone runs the one-at-a-time path, which is faster for one sequence and keeps
its session's cache), and only those the batch can give exactly. The manager has one sampler for the whole batch,
without seeds, repetition penalty, grammars or the alternatives' log-probabilities, and takes token ids only, so an
answer that asks for one of those, or whose prompt carries more than token ids (an image, a family's per-token
inputs), goes to the step batch beside it (model/step_batch.py), which decides each row's tokens as the
one-at-a-time path does (`why_unbatchable` says why).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from local_chat.engine.interface import FinishReason, Sampling

from .answer_stream import AnswerStream, batch_decider
from .cpu_threads import hand_back_workers
from .generation import ModelInputs
from .token_choice import TokenChoice

PAGE_TOKENS = 64  # tokens a page of the paged cache holds: a conversation's history is reused in whole pages
MAX_BATCH_TOKENS = 2048  # tokens one forward pass runs at most (longer prompts are prefilled in chunks)
CANCEL_POLL_S = 0.05  # how often an answer waiting for its next token looks at its cancel flag
START_TIMEOUT_S = 600.0  # an answer whose first token has not come after this long failed


class BatchFailed(RuntimeError):
    """The batch could not finish a request (the manager said why)."""


@dataclass(frozen=True)
class AnswerRow:
    """One answer as a batch takes it: its prompt (one row), how its tokens are decided (`choice`, which the
    answer's one-at-a-time steps used before, if it began there), its stream and its session's cache (where it has
    one)."""

    inputs: ModelInputs
    choice: TokenChoice
    stream: AnswerStream
    session: object = None

    @classmethod
    def of_prompt(cls, prompt_ids: list[int], sampling: Sampling, stream: AnswerStream, device) -> AnswerRow:
        """A row for `prompt_ids` alone (no grammar, no log-probabilities, no session)."""
        ids = torch.tensor([prompt_ids], device=device)
        return cls(ModelInputs(ids, torch.ones_like(ids)), TokenChoice(sampling, ids, batch_decider([stream])), stream)

    def going_on(self) -> AnswerRow:
        """The row whose prompt holds the tokens its stream took already (it began on the one-at-a-time path)."""
        if not self.stream.token_ids:
            return self
        ids = self.inputs.input_ids.new_tensor([self.inputs.input_ids[0].tolist() + self.stream.token_ids])
        return replace(self, inputs=ModelInputs(ids, torch.ones_like(ids)))


def why_unbatchable(row: AnswerRow) -> str | None:
    """Why transformers' continuous batch cannot compute an answer (what it asks for that its sampler cannot give),
    or None."""
    choice = row.choice
    if row.inputs.family:
        return "its prompt carries more than token ids (an image, or this model's per-token inputs)"
    if choice.sampling.seed is not None:
        return "it asks for a seed (the batch samples from one random stream)"
    if choice.sampling.repetition_penalty != 1.0:
        return "it asks for a repetition penalty"
    if choice.observe is not None:
        return "it asks for log-probabilities"
    if choice.mask is not None:
        return "it is held to a grammar (a response_format, or a tool call it must make)"
    return None


def paged_cache_tokens(llma, places: int, context: int, budget_bytes: int | None) -> int:
    """How many tokens the paged cache holds: `budget_bytes` worth (--max_cache_mb), else room for `places` whole
    contexts, but at most a quarter of the memory free on the model's device."""
    config = llma.config.get_text_config()
    layers = getattr(config, "per_layer_config", None) or [config] * config.num_hidden_layers  # Gemma 4's vary
    per_token = sum(2 * _kv_width(layer) for layer in layers) * llma.dtype.itemsize
    if budget_bytes is not None:
        return budget_bytes // per_token
    return min(places * context, _free_memory(llma.device) // 4 // per_token)


def _kv_width(layer) -> int:
    """The numbers a layer's cache keeps for each token, keys or values."""
    heads = getattr(layer, "num_key_value_heads", None) or layer.num_attention_heads
    return heads * (getattr(layer, "head_dim", None) or layer.hidden_size // layer.num_attention_heads)


def _free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def forwards_take_turns(llma) -> Callable[[], None]:
    """Make forward passes on `llma` run one at a time (where they do already, nothing changes); returns what undoes
    it.

    transformers' forward sets the shared `config.is_causal` for the length of a call (the batch's steps set it to
    False) and puts the old value back after. A step of the one-at-a-time path that overlapped a batch's step ran
    with it False, and could put that back for good: every later answer then attended both ways (wrong tokens).
    Taking turns costs nothing the two did not already share (the device, the CPU's threads)."""
    lock = threading.Lock()
    forward = llma.forward
    if getattr(forward, "takes_turns", False):  # a batch beside another: the first one's turns serve both
        return lambda: None

    def in_turn(*args, **kwargs):
        with lock:
            return forward(*args, **kwargs)

    in_turn.takes_turns = True
    llma.forward = in_turn

    def undo() -> None:
        if llma.forward is in_turn:
            del llma.forward

    return undo


def answer_once(batcher, prompt_ids: list[int], stream: AnswerStream, device) -> None:
    """One short greedy answer (`stream`) through `batcher`, so that a model it cannot run is found at start-up."""
    for _ in batcher.tokens(AnswerRow.of_prompt(prompt_ids, Sampling(temperature=0.0), stream, device)):
        pass
    if not stream.done:
        raise RuntimeError("the batch ended the answer without its tokens")


def outputs_until_done(outputs: queue.Queue, stream: AnswerStream, stopped: Callable[[], str | None]) -> Iterator:
    """What a batch gives an answer (`outputs`), one at a time, until its `stream` is done; a Stop seen while
    waiting ends the stream as cancelled. Raises `BatchFailed` as `next_output` does."""
    while not stream.done:
        output = next_output(outputs, stream.cancelled, stopped)
        if output is None:
            stream.finish(FinishReason.CANCELLED)
            return
        yield output


def next_output(outputs: queue.Queue, cancelled: Callable[[], bool], stopped: Callable[[], str | None]):
    """An answer's next output from the batch; None once `cancelled()` while waiting for it. Raises `BatchFailed`
    once `stopped()` says why the batch stopped, or when no output came for `START_TIMEOUT_S`."""
    waited = 0.0
    while True:
        try:
            return outputs.get(timeout=CANCEL_POLL_S)
        except queue.Empty:
            waited += CANCEL_POLL_S
            if cancelled():
                return None
            if (why := stopped()) is not None:
                raise BatchFailed(why)
            if waited > START_TIMEOUT_S:
                raise BatchFailed("no token came for 10 minutes")


class _HandsBackWhenIdle(threading.Event):
    """The event the batch's thread waits on for work: before it waits, its CPU workers are handed back, for the
    answer that may run alone in another thread next (model/cpu_threads.py)."""

    def wait(self, timeout: float | None = None) -> bool:
        hand_back_workers()
        return super().wait(timeout)


class ContinuousBatcher:
    """One `ContinuousBatchingManager` over `llma`, running on its own thread, with each request's outputs routed
    to the answer that waits for them."""

    def __init__(self, llma, places: int, cache_tokens: int):
        from transformers import ContinuousBatchingConfig, GenerationConfig

        self.places = places
        self.cache_tokens = cache_tokens
        self.sharing = not hasattr(llma, "peft_config")
        self._vocab_size = llma.config.get_text_config().vocab_size
        # One sampler for the batch, with each request's temperature, top-k and top-p (greedy: top-k 1). The
        # values here only make transformers create the three per-request processors; every request sets its own.
        sampler = GenerationConfig(do_sample=True, temperature=0.5, top_k=2, top_p=0.5, eos_token_id=-1)
        config = ContinuousBatchingConfig(
            page_size=PAGE_TOKENS,
            num_blocks=max(1, cache_tokens // PAGE_TOKENS),
            max_batch_tokens=MAX_BATCH_TOKENS,
            max_requests_per_batch=places,
            # pages shared between answers by their tokens, but not with LoRA adapters (model/adapters.py): the same
            # tokens have other keys and values under each adapter
            allow_block_sharing=self.sharing,
            per_request_processors=True,
            auto_switch_to_flash=False,  # the one-at-a-time path shares the model and its attention implementation
        )
        self._forwards_alone_again = forwards_take_turns(llma)
        try:
            self._manager = llma.init_continuous_batching(generation_config=sampler, continuous_batching_config=config)
            self._results = self._manager.output_router.output_queue  # every request's outputs, in one queue
            if isinstance(getattr(self._manager, "_wake_up_loop", None), threading.Event):
                self._manager._wake_up_loop = _HandsBackWhenIdle()  # what its thread waits on when it has no work
        except BaseException:
            self._forwards_alone_again()
            raise
        self._outputs: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
        self._numbers = iter(range(1 << 62))
        self.answers = 0  # how many answers the batch took
        self._manager.start()
        threading.Thread(target=self._route, name="batch-outputs", daemon=True).start()

    why_not = staticmethod(why_unbatchable)

    def describe(self) -> str:
        return (
            f"continuous batching (transformers), up to {self.places} answers per step, paged cache of "
            f"{self.cache_tokens} tokens" + ("" if self.sharing else " (pages not shared: LoRA adapters)")
        )

    def stop(self) -> None:
        """End the batch's thread now (answers still in it fail)."""
        self._manager.stop(block=True, timeout=10.0, hard_stop=True)
        self._forwards_alone_again()
        self._results.put(None)  # the routing thread ends too

    def tokens(self, row: AnswerRow) -> Iterator[int]:
        """Settle the answer's tokens (`row.choice`) one at a time, yielding each after it, until its stream is done
        (it takes every stop decision) or cancelled while no token comes; the request then leaves the batch. The
        row's prompt ends with the tokens its stream holds already (an answer begun on the one-at-a-time path). The
        paged cache finds a conversation's earlier turns by itself: `row.session` is not used.
        Raises `BatchFailed` if the batch fails it."""
        stream, prompt_ids = row.stream, row.inputs.input_ids[0].tolist()
        with self._lock:
            request_id = f"answer-{next(self._numbers)}"
            self._outputs[request_id] = outputs = queue.Queue()
            self.answers += 1
        self._manager.add_request(
            prompt_ids,
            request_id=request_id,
            max_new_tokens=stream.max_new_tokens - len(stream.token_ids),
            streaming=True,
            eos_token_id=sorted(stream.eos_ids) or -1,
            **self._sampler_settings(row.choice.sampling),
        )
        seen, ended_in_batch = 0, False
        try:
            for output in outputs_until_done(outputs, stream, self._stopped):
                if output.error is not None:
                    raise BatchFailed(output.error)
                ended_in_batch = output.is_finished()
                for token in output.generated_tokens[seen:]:
                    seen += 1
                    row.choice.settle(torch.tensor([token]))
                    yield token
                    if stream.done:
                        return
        finally:
            with self._lock:
                self._outputs.pop(request_id, None)
            if not ended_in_batch:
                self._manager.cancel_request(request_id)

    def _stopped(self) -> str | None:
        if self._manager.is_running():
            return None
        return f"the batch stopped ({self._manager.background_thread_status.fatal_error})"

    def _sampler_settings(self, sampling: Sampling) -> dict:
        if sampling.greedy:
            return {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
        top_k = sampling.top_k if sampling.top_k > 0 else self._vocab_size
        return {"temperature": float(sampling.temperature), "top_k": top_k, "top_p": float(sampling.top_p)}

    def _route(self) -> None:
        """Hand each output of the manager to the answer that waits for it (outputs of cancelled answers are
        dropped)."""
        while (output := self._results.get()) is not None:
            with self._lock:
                waiting = self._outputs.get(output.request_id)
            if waiting is not None:
                waiting.put(output)
