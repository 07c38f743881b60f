"""Conversations that stay fast: time to first piece at a turn holding a long history, over turn 1, with the
session's KV cache kept between turns (`ttft_history_ratio`), the same with `--compile`
(`ttft_history_ratio_compile`: the session's keys and values are copied into the static cache), and without
(`ttft_history_ratio_naive`), and in the continuous batch beside another answer (`ttft_history_ratio_batch`: the
history's pages of the paged cache reused). Also turn 1's decode speed with `--compile` over without
(`compile_decode_ratio`: a compiled step attends over its whole static cache, sized to the request)."""

from __future__ import annotations

import random
import statistics
import threading
import time
from contextlib import contextmanager

from local_chat.model.meta import MetaModel

from .models import SHAPES, eos_ignored, random_meta_model
from .timing import interleaved_values

ANSWER_TOKENS = 24


def message(rng: random.Random) -> str:
    return " ".join(f"w{rng.randrange(1000)}" for _ in range(60))


def turn(model: MetaModel, history: list[dict], question: str, session: str | None) -> tuple[float, float, str, int]:
    """One chat turn: (seconds to the first piece, answer tokens/s after it, the answer, the prompt's tokens). The
    answer runs to its end, so a session keeps its whole turn."""
    from local_chat.prompting import chat_prompt

    chat = chat_prompt(model.engine, "default", None, history, question, answer_tokens=ANSWER_TOKENS)
    started = time.perf_counter()
    pieces = model.stream_generate(
        chat.text, max_gen_len=ANSWER_TOKENS, additional_stop_symbols=chat.stop_symbols, session=session
    )
    next(pieces)
    first_piece = time.perf_counter()
    *_, last = pieces
    decode_rate = (last["completion_tokens"] - 1) / (time.perf_counter() - first_piece)
    return first_piece - started, decode_rate, last["text"].strip(), last["prompt_tokens"]


@contextmanager
def beside_another_answer(model: MetaModel):
    """Keep one other answer in flight on `model` (batching on), so that the turns asked meanwhile run in the
    batch."""
    from local_chat.engine import Request, Sampling, collect

    done = threading.Event()

    def keep_busy() -> None:
        while not done.is_set():
            collect(model.engine.stream(Request("Go on:", Sampling(ANSWER_TOKENS, temperature=0.0))))

    worker = threading.Thread(target=keep_busy)
    worker.start()
    while model.engine.in_flight.count < 1:
        time.sleep(0.001)
    try:
        yield
    finally:
        done.set()
        worker.join()


def run(settings) -> dict[str, float]:
    model = random_meta_model(SHAPES[settings.cache_shape], max_seq_len=4096)
    compiled = MetaModel(model.llma, model.tokenizer, max_seq_len=4096, compile=True)  # the same weights
    batched = MetaModel(model.llma, model.tokenizer, max_seq_len=4096)
    batched.engine.start_batching(8)
    rng = random.Random(0)
    with eos_ignored(model):  # the two share their tokenizer and generation config
        history, question, prompt_tokens = [], message(rng), 0
        while prompt_tokens < settings.cache_history_tokens:  # build the conversation, turn by turn
            *_, text, prompt_tokens = turn(model, history, question, "build")
            history += [{"role": "user", "content": question}, {"role": "assistant", "content": text}]
            question = message(rng)
        earlier, last_question = history[:-2], history[-2]["content"]
        first_question = history[0]["content"]

        def with_reuse(chat_model: MetaModel) -> tuple[float, float]:
            turn(chat_model, earlier, last_question, "bench")  # the turn before, as the session had it
            return turn(chat_model, history, question, "bench")[:2]

        runs = {
            "turn1": lambda: turn(model, [], first_question, None)[:2],  # (time to first piece, tokens/s)
            "reuse": lambda: with_reuse(model),
            "naive": lambda: turn(model, history, question, None)[:2],
            "turn1_compile": lambda: turn(compiled, [], first_question, None)[:2],
            "reuse_compile": lambda: with_reuse(compiled),
            "turn1_batch": lambda: in_batch(lambda: turn(batched, [], first_question, None)[:2]),
            "reuse_batch": lambda: in_batch(lambda: with_reuse(batched)),
        }

        def in_batch(ask):
            with beside_another_answer(batched):
                return ask()

        try:
            values = interleaved_values(runs, settings.cache_repeats, settings.warmups)
        finally:
            batched.engine.stop_batching()
    median = {name: statistics.median(first for first, _ in pairs) for name, pairs in values.items()}
    rate = {name: statistics.median(rate for _, rate in values[name]) for name in ("turn1", "turn1_compile")}
    return {
        "ttft_history_ratio": median["reuse"] / median["turn1"],
        "ttft_history_ratio_compile": median["reuse_compile"] / median["turn1_compile"],
        "ttft_history_ratio_naive": median["naive"] / median["turn1"],
        "ttft_history_ratio_batch": median["reuse_batch"] / median["turn1_batch"],
        "compile_decode_ratio": rate["turn1_compile"] / rate["turn1"],
        "cache_history_tokens": float(prompt_tokens),
    }
