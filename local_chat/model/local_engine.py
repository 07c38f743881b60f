"""`LocalEngine`: the engine (engine/interface.py) of a model in this process, which every door uses.

It is built with its parts: the `PromptEncoder` (prompts and images in, tensors out), the `SessionCaches` (the KV
caches kept between a conversation's turns), the `Decoding` (--compile, CUDA graphs) and, once `start_batching` ran,
the `Batches` (transformers' continuous batch and our step batch). `MetaModel` (model/meta.py) holds one and keeps
LLaMA2-Accessory's API over it."""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Sequence

import torch

from local_chat.engine.interface import (
    ACCESSORY_SAMPLING,
    Answer,
    AnswerFormat,
    End,
    EngineSummary,
    Event,
    FinishReason,
    Request,
    Sampling,
    SessionKey,
)
from local_chat.errors import UserError, described, failure_sentence

from .adapters import Adapters, Cancelled, adapter_session, holding
from .answer_stream import AnswersInFlight, AnswerStream, answer_room, batch_decider, logprob_recorder
from .batching import AnswerRow, answer_once, paged_cache_tokens
from .constraints import Grammars, grammars_for, token_mask
from .cpu_threads import hand_back_workers
from .encoding import PromptEncoder
from .footprint import weight_bytes
from .generation import generate_tokens
from .parallel import Lockstep, announced
from .prefix_cache import media_key
from .session_cache import SessionCaches
from .speedups import Decoding, compile_decode_steps, why_no_batching
from .step_batch import Batches, start_batcher
from .token_choice import TokenChoice
from .vision_inputs import image_marker

OUT_OF_MEMORY = (
    "The GPU ran out of memory for this answer; ask for a shorter answer, clear the conversation, or load the model "
    "with --quant 4."
)
log = logging.getLogger(__name__)


