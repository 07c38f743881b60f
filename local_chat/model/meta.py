"""`MetaModel`: LLaMA2-Accessory's model API over an ordinary transformers model."""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from PIL import Image

from local_chat.defaults import DEFAULT_CONTEXT
from local_chat.engine.interface import (
    ACCESSORY_SAMPLING,
    Answer,
    Delta,
    End,
    EngineSummary,
    Event,
    Request,
    Sampling,
    SessionKey,
    TokenLogprob,
)
from local_chat.errors import UserError, described

from .answer_stream import AnswerStream, batch_decider
from .batching import ContinuousBatcher, paged_cache_tokens, why_unbatchable
from .compiled import CompiledDecoding, StaticDecoding
from .footprint import weight_bytes
from .generation import ModelInputs, generate_tokens
from .graphs import GraphedDecoding
from .image import shape_image
from .loading import load
from .parallel import Lockstep, announced
from .prefix_cache import PrefixCaches, image_key, keeps_states
from .session_cache import SessionCaches
from .vision_inputs import as_image_list, batch_inputs, image_marker
from .vision_inputs import encode as encode_with_processor


def avoid_cudnn_attention() -> None:
    """Keep attention off cuDNN in this process. PyTorch sends bf16/fp16 attention to cuDNN first on recent GPUs,
    and cuDNN builds an execution plan for every new sequence length. While the KV cache grows by one token a
    step, each step with a length not seen before waited tens of milliseconds for its plan: on an H100 the demo
    model's first answer decoded 12 tokens/s, later ones 340. Flash and memory-efficient attention need no plans
    (with them: 115 and 281)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


OUT_OF_MEMORY = (
    "The GPU ran out of memory for this answer; ask for a shorter answer, clear the conversation, or load the model "
    "with --quant 4."
)
log = logging.getLogger(__name__)


def failure_sentence(error: BaseException) -> str:
    """What the chat says when generation failed for a reason the user cannot fix (the terminal has the details)."""
    return (
        f"The model failed while answering ({described(error)}); send the message again, and if it keeps "
        "failing see the app's terminal for the details."
    )


def _side(size) -> int | None:
    """The side in an image processor's `size` or `crop_size` (a dict, or transformers' SizeDict)."""
    if size is None:
        return None
    get = size.get if isinstance(size, dict) else lambda key: getattr(size, key, None)
    side = get("height") or get("shortest_edge")
    return int(side) if side else None


class MetaModel(torch.nn.Module):
    """A loaded chat model: `llma` (the transformers model), `tokenizer`, and for vision models `processor`."""

    def __init__(
        self,
        llma,
        tokenizer,
        processor=None,
        max_seq_len: int = DEFAULT_CONTEXT,
        info: dict | None = None,
        compile: bool = False,
        lockstep: Lockstep | None = None,
        prefix_caches: PrefixCaches | None = None,
        followers=None,
        cuda_graphs: bool = True,
    ):
        """`prefix_caches`: the conversations' KV caches kept between turns (default: `MAX_CACHED_SESSIONS` of
        them); `lockstep` and `followers`: tensor parallel's (model/parallel.py): the ranks that decide each
        step together, and on rank 0 of the launchers' layout the other ranks each generation is announced to;
        `cuda_graphs`: on one GPU without `compile`, replay the decode steps from CUDA graphs (model/graphs.py)."""
        super().__init__()
        if compile and lockstep is not None:  # compiled steps are queued before the ranks have agreed on their tokens
            raise UserError("--compile is not available with tensor parallel yet; leave out one of the two.")
        if compile and keeps_states(llma.config):
            raise UserError(
                f"--compile: {type(llma).__name__}'s linear-attention layers keep a running state, which the compiled "
                "static cache cannot hold; start the app without --compile."
            )
        self.llma = llma
        self.tokenizer = tokenizer
        self.processor = processor
        self.max_seq_len = max_seq_len
        self.info = dict(info or {})
        self.compiled = CompiledDecoding(llma, max_seq_len) if compile else None
        why_no_graphs = self._why_no_cuda_graphs(cuda_graphs, compile, lockstep)
        self.graphs = GraphedDecoding(llma, max_seq_len) if why_no_graphs is None else None
        if self.graphs is not None and not self.graphs.keeps_sessions:  # a layer of another kind than StaticLayer
            why_no_graphs = (
                "its sliding-window layers count their cache's length in Python, which a graph cannot replay"
            )
            self.graphs = None
        store = prefix_caches if prefix_caches is not None else PrefixCaches()  # an empty one is falsy
        self.sessions = SessionCaches(llma, processor, store, lockstep)
        self.lockstep = lockstep
        self.followers = followers
        self.batcher: ContinuousBatcher | None = None  # see `start_batching`
        self._answers_lock = threading.Lock()
        self._answers_in_flight = 0
        self.info["compile"] = CompiledDecoding.name if compile else "off"
        self.info["cuda_graphs"] = (
            "on: decode steps replayed per cache length" if self.graphs else f"off: {why_no_graphs}"
        )
        self.info["batching"] = "off"
        if processor is not None:
            llma.image_size = self.image_size  # the guide reads model.llma.image_size
        if self.device.type == "cuda":
            avoid_cudnn_attention()

    @staticmethod
    def from_pretrained(
        pretrained_path,
        llama_type: str | None = None,
        llama_config=None,
        tokenizer_path: str | None = None,
        with_visual: bool = False,
        max_seq_len: int = DEFAULT_CONTEXT,
        mp_group=None,
        dtype=None,
        device=None,
        quant=None,
        compile: bool = False,
        trust_remote_code: bool = False,
        prefix_caches: PrefixCaches | None = None,
        followers=None,
        cuda_graphs: bool = True,
    ) -> MetaModel:
        """Load a Hugging Face folder, or an Accessory / Meta consolidated checkpoint (one folder or a list).

        `quant`: None, 4, 8, or True (= 4). `dtype`: bf16 on CUDA and fp32 on the CPU unless given.
        `compile`: decode steps run `torch.compile`d over a static KV cache of `max_seq_len` tokens (the first
        answers are slow while it compiles, unless `compile_decoding()` ran first; worth it on a GPU).
        `trust_remote_code`: run the Python code a Hugging Face checkpoint ships (off: such a checkpoint is refused).
        `prefix_caches`, `followers`, `cuda_graphs`: see `MetaModel`.
        Errors a user can fix raise `UserError` with one sentence saying what to do.
        """
        loaded = load(
            pretrained_path,
            llama_type=llama_type,
            llama_config=llama_config,
            tokenizer_path=tokenizer_path,
            with_visual=with_visual,
            max_seq_len=max_seq_len,
            mp_group=mp_group,
            dtype=dtype,
            device=device,
            quant=quant,
            trust_remote_code=trust_remote_code,
        )
        lockstep = (
            Lockstep(mp_group) if mp_group is not None and torch.distributed.get_world_size(mp_group) > 1 else None
        )
        return MetaModel(
            loaded.model,
            loaded.tokenizer,
            loaded.processor,
            loaded.max_seq_len,
            loaded.info,
            compile,
            lockstep,
            prefix_caches,
            followers,
            cuda_graphs,
        )

    @property
    def prefix_caches(self) -> PrefixCaches:
        """The conversations' KV caches (a `PrefixCaches`; `sessions` decides what each turn reuses of them)."""
        return self.sessions.store

    @prefix_caches.setter
    def prefix_caches(self, store: PrefixCaches) -> None:
        self.sessions.store = store

    # ----- what the model is -----

    @property
    def static(self) -> StaticDecoding | None:
        """How the decode steps run over a static cache, if they do: `--compile`'s, or the CUDA graphs'."""
        return self.compiled or self.graphs

    def _why_no_cuda_graphs(self, wanted: bool, compile: bool, lockstep: Lockstep | None) -> str | None:
        if not wanted:
            return "--no_cuda_graphs"
        if self.llma.device.type != "cuda":
            return "not on a GPU"
        if compile:
            return "--compile records its own"
        if lockstep is not None:
            return "not with tensor parallel (--n_gpus) yet"
        if self._spread_over_devices:
            return "not with the layers spread over GPUs"
        if keeps_states(self.llma.config):
            return "its linear-attention layers keep a running state, which the graphs' static cache cannot hold"
        if any(type(module).__name__ == "Linear8bitLt" for module in self.llma.modules()):
            return "bitsandbytes' 8-bit layers look for outliers on the host at each step, which a graph cannot record"
        return None

    @property
    def _spread_over_devices(self) -> bool:
        """Whether accelerate's device map put the layers on more than one device."""
        return len(set(getattr(self.llma, "hf_device_map", {}).values())) > 1

    @property
    def sees_images(self) -> bool:
        return self.processor is not None

    @property
    def device(self) -> torch.device:
        return self.llma.device

    @property
    def image_size(self) -> int:
        """The side of the vision tower's square input (what Accessory's transforms resize to)."""
        image_processor = self.processor.image_processor
        for size in (getattr(image_processor, "crop_size", None), getattr(image_processor, "size", None)):
            side = _side(size)
            if side:
                return side
        side = getattr(self.llma.config.vision_config, "image_size", None)
        if side is None:  # variable resolution (Gemma 4's): the largest square its budget of patches takes
            patches = (
                getattr(image_processor, "max_soft_tokens", 256)
                * getattr(image_processor, "pooling_kernel_size", 1) ** 2
            )
            side = math.isqrt(patches) * getattr(image_processor, "patch_size", 16)
        return int(side)

    def summary(self) -> EngineSummary:
        """`info` (path, format, dtype, device, quantization) with the architecture, weight MiB and context: what
        the app's model panel shows."""
        info = self.info
        return EngineSummary(
            path=str(info.get("path", "")),
            context=self.max_seq_len,
            sees_images=self.sees_images,
            architecture=str(info.get("architecture", type(self.llma).__name__)),
            model_type=getattr(getattr(self.llma, "config", None), "model_type", None),
            format=str(info.get("format", "")),
            dtype=str(info.get("dtype", "")),
            device=str(info.get("device", "")),
            quant=str(info.get("quant", "none")),
            weight_mib=weight_bytes(self.llma) / 2**20,
            compiled=self.compiled is not None,
            cuda_graphs=self.graphs is not None,
            batching=str(info["batching"]),
            # the processor puts it in front of a prompt whose template has no image marker
            image_marker=image_marker(self.processor) if self.sees_images else "",
            image_token=getattr(self.processor, "image_token", "") if self.sees_images else "",
        )

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

    def compile_decoding(self, batch_sizes: Iterable[int] = (1,)) -> float:
        """With `compile`: compile the decode step for the batch sizes to come (1, a chat's answer, has a graph of its
        own, which torch specializes; every other size shares one) now, and on CUDA record it, so that the first
        answer does not wait for it: minutes for a 7B model on a GPU the first time (inductor keeps what it built
        under TORCHINDUCTOR_CACHE_DIR for later launches). Changing torch's thread count after it compiles again.
        Returns the seconds taken."""
        started = time.perf_counter()
        for batch_size in {min(size, 2): size for size in batch_sizes}.values():  # one of each graph
            inputs = self.prepare_inputs(["Hello"] * batch_size)
            tokens = self.answer_room(inputs.input_ids.shape[1], 5)  # 4 decode steps: compiled, recorded, replayed
            count = iter(range(1, tokens))
            for _ in generate_tokens(
                self.llma,
                inputs,
                Sampling(temperature=0.0),
                lambda _: next(count, None) is None,  # noqa: B023 (used within this iteration)
                static=self.compiled,
                max_new_tokens=tokens,
            ):
                pass
        return time.perf_counter() - started

    def start_batching(self, places: int, cache_bytes: int | None = None) -> str:
        """Compute the answers that run at the same time (up to `places`) in one batch per decode step, with a paged
        cache of `cache_bytes` (default: `places` contexts, at most a quarter of the free memory); see
        model/batching.py. Where the model cannot be batched, answers keep the one-at-a-time path. Returns what
        the model panel says: how it batches, or why not."""
        reason = self._why_no_batching(places)
        try:
            tokens = paged_cache_tokens(self.llma, places, self.max_seq_len, cache_bytes) if reason is None else 0
            if reason is None and tokens < self.max_seq_len:
                reason = (
                    f"its paged cache would hold {tokens} tokens, less than one {self.max_seq_len}-token context "
                    "(raise --max_cache_mb)"
                )
            if reason is None:
                self.batcher = ContinuousBatcher(self.llma, places, tokens)
                self._try_batch()
        except Exception as error:  # any failure here: one answer at a time, never an app that does not start
            reason = f"transformers' continuous batching failed on this model ({described(error)})"
            self.stop_batching()
        self.info["batching"] = self.batcher.describe() if self.batcher is not None else f"off: {reason}"
        return self.info["batching"]

    def stop_batching(self) -> None:
        if self.batcher is not None:
            self.batcher.stop()
            self.batcher = None

    def _why_no_batching(self, places: int) -> str | None:
        if places < 2:
            return "one answer at a time (--concurrency 1)"
        if self.lockstep is not None:
            return "not with tensor parallel yet"
        if self.compiled is not None:
            return "not with --compile"
        if self._spread_over_devices:
            return "not with the layers spread over GPUs"
        if not hasattr(self.llma, "init_continuous_batching"):
            return f"{type(self.llma).__name__} has no continuous batching in transformers"
        return None

    def _try_batch(self) -> None:
        """One short greedy answer through the batch, so that a model it cannot run is found at start-up."""
        ids = self.tokenizer.encode("Hello", bos=True, eos=False)
        [stream] = self._streams(1, [], 2, None)
        for _ in self.batcher.tokens(ids, Sampling(temperature=0.0), set(), stream):
            pass
        if not stream.done:
            raise RuntimeError("the batch ended the answer without its tokens")

    # ----- prompts in, tensors out -----

    def prepare_inputs(self, prompts: Sequence[str], images=None, image_transform: str | None = None) -> ModelInputs:
        """Tokenize a batch (left-padded). `images`: for each prompt None, an image or a list of images (a
        conversation's, in the order of their markers in the prompt); a vision model's processor tokenizes every
        prompt, with or without images, as its `apply_chat_template` does."""
        if images is not None and len(images) != len(prompts):
            raise UserError(
                f"Got {len(images)} images for {len(prompts)} prompts; pass one image (or None) per prompt."
            )
        rows, extras = [], []
        for prompt, image in zip(prompts, images if images is not None else [None] * len(prompts)):
            ids, extra = self._encode(prompt, image, image_transform)
            rows.append(ids)
            extras.append(extra)
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_id
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        family = batch_inputs(extras, [len(r) for r in rows], width, self.llma, input_ids, mask)
        return ModelInputs(input_ids, mask, family)

    def _encode(self, prompt: str, images, image_transform: str | None) -> tuple[list[int], dict]:
        """One prompt's token ids and its processor's other outputs."""
        if isinstance(images, torch.Tensor):
            return self._encode_with_tensor(prompt, images)
        images = as_image_list(images)
        if images and not self.sees_images:
            raise UserError(
                "This model cannot see images; send the message without an image, or load a vision model "
                "(a Hugging Face vision-language folder with --pretrained_path)."
            )
        if not self.sees_images:
            return self.tokenizer.encode(prompt, bos=True, eos=False), {}
        transform = image_transform if image_transform not in (None, "auto") else self.image_transform
        if transform is not None:  # an Accessory transform: the image squared to the model's input first
            mean = getattr(self.processor.image_processor, "image_mean", None) or (0.5, 0.5, 0.5)
            images = [shape_image(image, transform, self.image_size, mean) for image in images]
        return encode_with_processor(self.processor, prompt, images, self.llma.dtype, self.device)

    def _encode_with_tensor(self, prompt: str, pixels: torch.Tensor) -> tuple[list[int], dict]:
        """An image the caller already transformed, Accessory style ([3, H, W] or [1, 3, H, W]): the processor only
        lays out the image tokens, and these pixels replace its own."""
        if not self.sees_images:
            return self._encode(prompt, [pixels], None)  # the sentence for a text-only model
        size = self.image_size
        pixels = pixels if pixels.dim() == 4 else pixels[None]
        if tuple(pixels.shape[-2:]) != (size, size):
            raise UserError(
                f"The image tensor is {tuple(pixels.shape[-2:])} but this model takes {size}x{size}; "
                "build it with get_transform(..., model.llma.image_size)."
            )
        ids, extra = encode_with_processor(
            self.processor, prompt, [Image.new("RGB", (size, size))], self.llma.dtype, self.device
        )
        if tuple(extra["pixel_values"].shape) != tuple(pixels.shape):
            raise UserError("This model's processor does not take a transformed image tensor; pass the PIL image.")
        extra["pixel_values"] = pixels.to(self.device, dtype=self.llma.dtype)
        return ids, extra

    @property
    def image_transform(self) -> str | None:
        """The Accessory transform this model was trained with (its config's `image_transform`), or None: its
        processor fits each image to the model itself (tiling, dynamic resolution)."""
        return getattr(self.llma.config, "image_transform", None)

    @property
    def chat_renderer(self):
        """What renders this model's chat template: its processor where it has one with a template (typed parts, image
        markers), else its Hugging Face tokenizer; None without a chat template."""
        if self.processor is not None and getattr(self.processor, "chat_template", None):
            return self.processor
        hf = getattr(self.tokenizer, "hf", None)
        return hf if getattr(hf, "chat_template", None) else None

    def prompt_length(self, prompt: str, image=None, image_transform: str | None = None) -> int:
        """How many tokens `prompt` (with `image`, an image or a list: their image tokens included) takes."""
        return len(self._encode(prompt, image, image_transform)[0])

    def answer_room(self, prompt_tokens: int, max_gen_len: int) -> int:
        """How many tokens may be generated: `max_gen_len`, clamped to what `max_seq_len` leaves."""
        if not max_gen_len >= 1:
            raise UserError(f"The answer length (max_gen_len) is {max_gen_len}; ask for at least 1 token.")
        room = self.max_seq_len - prompt_tokens
        if room < 1:
            raise UserError(
                f"The prompt is {prompt_tokens} tokens long and leaves no room for an answer within the "
                f"{self.max_seq_len}-token context; shorten it or start a new conversation."
            )
        return max(1, min(max_gen_len, room))

    # ----- generation -----

    def _streams(self, count, stop_symbols, max_new_tokens, cancel, special_tokens=False) -> list[AnswerStream]:
        eos_ids = self.eos_ids(stop_symbols)
        decode = self.tokenizer.decode_with_specials if special_tokens else self.tokenizer.decode
        return [AnswerStream(decode, eos_ids, stop_symbols, max_new_tokens, cancel) for _ in range(count)]

    def _decider(self, streams: list[AnswerStream]):
        decide = batch_decider(streams)
        return decide if self.lockstep is None else self.lockstep.shared(decide)

    @property
    def failure(self) -> str | None:
        """Why this model cannot answer any more (a tensor-parallel worker died), or None."""
        return self.followers.failure() if self.followers is not None else None

    # ----- the engine interface (engine/interface.py) -----

    def generation_defaults(self) -> Sampling:
        """The chat's sampling, with the temperature, top_p, top_k and repetition penalty the checkpoint's
        generation_config.json sets (those its authors chose for it)."""
        config = getattr(self.llma, "generation_config", None)
        chosen = config.to_diff_dict() if config is not None else {}
        fields = ("temperature", "top_p", "top_k", "repetition_penalty")
        return Sampling().but(**{name: chosen[name] for name in fields if chosen.get(name) is not None})

    def drop_sessions(self, browser_session: str) -> None:
        self.sessions.drop(browser_session)

    def stream(self, request: Request) -> Iterator[Event]:
        """The events of `request`'s answer (see engine/interface.py): new text, then its end. Never raises: an error
        ends the stream as one sentence (a bug's traceback goes to the log)."""
        sent, sent_tokens = "", 0
        try:
            for item in self._answer(
                request.prompt,
                request.images,
                request.image_transform,
                request.sampling,
                tuple(request.stop),
                request.session,
                request.logprobs,
                cancel=request.cancel,
                special_tokens=request.special_tokens,
            ):
                if isinstance(item, End):
                    yield item
                    return
                tokens = item.sent_tokens() if request.logprobs is not None else 0
                if len(item.text) > len(sent) or tokens > sent_tokens:
                    yield Delta(item.text[len(sent) :], item.logprobs[sent_tokens:tokens])
                    sent, sent_tokens = item.text, tokens
        except UserError as error:
            yield End.failed(str(error), caller_error=True)
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
            (r.sampling, tuple(r.stop), r.image_transform, r.special_tokens)
            != (first.sampling, tuple(first.stop), first.image_transform, first.special_tokens)
            for r in requests
        ):
            raise UserError(
                "A batch of requests must share its sampling, stop strings and image transform; send them in "
                "separate batches."
            )
        images = [r.images for r in requests]
        details = self._batch(
            [r.prompt for r in requests],
            None if all(i is None for i in images) else images,
            first.sampling,
            tuple(first.stop),
            first.cancel,
            first.image_transform,
            first.special_tokens,
        )
        return [Answer(d.pop("text"), End(**d)) for d in details]

    # ----- LLaMA2-Accessory's API, over the same generation -----

    def stream_generate(
        self,
        prompt: str,
        image=None,
        max_gen_len: int = ACCESSORY_SAMPLING.max_new_tokens,
        temperature: float = ACCESSORY_SAMPLING.temperature,
        top_p: float = ACCESSORY_SAMPLING.top_p,
        additional_stop_symbols: Sequence[str] = (),
        *,
        top_k: int = 0,
        seed: int | None = None,
        repetition_penalty: float = 1.0,
        cancel: threading.Event | None = None,
        image_transform: str | None = None,
        session: str | None = None,
    ) -> Iterator[dict]:
        """Yield {"text": answer so far, "end_of_content": False} as the answer grows, then a last piece with
        "end_of_content": True, "finish_reason" ("stop", "length" or "cancelled"), token counts and timings.

        `text` never holds a stop symbol nor ends with the start of one. Setting `cancel` (or closing this
        generator) stops the model before its next forward pass. `session` names a conversation (a browser tab,
        say): the keys and values of its last turn are kept, and this turn runs only the tokens of its prompt
        that differ from them (`cached_tokens` in the last piece counts the others; see model/prefix_cache.py).
        Raises `UserError` for what the user can fix. (`stream` is the same answer as events.)
        """
        sampling = Sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty, seed)
        shown = ""
        for item in self._answer(
            prompt, image, image_transform, sampling, tuple(additional_stop_symbols), session, cancel=cancel
        ):
            if isinstance(item, End):
                figures = {k: v for k, v in vars(item).items() if k not in ("error", "caller_error", "encode_time")}
                yield {"text": shown, "end_of_content": True, **figures}
            elif item.done:
                shown = item.text  # the whole answer goes with the last piece
            elif item.text != shown:
                shown = item.text
                yield {"text": shown, "end_of_content": False}

    def generate(
        self,
        prompts: Sequence[str],
        images=None,
        max_gen_len: int = ACCESSORY_SAMPLING.max_new_tokens,
        temperature: float = ACCESSORY_SAMPLING.temperature,
        top_p: float = ACCESSORY_SAMPLING.top_p,
        additional_stop_symbols: Sequence[str] = (),
        *,
        top_k: int = 0,
        seed: int | None = None,
        repetition_penalty: float = 1.0,
        cancel: threading.Event | None = None,
        image_transform: str | None = None,
        return_details: bool = False,
    ) -> list:
        """Answers to a batch of prompts (left-padded, one pass). With `return_details`, each answer is the
        dict of `stream_generate`'s last piece instead of its text, plus the batch's `encode_time`."""
        sampling = Sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty, seed)
        details = self._batch(list(prompts), images, sampling, tuple(additional_stop_symbols), cancel, image_transform)
        return details if return_details else [d["text"] for d in details]

    # ----- generation -----

    @announced
    def _answer(
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
    ) -> Iterator[AnswerStream | End]:
        """One answer: its `AnswerStream` after every step (its text, tokens, log-probabilities), then its `End`.
        Announced to the other ranks in tensor parallel, which run it alongside (they ignore what it yields)."""
        with self._one_more_answer() as others:
            inputs = self.prepare_inputs([prompt], None if images is None else [images], image_transform)
            prompt_tokens = inputs.input_ids.shape[1]
            max_new = self.answer_room(prompt_tokens, sampling.max_new_tokens)
            [stream] = self._streams(1, list(stop), max_new, cancel, special_tokens)
            prompt_ids = inputs.input_ids[0].tolist()
            batchable = self._batchable(inputs, sampling, logprobs, beside_others=others > 0)
            in_batch = bool(others) and batchable
            if not in_batch:
                in_batch = yield from self._answer_alone(inputs, sampling, stream, session, logprobs, batchable)
            if in_batch:  # from the start, or from when others came
                for _ in self.batcher.tokens(prompt_ids + stream.token_ids, sampling, self.eos_ids(stop), stream):
                    yield stream
            yield End(**stream.summary(prompt_tokens), cached_tokens=inputs.cached)

    @contextmanager
    def _one_more_answer(self):
        """Count an answer in flight while it runs; gives how many others were."""
        with self._answers_lock:
            others = self._answers_in_flight
            self._answers_in_flight += 1
        try:
            yield others
        finally:
            with self._answers_lock:
                self._answers_in_flight -= 1

    def _batchable(self, inputs: ModelInputs, sampling: Sampling, logprobs: int | None, beside_others: bool) -> bool:
        """Whether the batch can compute this answer (see model/batching.py); the terminal says why not when it runs
        `beside_others` in the batch."""
        if self.batcher is None:
            return False
        why = why_unbatchable(sampling, logprobs, bool(inputs.family))
        if why is not None and beside_others:
            print(f"note: an answer runs on its own beside the batch: {why}.", file=sys.stderr, flush=True)
        return why is None

    def _answer_alone(
        self, inputs: ModelInputs, sampling: Sampling, stream: AnswerStream, session, logprobs, can_join: bool
    ) -> Generator[AnswerStream, None, bool]:
        """The one-at-a-time path: `generate_tokens` over the session's cache, until the answer is done, or, if it
        `can_join` the batch, until another answer runs (the rest of it is computed in the batch: one answer on
        its own beside the batch would take turns with it at every step). Returns whether it left for the batch."""
        pixels_key = image_key(inputs.family.images) if session is not None else None  # only a kept cache needs it
        cache, session = self.sessions.take(session, inputs, pixels_key, self.static)
        sampled: list[int] = []
        joins_batch = False
        observe = None if logprobs is None else self._logprob_recorder(stream, logprobs)
        steps = generate_tokens(
            self.llma, inputs, sampling, self._decider([stream]), cache, self.static, stream.max_new_tokens, observe
        )
        try:
            if stream.cancelled() and self.lockstep is None:  # in lockstep the first step's decision says so
                stream.finish("cancelled")
                steps.close()
            for tokens in steps:
                sampled.append(int(tokens[0]))
                yield stream
                if can_join and self._answers_in_flight > 1 and not stream.done:
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
            self.sessions.keep(session, inputs, cache, sampled, pixels_key)
        return joins_batch

    def _logprob_recorder(self, stream: AnswerStream, top: int):
        """The `observe` callback that records each sampled token's log-probability and the `top` likeliest."""
        decode = self.tokenizer.decode

        def observe(logits: torch.Tensor, tokens: torch.Tensor) -> None:
            scores = torch.log_softmax(logits[0].float(), dim=-1)
            token = int(tokens[0])
            best = scores.topk(top) if top else None
            alternatives = [] if best is None else list(zip(best.indices.tolist(), best.values.tolist()))
            stream.logprobs.append(
                TokenLogprob(token, decode([token]), float(scores[token]), [(decode([i]), v) for i, v in alternatives])
            )

        return observe

    @announced
    def _batch(
        self,
        prompts,
        images,
        sampling: Sampling,
        stop: tuple[str, ...] = (),
        cancel=None,
        image_transform=None,
        special_tokens: bool = False,
    ) -> list[dict]:
        """A left-padded batch's answers, each as the dict of `End`'s fields with its "text" and the batch's
        `encode_time`."""
        encode_started = time.perf_counter()
        inputs = self.prepare_inputs(list(prompts), images, image_transform)
        encode_time = time.perf_counter() - encode_started
        lengths = inputs.attention_mask.sum(dim=1).tolist()
        max_new = self.answer_room(inputs.input_ids.shape[1], sampling.max_new_tokens)
        streams = self._streams(len(prompts), list(stop), max_new, cancel, special_tokens)
        for _ in generate_tokens(
            self.llma, inputs, sampling, self._decider(streams), static=self.static, max_new_tokens=max_new
        ):
            pass
        return [{"text": s.text, **s.summary(n), "encode_time": encode_time} for s, n in zip(streams, lengths)]
