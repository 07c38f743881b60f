"""`MetaModel`: LLaMA2-Accessory's model API (`from_pretrained`, `generate`, `stream_generate`) over an ordinary
transformers model, and the `LocalEngine` (model/local_engine.py) the doors use."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import torch

from local_chat.defaults import DEFAULT_CONTEXT
from local_chat.engine.interface import ACCESSORY_SAMPLING, End, Sampling
from local_chat.errors import UserError

from .adapters import Adapters, attach_adapters
from .cpu_linear import swap_linears
from .cpu_threads import hand_back_workers
from .encoding import PromptEncoder
from .loading import QUANT_SKIP_MODULES, load
from .local_engine import LocalEngine
from .parallel import Lockstep
from .prefix_cache import PrefixCaches
from .session_cache import SessionCaches
from .speedups import plan_decoding


def avoid_cudnn_attention() -> None:
    """Keep attention off cuDNN in this process. PyTorch sends bf16/fp16 attention to cuDNN first on recent GPUs,
    and cuDNN builds an execution plan for every new sequence length. While the KV cache grows by one token a
    step, each step with a length not seen before waited tens of milliseconds for its plan: on an H100 the demo
    model's first answer decoded 12 tokens/s, later ones 340. Flash and memory-efficient attention need no plans
    (with them: 115 and 281)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