class LocalEngine:
    """Answers from the transformers model `llma` (with `tokenizer`, and `max_seq_len` tokens of context); `info`:
    what the model panel says of it (path, format, dtype, device, quantization, speed-ups). `lockstep` and
    `followers`: tensor parallel's (model/parallel.py): the ranks that decide each step together, and on rank 0 of
    the launchers' layout the other ranks each generation is announced to. `adapters`: LoRA adapters over `llma`
    (model/adapters.py), one of which a request may name."""

    def __init__(
        self,
        llma,
        tokenizer,
        encoder: PromptEncoder,
        sessions: SessionCaches,
        decoding: Decoding,
        max_seq_len: int,
        info: dict,
        lockstep: Lockstep | None = None,
        followers=None,
        adapters: Adapters | None = None,
    ):
        self.llma, self.tokenizer, self.encoder, self.sessions = llma, tokenizer, encoder, sessions
        self.decoding, self.max_seq_len, self.lockstep, self.followers = decoding, max_seq_len, lockstep, followers
        self.info = {**info, **decoding.info, "batching": "off"}
        self.batcher: Batches | None = None  # see `start_batching`
        self.in_flight = AnswersInFlight()
        self.adapters = adapters

    # ----- what the model is -----

    @property
    def static(self):
        return self.decoding.static

    @property
    def compiled(self):
        return self.decoding.compiled

    @property
    def graphs(self):
        return self.decoding.graphs

    @property
    def sees_images(self) -> bool:
        return self.encoder.sees_images

    @property
    def chat_renderer(self):
        return self.encoder.chat_renderer

    @property
    def device(self) -> torch.device:
        return self.llma.device

    @property
    def failure(self) -> str | None:
        """Why this model cannot answer any more (a tensor-parallel worker died), or None."""
        return self.followers.failure() if self.followers is not None else None

    @functools.cached_property
    def grammars(self) -> Grammars | None:
        """What holds answers to a response_format (model/constraints.py); None for a tokenizer it cannot read."""
        return grammars_for(self.tokenizer, self.llma, self.eos_ids())

    def summary(self) -> EngineSummary:
        """`info` (path, format, dtype, device, quantization) with the architecture, weight MiB and context: what
        the app's model panel shows."""
        info, processor = self.info, self.encoder.processor
        return EngineSummary(
            path=str(info.get("path", "")),
            context=self.max_seq_len,
            sees_images=self.sees_images,
            hears=self.encoder.hears,
            architecture=str(info.get("architecture", type(self.llma).__name__)),
            model_type=getattr(getattr(self.llma, "config", None), "model_type", None),
            format=str(info.get("format", "")),
            dtype=str(info.get("dtype", "")),
            device=str(info.get("device", "")),
            quant=str(info.get("quant", "none")),
            cpu_kernels=str(info.get("cpu_kernels", "")),
            weight_mib=weight_bytes(self.llma) / 2**20,
            compiled=self.compiled is not None,
            cuda_graphs=self.graphs is not None,
            batching=str(info["batching"]),
            # the processor puts it in front of a prompt whose template has no image marker
            image_marker=image_marker(processor) if self.sees_images else "",
            image_token=getattr(processor, "image_token", "") if self.sees_images else "",
            adapters=self.adapters.names if self.adapters is not None else (),
            adapter_problems=tuple(self.adapters.problems.items()) if self.adapters is not None else (),
            adapter=str(info.get("adapter", "")),
        )

    def generation_defaults(self) -> Sampling:
        """The chat's sampling, with what the checkpoint's generation_config.json sets."""
        config = getattr(self.llma, "generation_config", None)
        return Sampling.chosen_for(config.to_diff_dict() if config is not None else {})

    def eos_ids(self, stop_symbols: Sequence[str] = ()) -> set[int]:
        """Every id that ends an answer: the tokenizer's and generation config's EOS, and stop symbols that are
        single special tokens (such as a chat template's "<|im_end|>", which never shows up as text)."""
        ids = set(self.tokenizer.eos_ids)
        configured = getattr(getattr(self.llma, "generation_config", None), "eos_token_id", None)
        ids.update(
            configured if isinstance(configured, (list, tuple)) else [configured] if configured is not None else []
        )
        ids.update(i for i in map(self.tokenizer.special_token_id, stop_symbols) if i is not None)
        return ids

    def prompt_length(self, prompt: str, images=None, image_transform: str | None = None) -> int:
        return self.encoder.prompt_length(prompt, images, image_transform)

    def answer_room(self, prompt_tokens: int, max_gen_len: int) -> int:
        """How many tokens may be generated: `max_gen_len`, clamped to what `max_seq_len` leaves."""
        return answer_room(self.max_seq_len, prompt_tokens, max_gen_len)

    # ----- speed-ups -----

    def compile_decoding(self, batch_sizes: Iterable[int] = (1,)) -> float:
        """With `compile`: compile (and on CUDA record) the decode step for the batch sizes to come now, not in the
        first answers (see `compile_decode_steps`). Returns the seconds taken."""
        return compile_decode_steps(self.llma, self.encoder, self.compiled, self.answer_room, batch_sizes)

    def start_batching(self, places: int, cache_bytes: int | None = None) -> str:
        """Compute the answers that run at the same time (up to `places`) in one batch per decode step, with a paged
        cache of `cache_bytes` (default: `places` contexts, at most a quarter of the free memory); see
        model/batching.py. Where the model cannot be batched, answers keep the one-at-a-time path. Returns what
        the model panel says: how it batches, or why not."""
        reason = why_no_batching(self.llma, places, self.decoding, self.lockstep)
        try:
            tokens = paged_cache_tokens(self.llma, places, self.max_seq_len, cache_bytes) if reason is None else 0
            if reason is None and tokens < self.max_seq_len:
                reason = (
                    f"its paged cache would hold {tokens} tokens, less than one {self.max_seq_len}-token context "
                    "(raise --max_cache_mb)"
                )
            if reason is None:
                hello = self.tokenizer.encode("Hello", bos=True, eos=False)
                check = lambda batcher: answer_once(batcher, hello, *self._streams(1, [], 2, None), self.device)  # noqa: E731
                self.batcher, reason = start_batcher(self.llma, self.sessions, places, tokens, check)
        except Exception as error:  # any failure here: one answer at a time, never an app that does not start
            reason = f"batching failed on this model ({described(error)})"
            self.stop_batching()
        self.info["batching"] = self.batcher.describe() if self.batcher is not None else f"off: {reason}"
        return self.info["batching"]

    def stop_batching(self) -> None:
        if self.batcher is not None:
            self.batcher.stop()
            self.batcher = None

    # ----- the engine interface (engine/interface.py) -----

    def drop_sessions(self, browser_session: str) -> None:
        self.sessions.drop(browser_session)

    def stream(self, request: Request) -> Iterator[Event]:
        """The events of `request`'s answer (see engine/interface.py): new text, then its end. Never raises: an error
        ends the stream as one sentence (a bug's traceback goes to the log)."""
        try:
            for item in self.answer_steps(
                request.prompt, request.images, request.image_transform, request.sampling, tuple(request.stop),
                request.session, request.logprobs, request.cancel, request.special_tokens, request.answer_format,
                request.adapter,
            ):  # fmt: skip
                if isinstance(item, End):
                    yield item
                    return
                if (delta := item.next_delta(request.logprobs is not None)) is not None:
                    yield delta
        except UserError as error:
            yield End.failed(str(error), caller_error=True)
        except Cancelled:  # while it waited for another adapter's answers
            yield End(FinishReason.CANCELLED)
        except torch.OutOfMemoryError:
            yield End.failed(OUT_OF_MEMORY)
        except Exception as error:  # a bug or a broken model: the chat says so, the terminal has the traceback
            log.exception("The answer failed")
            yield End.failed(self.failure or failure_sentence(error))

    def complete(self, requests: Sequence[Request]) -> list[Answer]:
        """Whole answers to `requests`, generated as one left-padded batch: they must share their sampling, stop
        strings and image transform. Raises `UserError` for what the user can fix."""
        first = requests[0]
        if any(
            (r.sampling, tuple(r.stop), r.image_transform, r.special_tokens, r.adapter)
            != (first.sampling, tuple(first.stop), first.image_transform, first.special_tokens, first.adapter)
            for r in requests
        ):
            raise UserError(
                "A batch of requests must share its sampling, stop strings, image transform and adapter; send them "
                "in separate batches."
            )
        images = [r.images for r in requests]
        details = self.batch_answers(
            [r.prompt for r in requests],
            None if all(i is None for i in images) else images,
            first.sampling,
            tuple(first.stop),
            first.cancel,
            first.image_transform,
            first.special_tokens,
            [r.answer_format for r in requests],
            first.adapter,
        )
        return [Answer(d.pop("text"), End(**d)) for d in details]

    # ----- generation -----

    def _streams(self, count, stop_symbols, max_new_tokens, cancel, special_tokens=False) -> list[AnswerStream]:
        eos_ids = self.eos_ids(stop_symbols)
        decode = self.tokenizer.decode_with_specials if special_tokens else self.tokenizer.decode
        return [AnswerStream(decode, eos_ids, stop_symbols, max_new_tokens, cancel) for _ in range(count)]

    def _decider(self, streams: list[AnswerStream]):
        decide = batch_decider(streams)
        return decide if self.lockstep is None else self.lockstep.shared(decide)

    @announced
    def answer_steps(
        self,
        prompt: str,
        images=None,
        image_transform: str | None = None,
        sampling: Sampling = ACCESSORY_SAMPLING,
        stop: tuple[str, ...] = (),
        session: SessionKey | str | None = None,
        logprobs: int | None = None,
        cancel: threading.Event | None = None,
        special_tokens: bool = False,
        answer_format: AnswerFormat | None = None,
        adapter: str | None = None,
    ) -> Iterator[AnswerStream | End]:
        """One answer: its `AnswerStream` after every step (its text, tokens, log-probabilities), then its `End`;
        with the LoRA `adapter` (a name of `adapters`), once the answers of another have ended. Announced to the
        other ranks in tensor parallel, which run it alongside (they ignore what it yields)."""
        session = adapter_session(session, adapter)
        with holding(self.adapters, adapter, cancel), self.in_flight.one_more() as others:
            inputs = self.encoder.prepare_inputs([prompt], None if images is None else [images], image_transform)
            prompt_tokens = inputs.input_ids.shape[1]
            max_new = self.answer_room(prompt_tokens, sampling.max_new_tokens)
            [stream] = self._streams(1, list(stop), max_new, cancel, special_tokens)
            observe = None if logprobs is None else logprob_recorder(stream, logprobs, self.tokenizer.decode)
            choice = TokenChoice(sampling, inputs.input_ids, self._decider([stream]),
                                 token_mask(self.grammars, [answer_format]), observe)  # fmt: skip
            row = AnswerRow(inputs, choice, stream, session)
            batch = self._batch_for(row, beside_others=others > 0)
            in_batch = bool(others) and batch is not None
            if not in_batch:  # an answer about an image stays on its path: its inputs are its prompt's
                can_join = batch is not None and not inputs.family
                in_batch = yield from self._answer_alone(row, can_join)
            if in_batch:  # from the start, or from when others came
                for _ in batch.tokens(row.going_on()):
                    yield stream
            if not stream.done:  # a follower's, in tensor parallel: rank 0 ended the answer where its own did not
                stream.finish(FinishReason.CANCELLED)
            yield End(**stream.summary(prompt_tokens), cached_tokens=inputs.cached or stream.cached_tokens)

    def _batch_for(self, row: AnswerRow, beside_others: bool):
        """The batch that can compute this answer (see model/step_batch.py's `Batches`), or None; the terminal says
        why none can when it runs `beside_others` in a batch."""
        if self.batcher is None:
            return None
        batch, why = self.batcher.take(row)
        if why is not None and beside_others:
            print(f"note: an answer runs on its own beside the batch: {why}.", file=sys.stderr, flush=True)
        return batch

    def _answer_alone(self, row: AnswerRow, can_join: bool) -> Generator[AnswerStream, None, bool]:
        """The one-at-a-time path: `generate_tokens` over the session's cache, until the answer is done, or, if it
        `can_join` a batch, until another answer runs (the rest of it is computed in the batch, decided by the same
        `TokenChoice`: one answer on its own beside the batch would take turns with it at every step). Returns
        whether it left for the batch."""
        inputs, stream, session = row.inputs, row.stream, row.session
        media = media_key(inputs.family.images) if session is not None else None  # only a kept cache needs it
        cache, session = self.sessions.take(session, inputs, media, self.static)
        sampled: list[int] = []
        joins_batch = False
        guesses = stream.guesses if self.decoding.speculative != "off" else None  # counted there
        steps = generate_tokens(self.llma, inputs, row.choice, cache, self.static, stream.max_new_tokens, guesses,
                                self.decoding.draft)  # fmt: skip
        try:
            if stream.cancelled() and self.lockstep is None:  # in lockstep the first step's decision says so
                stream.finish(FinishReason.CANCELLED)
                steps.close()
            for tokens in steps:
                sampled.append(int(tokens[0]))
                yield stream
                if can_join and self.in_flight.count > 1 and not stream.done:
                    joins_batch = True
                    break
        except GeneratorExit:
            if self.lockstep is not None and not stream.done:
                # The reader left mid-answer, but the other ranks wait for this step's decision: take one more
                # step, decided "cancelled" and shared like any other, so that every rank stops together.
                stream.cancel()
                sampled.extend(int(tokens[0]) for tokens in steps)
            raise
        except Exception:
            cache = None  # a forward pass that failed may have left the cache half written
            raise
        finally:
            steps.close()  # a turn over a static cache copies its keys and values back into `cache` as it closes
            self.sessions.keep(session, inputs, cache, sampled, media)
            hand_back_workers()  # the next answer may run in another thread (model/cpu_threads.py)
        return joins_batch

    @announced
    def batch_answers(
        self,
        prompts,
        images,
        sampling: Sampling,
        stop: tuple[str, ...] = (),
        cancel=None,
        image_transform=None,
        special_tokens: bool = False,
        answer_formats: list[AnswerFormat | None] | None = None,
        adapter: str | None = None,
    ) -> list[dict]:
        """A left-padded batch's answers (with the LoRA `adapter`, where named), each as the dict of `End`'s fields
        with its "text" and the batch's `encode_time`."""
        with holding(self.adapters, adapter, cancel):
            encode_started = time.perf_counter()
            inputs = self.encoder.prepare_inputs(list(prompts), images, image_transform)
            encode_time = time.perf_counter() - encode_started
            lengths = inputs.attention_mask.sum(dim=1).tolist()
            max_new = self.answer_room(inputs.input_ids.shape[1], sampling.max_new_tokens)
            streams = self._streams(len(prompts), list(stop), max_new, cancel, special_tokens)
            mask = token_mask(self.grammars, answer_formats or [None] * len(prompts))
            choice = TokenChoice(sampling, inputs.input_ids, self._decider(streams), mask)
            for _ in generate_tokens(self.llma, inputs, choice, static=self.static, max_new_tokens=max_new):
                pass
            return [{"text": s.text, **s.summary(n), "encode_time": encode_time} for s, n in zip(streams, lengths)]
