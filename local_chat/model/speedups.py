"""How a model's decode steps are sped up: `--compile`, CUDA graphs and continuous batching, or why they are not
(the model panel and the terminal say which)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from local_chat.engine.interface import Sampling
from local_chat.errors import UserError

from .compiled import CompiledDecoding, StaticDecoding
from .generation import generate_tokens
from .graphs import GraphedDecoding
from .parallel import Lockstep
from .prefix_cache import keeps_states
from .token_choice import TokenChoice


@dataclass
class Decoding:
    """How the decode steps run: over `--compile`'s static cache, replayed from CUDA graphs, or eagerly (both None);
    `info`: what the model panel says of each."""

    compiled: CompiledDecoding | None
    graphs: GraphedDecoding | None
    info: dict
    speculative: str = "off"  # "ngram": answers guess tokens from the prompt (model/speculative.py); "draft": by
    draft: object = None  # --draft_model's small model

    @property
    def static(self) -> StaticDecoding | None:
        """The decoding over a static cache, if any: `--compile`'s, or the CUDA graphs'."""
        return self.compiled or self.graphs


def plan_decoding(
    llma,
    max_seq_len: int,
    compile: bool,
    cuda_graphs: bool,
    lockstep: Lockstep | None,
    speculative: str = "ngram",
    draft=None,
) -> Decoding:
    """The `Decoding` for `llma`: `compile` as asked (a `UserError` where it cannot be), CUDA graphs where `cuda_graphs`
    and the model allow them, `speculative` ("ngram" or "off"; with a `draft` model, its guesses) but in tensor
    parallel."""
    if speculative not in ("ngram", "off"):
        raise UserError(f"--speculative takes ngram or off, not {speculative!r}.")
    if draft is not None and lockstep is not None:
        raise UserError("--draft_model does not work with tensor parallel (--n_gpus) yet; leave out one of the two.")
    if compile and lockstep is not None:  # compiled steps are queued before the ranks have agreed on their tokens
        raise UserError("--compile is not available with tensor parallel yet; leave out one of the two.")
    if compile and keeps_states(llma.config):
        raise UserError(
            f"--compile: {type(llma).__name__}'s linear-attention layers keep a running state, which the compiled "
            "static cache cannot hold; start the app without --compile."
        )
    compiled = CompiledDecoding(llma, max_seq_len) if compile else None
    why_no_graphs = why_no_cuda_graphs(llma, cuda_graphs, compile, lockstep)
    graphs = GraphedDecoding(llma, max_seq_len) if why_no_graphs is None else None
    if graphs is not None and not graphs.keeps_sessions:  # a layer of another kind than StaticLayer
        why_no_graphs = "its sliding-window layers count their cache's length in Python, which a graph cannot replay"
        graphs = None
    info = {
        "compile": CompiledDecoding.name if compile else "off",
        "cuda_graphs": "on: decode steps replayed per cache length" if graphs else f"off: {why_no_graphs}",
    }
    if lockstep is not None:
        speculative, info["speculative"] = "off", "off: tensor parallel" if speculative != "off" else "off"
    elif draft is not None and speculative != "off":
        speculative, info["speculative"] = "draft", f"a draft model ({type(draft).__name__})"
    else:
        info["speculative"] = speculative
    return Decoding(compiled, graphs, info, speculative, draft if speculative == "draft" else None)


def spread_over_devices(llma) -> bool:
    """Whether accelerate's device map put the layers on more than one device."""
    return len(set(getattr(llma, "hf_device_map", {}).values())) > 1


def why_no_cuda_graphs(llma, wanted: bool, compile: bool, lockstep: Lockstep | None) -> str | None:
    if not wanted:
        return "--no_cuda_graphs"
    if llma.device.type != "cuda":
        return "not on a GPU"
    if compile:
        return "--compile records its own"
    if lockstep is not None:
        return "not with tensor parallel (--n_gpus) yet"
    if hasattr(llma, "peft_config"):  # PEFT's adapters over the layers (model/adapters.py)
        return "LoRA adapters switch between answers, which a graph cannot replay"
    if spread_over_devices(llma):
        return "not with the layers spread over GPUs"
    if keeps_states(llma.config):
        return "its linear-attention layers keep a running state, which the graphs' static cache cannot hold"
    if any(type(module).__name__ == "Linear8bitLt" for module in llma.modules()):
        return "bitsandbytes' 8-bit layers look for outliers on the host at each step, which a graph cannot record"
    return None


def why_no_batching(llma, places: int, decoding: Decoding, lockstep: Lockstep | None) -> str | None:
    if places < 2:
        return "one answer at a time (--concurrency 1)"
    if lockstep is not None:
        return "not with tensor parallel yet"
    if decoding.compiled is not None:
        return "not with --compile"
    if spread_over_devices(llma):
        return "not with the layers spread over GPUs"
    return None


def compile_decode_steps(
    llma, encoder, compiled: CompiledDecoding | None, answer_room: Callable[[int, int], int], batch_sizes: Iterable[int]
) -> float:
    """With `compiled`: compile the decode step for the batch sizes to come (1, a chat's answer, has a graph of its
    own, which torch specializes; every other size shares one) now, and on CUDA record it, so that the first
    answer does not wait for it: minutes for a 7B model on a GPU the first time (inductor keeps what it built
    under TORCHINDUCTOR_CACHE_DIR for later launches). Changing torch's thread count after it compiles again.
    Returns the seconds taken."""
    started = time.perf_counter()
    for batch_size in {min(size, 2): size for size in batch_sizes}.values():  # one of each graph
        inputs = encoder.prepare_inputs(["Hello"] * batch_size)
        tokens = answer_room(inputs.input_ids.shape[1], 5)  # 4 decode steps: compiled, recorded, replayed
        count = iter(range(1, tokens))
        decide = lambda _: next(count, None) is None  # noqa: B023, E731 (used within this iteration)
        for _ in generate_tokens(
            llma,
            inputs,
            TokenChoice(Sampling(temperature=0.0), inputs.input_ids, decide),
            static=compiled,
            max_new_tokens=tokens,
        ):
            pass
    return time.perf_counter() - started
