"""bench/gpu.py's part `batching`: 8 greedy answers at once with continuous batching, each on a thread of its own,
over one alone and over transformers' own continuous batching."""

from __future__ import annotations

import functools
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from bench.gpu_timing import synchronize
from bench.models import eos_ignored
from local_chat.engine import End, Request, Sampling
from local_chat.model.meta import MetaModel


def answer_rate(model: MetaModel, prompt: str, new_tokens: int) -> tuple[float, float, list[int]]:
    """(seconds to the first token, tokens/s over the whole answer, its tokens) of one greedy answer."""
    request = Request(prompt, Sampling(new_tokens, temperature=0.0))
    started = time.perf_counter()
    first = None
    for event in model.engine.stream(request):
        first = first or time.perf_counter() - started
        if isinstance(event, End):
            assert event.completion_tokens == new_tokens, event
            return first, new_tokens / (time.perf_counter() - started), event.token_ids
    raise AssertionError("the stream ended without its End")


def crowd_rate(model: MetaModel, prompts: list[str], new_tokens: int) -> tuple[float, list[float], list[list[int]]]:
    """(total tokens/s, each one's time to first token, each one's tokens) of greedy answers to `prompts` asked at
    once, each on a thread of its own (as the model's process serves the app's clients)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda prompt: answer_rate(model, prompt, new_tokens), prompts))
    return len(prompts) * new_tokens / (time.perf_counter() - started), [a[0] for a in answers], [a[2] for a in answers]


def transformers_batch_rate(model: MetaModel, prompts: list[str], new_tokens: int) -> float:
    """Total tokens/s of transformers' own continuous batching (`generate_batch`, what `transformers serve
    --continuous-batching` runs) on the same prompts, with its default configuration."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    ids = [model.tokenizer.encode(prompt, bos=True, eos=False) for prompt in prompts]
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1)
    # its default cache takes a share of all memory: on the CPU (--smoke) a small one
    batching = ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=512) if model.device.type == "cpu" else None
    run = functools.partial(model.llma.generate_batch, generation_config=config, continuous_batching_config=batching)
    run(ids[:2])  # warm up
    synchronize(model.device)
    started = time.perf_counter()
    outputs = run(ids)
    synchronize(model.device)
    assert all(len(o.generated_tokens) == new_tokens for o in outputs.values())
    return len(prompts) * new_tokens / (time.perf_counter() - started)


def batching_figures(model: MetaModel, prompt: str, new_tokens: int, clients: int, repeats: int) -> dict:
    """Greedy answers of `clients` threads at once with continuous batching, against one alone, against one alone
    on the one-at-a-time path (batching off), and against transformers' own continuous batching."""
    prompts = [f"{prompt} {n}" for n in range(clients)]
    with eos_ignored(model):
        answer_rate(model, prompts[0], 8)  # warm up
        alone_path = [answer_rate(model, prompts[0], new_tokens) for _ in range(repeats)]
        batching = model.engine.start_batching(clients)
        crowd_rate(model, prompts[:2], 8)  # warm up the batch's shapes
        alone, crowds, firsts = [], [], []
        for _ in range(repeats):
            alone.append(answer_rate(model, prompts[0], new_tokens))
            rate, waits, tokens = crowd_rate(model, prompts, new_tokens)
            crowds.append(rate)
            firsts += waits
        reference = [answer_rate(model, p, new_tokens)[2] for p in prompts]  # each alone (one at a time)
        model.engine.stop_batching()
        theirs = transformers_batch_rate(model, prompts, new_tokens)
    alone_rate = statistics.median(a[1] for a in alone)
    crowd = statistics.median(crowds)
    return {
        "gpu_batching": batching,
        "gpu_batching_crowd_tok_s": crowd,
        "gpu_batching_alone_tok_s": alone_rate,
        "gpu_batching_crowd_over_alone": crowd / alone_rate,
        "gpu_batching_alone_over_one_at_a_time": alone_rate / statistics.median(a[1] for a in alone_path),
        "gpu_batching_wait_p90_over_alone": sorted(firsts)[int(0.9 * len(firsts))]
        / statistics.median(a[0] for a in alone),
        "gpu_transformers_cb_tok_s": theirs,
        "gpu_batching_over_transformers_cb": crowd / theirs,
        "gpu_batching_same_tokens_as_alone": sum(a == b for a, b in zip(tokens, reference)) / clients,
    }
