"""Continuous batching (model/batching.py): answers that run at the same time are computed in one batch per step,
and each is the answer it would be alone, with its own stops, Stop, sampling and limits.

The demo model (a vision model) and a random Llama, each loaded afresh with batching on. An answer that starts
while none runs takes the one-at-a-time path, so every test keeps others in flight while it asks."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from fixtures.app_server import ForwardCounter, serve
from local_chat.defaults import DEMO_MODEL
from local_chat.engine import Delta, End, Request, Sampling, collect
from local_chat.model.meta import MetaModel

CAPITALS = [
    ("France", "Paris"),
    ("Germany", "Berlin"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Japan", "Tokyo"),
    ("Canada", "Ottawa"),
    ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Chile", "Santiago"),
    ("Greece", "Athens"),
    ("Norway", "Oslo"),
]
GREEDY = Sampling(max_new_tokens=64, temperature=0.0)


@pytest.fixture(scope="module")
def demo():
    model = MetaModel.from_pretrained(str(DEMO_MODEL))
    assert model.engine.start_batching(8).startswith("continuous batching")
    yield model
    model.engine.stop_batching()


@pytest.fixture(scope="module")
def random_llama(byte_llama_dir):
    model = MetaModel.from_pretrained(str(byte_llama_dir))
    model.engine.eos_ids = lambda stop_symbols=(): set()  # answers run to their length: long enough to stop midway
    model.engine.start_batching(4)
    yield model
    model.engine.stop_batching()


def conversations(count: int, turns: int) -> list[list[str]]:
    return [
        [f"What is the capital of {CAPITALS[(c + t) % len(CAPITALS)][0]}?" for t in range(turns)] for c in range(count)
    ]


def converse(ask, questions: list[str]) -> list[str]:
    """A conversation through `ask(question, history)`, each answer fed back as history."""
    history, answers = [], []
    for question in questions:
        answers.append(ask(question, history))
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": answers[-1]}]
    return answers


def at_once(ask, talks: list[list[str]]) -> list[list[str]]:
    with ThreadPoolExecutor(len(talks)) as pool:
        return list(pool.map(lambda questions: converse(ask, questions), talks))


def test_eight_conversations_at_once_through_v1_answer_as_each_does_alone(demo):
    from openai import OpenAI

    with serve(demo, concurrency=8) as (url, _):
        api = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

        def ask(question: str, history: list[dict]) -> str:
            messages = [*history, {"role": "user", "content": question}]
            return api.chat.completions.create(model="x", messages=messages, temperature=0.0).choices[0].message.content

        talks = conversations(8, 3)
        alone = [converse(ask, questions) for questions in talks]
        batched_before = demo.engine.batcher.answers
        together = at_once(ask, talks)
    assert together == alone
    assert alone[0][0] == "The capital of France is Paris."
    assert demo.engine.batcher.answers - batched_before >= 12  # most of the 24 answers ran in the batch


def test_eight_conversations_at_once_through_gradio_client_answer_as_each_does_alone(demo):
    from gradio_client import Client

    with serve(demo, concurrency=8) as (url, _):
        clients = [Client(url, verbose=False) for _ in range(8)]

        def asker(client):
            return lambda question, history: client.predict(
                message=question, history=history, temperature=0.0, api_name="/chat"
            )

        talks = conversations(8, 3)
        alone = [converse(asker(clients[0]), questions) for questions in talks]
        batched_before = demo.engine.batcher.answers
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda i: converse(asker(clients[i]), talks[i]), range(8)))
    assert together == alone
    assert demo.engine.batcher.answers - batched_before >= 12


def long_answers(model, count: int, tokens: int = 150, **request) -> list:
    """Start `count` greedy answers of `tokens` tokens on threads; returns (threads, results) once all run."""
    results = [None] * count

    def answer(i):
        results[i] = collect(model.engine.stream(Request(f"Story {i}:", Sampling(tokens, temperature=0.0), **request)))

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    while model.engine.in_flight.count < count:  # every one has started (the first alone, the others batched)
        time.sleep(0.005)
    return threads, results


class BatchSteps:
    """Counts the batch's forward passes (those over its paged cache), each slowed by `delay` seconds."""

    def __init__(self, model, delay: float):
        self.model, self.calls, self._original = model, 0, model.llma.forward

        def counted(*args, **kwargs):
            if type(kwargs.get("cache")).__name__ == "PagedAttentionCache":
                self.calls += 1
                time.sleep(delay)
            return self._original(*args, **kwargs)

        model.llma.forward = counted

    def restore(self) -> None:
        self.model.llma.forward = self._original


