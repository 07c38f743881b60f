"""Conversations that stay fast: time to first piece at a turn holding a long history, over turn 1, with the
session's KV cache kept between turns (`ttft_history_ratio`) and without (`ttft_history_ratio_naive`)."""
from __future__ import annotations

import random
import statistics
import time

from model import MetaModel

from .models import SHAPES, eos_ignored, random_meta_model
from .timing import interleaved_values

ANSWER_TOKENS = 24


def message(rng: random.Random) -> str:
    return " ".join(f"w{rng.randrange(1000)}" for _ in range(60))


def turn(model: MetaModel, history: list[dict], question: str, session: str | None) -> tuple[float, str, int]:
    """One chat turn: (seconds to the first piece, the answer, the prompt's tokens). The answer runs to its end, so
    a session keeps its whole turn."""
    from ui.chat import chat_prompt

    chat = chat_prompt(model, "default", None, history, question, answer_tokens=ANSWER_TOKENS)
    started = time.perf_counter()
    pieces = model.stream_generate(chat.text, max_gen_len=ANSWER_TOKENS, additional_stop_symbols=chat.stop_symbols,
                                   session=session)
    next(pieces)
    first_piece = time.perf_counter() - started
    *_, last = pieces
    return first_piece, last["text"].strip(), last["prompt_tokens"]


def run(settings) -> dict[str, float]:
    model = random_meta_model(SHAPES[settings.cache_shape], max_seq_len=4096)
    rng = random.Random(0)
    with eos_ignored(model):
        history, question, prompt_tokens = [], message(rng), 0
        while prompt_tokens < settings.cache_history_tokens:  # build the conversation, turn by turn
            _, text, prompt_tokens = turn(model, history, question, "build")
            history += [{"role": "user", "content": question}, {"role": "assistant", "content": text}]
            question = message(rng)
        earlier, last_question = history[:-2], history[-2]["content"]
        first_question = history[0]["content"]

        def with_reuse() -> float:
            turn(model, earlier, last_question, "bench")  # the turn before, as the session had it
            return turn(model, history, question, "bench")[0]

        runs = {"turn1": lambda: turn(model, [], first_question, None)[0],
                "reuse": with_reuse,
                "naive": lambda: turn(model, history, question, None)[0]}
        seconds = interleaved_values(runs, settings.cache_repeats)
    turn1 = statistics.median(seconds["turn1"])
    return {"ttft_history_ratio": statistics.median(seconds["reuse"]) / turn1,
            "ttft_history_ratio_naive": statistics.median(seconds["naive"]) / turn1,
            "cache_history_tokens": float(prompt_tokens)}