class MetaModel(torch.nn.Module):
    """A loaded chat model: `llma` (the transformers model), `tokenizer`, for vision models `processor`, and
    `engine`, the `LocalEngine` that answers (the app's doors use it; `generate` and `stream_generate` too)."""

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
        adapters: Adapters | None = None,
        speculative: str = "ngram",
        draft=None,
    ):
        """`prefix_caches`: the conversations' KV caches kept between turns (default: `MAX_CACHED_SESSIONS` of
        them); `lockstep` and `followers`: tensor parallel's (model/parallel.py): the ranks that decide each
        step together, and on rank 0 of the launchers' layout the other ranks each generation is announced to;
        `cuda_graphs`: on one GPU without `compile`, replay the decode steps from CUDA graphs (model/graphs.py);
        `adapters`: the LoRA adapters over `llma` (model/adapters.py); `speculative`: "ngram" (greedy answers guess
        tokens from the prompt, model/speculative.py) or "off"; `draft`: a small transformers model of the same
        tokenizer whose greedy tokens are the guesses instead."""
        super().__init__()
        decoding = plan_decoding(llma, max_seq_len, compile, cuda_graphs, lockstep, speculative, draft)
        self.llma = llma
        self.tokenizer = tokenizer
        self.processor = processor
        self.max_seq_len = max_seq_len
        store = prefix_caches if prefix_caches is not None else PrefixCaches()  # an empty one is falsy
        encoder = PromptEncoder(llma, tokenizer, processor)
        sessions = SessionCaches(llma, processor, store, lockstep)
        self.engine = LocalEngine(
            llma, tokenizer, encoder, sessions, decoding, max_seq_len, dict(info or {}), lockstep, followers, adapters
        )
        if encoder.sees_images:
            llma.image_size = encoder.image_size  # the guide reads model.llma.image_size
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
        lora: dict | None = None,
        merge_lora: bool = False,
        speculative: str = "ngram",
        draft_model: str | None = None,
    ) -> MetaModel:
        """Load a Hugging Face folder, or an Accessory / Meta consolidated checkpoint (one folder or a list).

        `quant`: None, 4, 8, or True (= 4): bitsandbytes' on a GPU, torch's CPU kernels on the CPU
        (model/cpu_linear.py). `dtype`: bf16 on CUDA and on CPUs that compute bf16 natively, else fp32, unless given
        (or set in the environment's LOCAL_CHAT_DTYPE).
        `compile`: decode steps run `torch.compile`d over a static KV cache of `max_seq_len` tokens (the first
        answers are slow while it compiles, unless `compile_decoding()` ran first; worth it on a GPU).
        `trust_remote_code`: run the Python code a Hugging Face checkpoint ships (off: such a checkpoint is refused).
        `prefix_caches`, `followers`, `cuda_graphs`: see `MetaModel`.
        `lora`: PEFT LoRA adapters to load over the model, {name: folder} (model/adapters.py): a request names the
        one its answer runs with (`stream_generate(adapter=...)`); `merge_lora`: fold the one adapter into the weights.
        `speculative`: see `MetaModel`; `draft_model`: the folder of a small Hugging Face model of the same tokenizer
        whose greedy tokens are the guesses (loaded beside the model, in its dtype and on its device).
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
            # PEFT's layers wrap transformers' own; inductor packs its own weights (and cannot lower prepacked ones)
            cpu_kernels=not (lora and not merge_lora) and not compile,
        )
        lockstep = (
            Lockstep(mp_group) if mp_group is not None and torch.distributed.get_world_size(mp_group) > 1 else None
        )
        adapters = None
        if lora:
            check_adapter_flags(lockstep is not None, compile, quant, merge_lora)
            loaded.model, adapters = attach_adapters(loaded.model, lora, merge_lora)
            loaded.info["adapter"] = next(iter(lora)) if merge_lora else ""
        if loaded.cpu_kernels:
            loaded.info["cpu_kernels"] = swap_linears(loaded.model, loaded.bits, QUANT_SKIP_MODULES) or "off"
        model = MetaModel(
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
            adapters,
            speculative,
            load_draft(draft_model, loaded, dtype, device) if draft_model and speculative != "off" else None,
        )
        hand_back_workers()  # the answers run in other threads (model/cpu_threads.py)
        return model

    @property
    def device(self) -> torch.device:
        return self.llma.device

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
        adapter: str | None = None,
    ) -> Iterator[dict]:
        """Yield {"text": answer so far, "end_of_content": False} as the answer grows, then a last piece with
        "end_of_content": True, "finish_reason" (a `FinishReason`, a string: "stop", "length" or "cancelled"), token
        counts and timings.

        `text` never holds a stop symbol nor ends with the start of one. Setting `cancel` (or closing this
        generator) stops the model before its next forward pass. `session` names a conversation (a browser tab,
        say): the keys and values of its last turn are kept, and this turn runs only the tokens of its prompt
        that differ from them (`cached_tokens` in the last piece counts the others; see model/prefix_cache.py).
        `adapter`: the LoRA adapter (of `from_pretrained`'s `lora`) the answer runs with; None: the model alone.
        Raises `UserError` for what the user can fix. (`stream` is the same answer as events.)
        """
        sampling = Sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty, seed)
        shown = ""
        for item in self.engine.answer_steps(
            prompt,
            image,
            image_transform,
            sampling,
            tuple(additional_stop_symbols),
            session,
            cancel=cancel,
            adapter=adapter,
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
        adapter: str | None = None,
    ) -> list:
        """Answers to a batch of prompts (left-padded, one pass). With `return_details`, each answer is the
        dict of `stream_generate`'s last piece instead of its text, plus the batch's `encode_time`. `adapter`: as in
        `stream_generate`."""
        sampling = Sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty, seed)
        details = self.engine.batch_answers(
            list(prompts), images, sampling, tuple(additional_stop_symbols), cancel, image_transform, adapter=adapter
        )
        return details if return_details else [d["text"] for d in details]


def check_adapter_flags(tensor_parallel: bool, compile: bool, quant, merge: bool) -> None:
    """LoRA adapters' refusals, one sentence each: what they cannot go with yet."""
    if tensor_parallel:
        raise UserError("--lora does not work with tensor parallel (--n_gpus) yet; load the model on one device.")
    if compile and not merge:
        raise UserError("--compile cannot switch LoRA adapters between answers; add --merge_lora or drop --compile.")
    if quant and merge:
        raise UserError(
            "--merge_lora would round the adapter into the quantized weights; drop --quant or --merge_lora."
        )


def load_draft(folder: str, loaded, dtype, device):
    """--draft_model's transformers model, beside `loaded` (the model it guesses for): one of another tokenizer is a
    `UserError` (its guesses would be other tokens)."""
    draft = load(folder, dtype=dtype, device=device)
    if vocabulary(draft.tokenizer) != vocabulary(loaded.tokenizer):
        raise UserError(
            f"--draft_model {folder} has another tokenizer than the model; give a smaller model of the same family "
            "(the same tokenizer), or leave --draft_model out."
        )
    if draft.cpu_kernels:
        swap_linears(draft.model, None, QUANT_SKIP_MODULES)
    return draft.model.eval()


def vocabulary(tokenizer) -> dict[str, int]:
    """A tokenizer's tokens and their ids (a Hugging Face one's, or a sentencepiece model's)."""
    if getattr(tokenizer, "hf", None) is not None:
        return tokenizer.hf.get_vocab()
    return {tokenizer.sp.id_to_piece(i): i for i in range(tokenizer.sp.vocab_size())}