def stop_mid_batch(model, steps, tokens: int) -> tuple:
    """Three answers of `tokens` tokens at once, and a fourth stopped after its fifth piece: (the stopped one's End,
    the forward passes `steps` counted from its Stop to its end, the three's results). Restores `steps` after."""
    try:
        threads, results = long_answers(model, 3, tokens)
        cancel = threading.Event()
        stopped = model.engine.stream(Request("Stop me:", Sampling(tokens, temperature=0.0), cancel=cancel))
        for _ in range(5):
            assert isinstance(next(stopped), Delta)
        cancel.set()
        steps_then = steps.calls
        end = [event for event in stopped if isinstance(event, End)][0]
        steps_taken = steps.calls - steps_then
        for thread in threads:
            thread.join()
    finally:
        steps.restore()
    return end, steps_taken, results


def test_a_stopped_answer_ends_within_two_steps_while_the_others_finish(random_llama):
    end, steps_taken, results = stop_mid_batch(random_llama, BatchSteps(random_llama, delay=0.02), 150)
    assert end.finish_reason == "cancelled" and steps_taken <= 2
    assert [r.end.finish_reason for r in results] == ["length"] * 3
    assert [r.end.completion_tokens for r in results] == [150] * 3
    assert random_llama.engine.batcher.answers >= 3  # the stopped one and at least two others ran in the batch


def test_answers_in_a_batch_equal_the_same_answers_alone_and_keep_their_stops(random_llama):
    alone = [
        collect(random_llama.engine.stream(Request(f"Story {i}:", Sampling(40, temperature=0.0)))) for i in range(4)
    ]
    stop = alone[2].text[12:15]  # a stop string inside answer 2: it ends there, never shown
    threads, results = long_answers(random_llama, 4, tokens=40, stop=(stop,))
    for thread in threads:
        thread.join()
    for i, (one, batched) in enumerate(zip(alone, results)):
        cut = one.text.find(stop)
        expected = one.text if cut < 0 else one.text[:cut]
        assert batched.text == expected, i
        assert batched.end.finish_reason == ("stop" if cut >= 0 else "length")
    assert random_llama.engine.batcher.answers >= 3


def test_sampling_with_a_seed_in_the_step_batch_repeats_the_answer_alone(random_llama):
    seeded = Request("Seeded:", Sampling(30, temperature=1.0, top_p=0.9, seed=7))
    alone = collect(random_llama.engine.stream(seeded))
    stepped = random_llama.engine.batcher.stepped.answers
    threads, _ = long_answers(random_llama, 3)
    time.sleep(0.2)
    beside = collect(random_llama.engine.stream(seeded))
    sampled = collect(random_llama.engine.stream(Request("Sampled:", Sampling(30, temperature=1.0, top_k=20))))
    for thread in threads:
        thread.join()
    assert beside.text == alone.text and beside.end.token_ids == alone.end.token_ids
    assert sampled.end.finish_reason == "length" and sampled.end.completion_tokens == 30
    assert random_llama.engine.batcher.stepped.answers == stepped + 1  # the seeded one, beside the paged batch


def test_a_turn_with_an_image_runs_in_the_step_batch_as_alone(demo):
    image = Image.new("RGB", (64, 64), (200, 30, 30))
    from local_chat.prompting import chat_prompt, default_template

    chat = chat_prompt(
        demo.engine, default_template(demo.engine), None, [], "What is in the image?", 64, attached=[image]
    )
    request = Request(chat.text, GREEDY, tuple(chat.stop_symbols), images=[image])
    alone = collect(demo.engine.stream(request))
    stepped = demo.engine.batcher.stepped.answers
    threads, _ = long_answers(demo, 2, tokens=64)
    time.sleep(0.05)
    beside = collect(demo.engine.stream(request))
    for thread in threads:
        thread.join()
    assert beside.text == alone.text and alone.text
    assert demo.engine.batcher.stepped.answers == stepped + 1


def test_a_client_that_disconnects_frees_its_place(random_llama):
    counter = ForwardCounter(random_llama, delay=0.01)
    try:
        with serve(random_llama, concurrency=2) as (url, _):
            body = {"model": "x", "prompt": "Story:", "max_tokens": 300, "temperature": 0.0, "stream": True}
            other = threading.Thread(
                target=httpx.post, args=(url + "/v1/completions",), kwargs={"json": body, "timeout": 60}
            )
            other.start()
            time.sleep(0.3)
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as gone:
                next(gone.iter_lines())
            deadline = time.time() + 5  # the disconnected answer leaves: only the other one is in flight
            while random_llama.engine.in_flight.count != 1 and time.time() < deadline:
                time.sleep(0.05)
            assert random_llama.engine.in_flight.count == 1
            third = httpx.post(url + "/v1/completions", json={**body, "stream": False, "max_tokens": 5}, timeout=60)
            assert third.status_code == 200 and other.is_alive()  # its place was free before the other ended
            other.join()
    finally:
        counter.restore()
