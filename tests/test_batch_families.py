"""The step batch (model/step_batch.py) over the families transformers' continuous batching cannot run: a tiny random
model of each kind's real class with its published template: DeepSeek V3.1 (multi-head latent attention), Granite 4
(Mamba layers beside attention) and LFM2 (convolution layers beside attention). Several answers at once are each
the tokens it gives alone, a Stop ends only its own answer, and a conversation's cache serves its next turn."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import torch
from test_batching import stop_mid_batch

from fixtures import text_families
from fixtures.app_server import ForwardCounter
from local_chat.engine import AnswerFormat, Delta, Request, Sampling, collect
from local_chat.model.meta import MetaModel

KINDS = {"deepseek_v3_1": "multi-head latent attention", "granite4": "linear_attention", "lfm2_moe": "conv"}


@pytest.fixture(scope="module", params=list(KINDS))
def batched(request, tmp_path_factory):
    name = request.param
    model = MetaModel.from_pretrained(str(text_families.build(name, tmp_path_factory.mktemp(name) / "m")))
    model.engine.eos_ids = lambda stop_symbols=(): set()  # answers run to their length: long enough to stop midway
    said = model.engine.start_batching(8)
    assert said.startswith("a step batch over the model's own cache") and KINDS[name] in said, said
    yield model
    model.engine.stop_batching()


def greedy(tokens: int) -> Sampling:
    return Sampling(tokens, temperature=0.0)


def started_together(count: int, ask) -> list:
    """`ask(i)` for i in range(count) on threads started together; their results once all are done."""
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(ask, range(count)))


def test_six_answers_at_once_are_each_the_tokens_it_gives_alone(batched):
    prompts = [f"Story {i}:" + " once upon a time" * i for i in range(6)]  # 3 to 28 tokens: rows left-padded

    def ask(i):
        return collect(batched.engine.stream(Request(prompts[i], greedy(40))))

    alone = [ask(i) for i in range(6)]
    before = batched.engine.batcher.answers
    together = started_together(6, ask)
    assert [a.end.token_ids for a in together] == [a.end.token_ids for a in alone]
    assert all(a.end.completion_tokens == 40 for a in together)
    assert batched.engine.batcher.answers - before >= 5  # the first may begin alone: it joins when the others come


def test_seeded_held_and_logprob_answers_that_begin_alone_go_on_in_the_batch_as_alone(batched):
    """Each answer begins on the one-at-a-time path (the others come while it runs) and goes on in the batch with the
    same decisions: a seeded sampled answer draws the same tokens, one held to a grammar keeps its grammar's place,
    one asking for log-probabilities gets the same ones."""
    requests = [
        Request("Seeded:", Sampling(40, temperature=1.0, top_p=0.9, seed=11)),
        Request("Digits:", greedy(40), answer_format=AnswerFormat("json_schema", {"type": "string"})),
        Request("Logprobs:", greedy(40), logprobs=2),
    ]

    def answer(request):
        events = list(batched.engine.stream(request))
        return collect(iter(events)), [(lp.token_id, round(lp.logprob, 3)) for e in events if isinstance(e, Delta)
                                       for lp in e.logprobs]  # fmt: skip

    alone = [answer(r) for r in requests]
    before = batched.engine.batcher.answers
    counter = ForwardCounter(batched, delay=0.01)  # each answer has begun alone when the next comes
    try:
        together = started_together(3, lambda i: (time.sleep(0.1 * i), answer(requests[i]))[1])
    finally:
        counter.restore()
    assert [(a.end.token_ids, logprobs) for a, logprobs in together] == [
        (a.end.token_ids, logprobs) for a, logprobs in alone
    ]
    assert together[1][0].text.startswith('"') and len(together[2][1]) >= 30  # a token cut mid-character: none
    assert batched.engine.batcher.answers - before == 3  # the first joined when the second came


def test_a_stop_mid_batch_ends_only_its_own_answer_within_two_steps(batched):
    end, steps_taken, results = stop_mid_batch(batched, ForwardCounter(batched, delay=0.02), 80)
    assert end.finish_reason == "cancelled" and steps_taken <= 2
    assert [r.end.finish_reason for r in results] == ["length"] * 3
    assert [r.end.completion_tokens for r in results] == [80] * 3


@contextmanager
def answers_in(model, tokens: list[int]):
    """The model's greedy answers made of `tokens` only (its own choice among them): the family's added, not special
    tokens, which the tokenizer reads back as the same ids, so that an answer's text continues its prompt token for
    token, as a trained model's answers do (a random one's bytes do not survive decoding and encoding again)."""
    layer = model.llma.get_output_embeddings()

    def only_those(module, inputs, output):
        allowed = torch.full((output.shape[-1],), -1e4, dtype=output.dtype)
        allowed[tokens] = 0.0
        return output + allowed

    handle = layer.register_forward_hook(only_those)
    try:
        yield
    finally:
        handle.remove()


def test_a_conversations_cache_serves_its_next_turn_in_the_batch(batched):
    """Three conversations of two turns at once, beside a long answer (so every turn runs in the batch): each
    answer is the one it gets alone, and each second turn prefills only what its first did not hold."""
    added = [i for i, token in batched.tokenizer.hf.added_tokens_decoder.items() if not token.special]

    def converse(i, session):
        prompt = f"Story {i}:" + " once upon a time" * 12
        first = collect(batched.engine.stream(Request(prompt, greedy(12), session=session)))
        prompt += first.text + " And then?"
        second = collect(batched.engine.stream(Request(prompt, greedy(12), session=session)))
        return first.text, second.text, second.end.cached_tokens  # /v1's usage reports the cached tokens

    taken, take = [], batched.engine.sessions.take

    def recording_take(session, inputs, *args):
        cache, key = take(session, inputs, *args)
        taken.append((str(session), inputs.cached, inputs.input_ids.shape[1]))
        return cache, key

    with answers_in(batched, added):
        alone = [converse(i, f"alone-{i}") for i in range(3)]
        batched.engine.sessions.take = recording_take
        keeper = threading.Thread(target=lambda: collect(batched.engine.stream(Request("Story:", greedy(400)))))
        try:
            keeper.start()
            while batched.engine.in_flight.count < 1:
                time.sleep(0.005)
            together = started_together(3, lambda i: converse(i, f"batch-{i}"))
            assert keeper.is_alive()  # every turn ran beside it, in the batch
        finally:
            keeper.join()
            del batched.engine.sessions.take
    assert together == alone and all(first and cached > 40 for first, _, cached in alone)
    turns = {}  # each batched conversation's turns: (tokens its cache held, its prompt's tokens)
    for session, cached, length in taken:
        if session.startswith("batch"):
            turns.setdefault(session, []).append((cached, length))
    assert len(turns) == 3 and all(len(two) == 2 for two in turns.values()), turns
    for (first, first_length), (cached, length) in turns.values():
        assert first == 0 and cached == first_length + 11 and length - cached < 10, turns  # its answer's 12th: new


def test_a_family_neither_batch_can_run_says_which_part_prevents_it():
    from types import SimpleNamespace

    from local_chat.model.step_batch import start_batcher

    def model(*layer_types):
        config = SimpleNamespace(layer_types=list(layer_types), kv_lora_rank=None, head_dim=16)
        config.get_text_config = lambda: config
        return SimpleNamespace(config=config, init_continuous_batching=None)

    hybrid_sliding = model("linear_attention", "sliding_attention")
    assert start_batcher(hybrid_sliding, None, 8, 4096, check=None) == (
        None,
        "transformers' continuous batching cannot run this model (its linear_attention layers), nor the step batch "
        "(its sliding-window layers beside layers that keep a running state)",
    )
    sparse = model("indexed_attention", "full_attention")
    assert start_batcher(sparse, None, 8, 4096, check=None)[1].endswith(
        "nor the step batch (its indexed (sparse) attention layers)"
    )
