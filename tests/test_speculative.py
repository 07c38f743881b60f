"""--speculative ngram (model/speculative.py): a greedy answer that guesses its next tokens from the prompt and the
answer so far gives the same tokens as plain decoding, token for token (200 prompts on a tiny Llama, chat questions
on the demo model), with stop strings that end inside a guessed run, log-probabilities, a JSON schema, and Stop
within two forward passes."""

import json
import random
import threading

import pytest

from local_chat.defaults import DEMO_MODEL
from local_chat.engine.chats import ChatEngine
from local_chat.engine.interface import AnswerFormat, Request, Sampling, collect
from local_chat.model.meta import MetaModel
from local_chat.model.speculative import NgramGuesser
from local_chat.prompting import default_template

WORDS = "the cat sat on a mat and the dog ran to the park while birds sang in old trees".split()


def prompts(count: int) -> list[str]:
    """Prompts with repeats in them (what the guesses feed on), of many lengths."""
    rng = random.Random(0)
    made = []
    for _ in range(count):
        phrase = " ".join(rng.choices(WORDS, k=rng.randint(3, 8)))
        made.append(" ".join([phrase] * rng.randint(1, 4) + rng.choices(WORDS, k=rng.randint(0, 12))))
    return made


@pytest.fixture(scope="module")
def pair(byte_llama_dir):
    """The tiny Llama with guesses (the default) and without."""
    return MetaModel.from_pretrained(str(byte_llama_dir)), MetaModel.from_pretrained(
        str(byte_llama_dir), speculative="off"
    )


def answer(model: MetaModel, prompt: str, **request):
    request.setdefault("sampling", Sampling(max_new_tokens=40, temperature=0.0))
    return collect(model.engine.stream(Request(prompt, **request)))


def test_the_guesser_finds_what_followed_the_longest_ngram_before():
    guesser = NgramGuesser([5, 6, 7, 8, 9, 1, 2, 5, 6, 7])
    assert guesser.guess(3) == [8, 9, 1]  # 5 6 7 came before, followed by 8 9 1
    guesser.add([8, 3])
    assert guesser.guess(3) == []  # 3 breaks from the place followed, and 7 8 3 never came before
    guesser.add([6, 7, 8])
    assert guesser.guess(2) == [3, 6]  # 6 7 8 last came before 3 (the longest n-gram, the latest occurrence)


def test_200_greedy_answers_are_the_same_tokens_with_and_without_guesses(pair):
    guessing, plain = pair
    guessed = accepted = 0
    for prompt in prompts(200):
        on, off = answer(guessing, prompt), answer(plain, prompt)
        assert on.end.token_ids == off.end.token_ids and on.text == off.text, prompt
        assert off.end.guessed_tokens == 0
        guessed, accepted = guessed + on.end.guessed_tokens, accepted + on.end.accepted_tokens
    assert accepted > 200 and guessed > accepted  # guesses were taken, and some refused: both paths ran


def test_stop_strings_inside_a_guessed_run_end_the_answer_as_without_guesses(pair):
    guessing, plain = pair
    checked = 0
    for prompt in prompts(60):
        on = answer(guessing, prompt)
        if on.end.accepted_tokens < 4 or len(on.text) < 12:
            continue
        middle = len(on.text) // 2
        stop = on.text[middle : middle + 2]  # ends the answer somewhere in the middle, most likely in a guessed run
        stopped = answer(guessing, prompt, stop=(stop,))
        assert stopped.text == answer(plain, prompt, stop=(stop,)).text == on.text[: on.text.index(stop)]
        checked += 1
    assert checked >= 5


def test_logprobs_of_guessed_tokens_are_those_of_plain_decoding(pair):
    guessing, plain = pair
    prompt = next(p for p in prompts(60) if answer(guessing, p).end.accepted_tokens >= 4)

    def logprobs(model):
        events = model.engine.stream(Request(prompt, Sampling(max_new_tokens=40, temperature=0.0), logprobs=2))
        return [t for event in events for t in getattr(event, "logprobs", [])]

    on, off = logprobs(guessing), logprobs(plain)
    assert [(t.token_id, [a for a, _ in t.top]) for t in on] == [(t.token_id, [a for a, _ in t.top]) for t in off]
    # several tokens in one pass round differently from one at a time, in the last digits
    assert all(abs(a.logprob - b.logprob) < 1e-3 for a, b in zip(on, off)) and len(off) > 10


def test_a_json_schema_answer_guesses_what_the_grammar_forces_and_stays_the_same(pair):
    guessing, plain = pair
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "colour": {"enum": ["red", "green"]}},
        "required": ["name", "colour"],
        "additionalProperties": False,
    }
    shape = AnswerFormat("json_schema", schema)
    for prompt in ["the cat " * 5, '{"name": "the cat sat", "colour": "red"} ' * 3]:

        def stream(model, prompt=prompt):
            sampling = Sampling(max_new_tokens=80, temperature=0.0)
            events = list(model.engine.stream(Request(prompt, sampling, answer_format=shape, logprobs=1)))
            pieces = [t for event in events for t in getattr(event, "logprobs", [])]
            return events[-1], [(t.token_id, t.top[0][0]) for t in pieces], [t.logprob for t in pieces]

        (on, on_tokens, on_logprobs), (off, off_tokens, off_logprobs) = stream(guessing), stream(plain)
        assert on.token_ids == off.token_ids and on_tokens == off_tokens and len(off_tokens) > 5
        assert all(abs(a - b) < 1e-3 for a, b in zip(on_logprobs, off_logprobs))
        assert on.accepted_tokens > 0  # the keys and punctuation the schema forces, taken several in a pass
        text = guessing.tokenizer.decode(on.token_ids)
        if on.finish_reason == "stop":
            assert set(json.loads(text)) == {"name", "colour"}


def test_stop_ends_a_guessing_answer_within_two_forward_passes(pair):
    guessing, _ = pair
    prompt = max(prompts(60), key=lambda p: answer(guessing, p).end.accepted_tokens)
    forwards = []
    original = guessing.llma.forward

    def counted(*args, **kwargs):
        forwards.append(1)
        return original(*args, **kwargs)

    guessing.llma.forward = counted
    try:
        cancel = threading.Event()
        seen = 0
        for event in guessing.engine.stream(
            Request(prompt, Sampling(max_new_tokens=200, temperature=0.0), cancel=cancel)
        ):
            if getattr(event, "text", "") and not hasattr(event, "finish_reason"):
                seen += 1
                if seen == 3:
                    cancel.set()
                    at_stop = len(forwards)
            if hasattr(event, "finish_reason"):
                end = event
    finally:
        guessing.llma.forward = original
    assert end.finish_reason == "cancelled" and len(forwards) - at_stop <= 2


def test_the_demo_models_chat_answers_are_the_same_with_and_without_guesses():
    guessing = MetaModel.from_pretrained(str(DEMO_MODEL))
    plain = MetaModel.from_pretrained(str(DEMO_MODEL), speculative="off")
    questions = ["What is the capital of France?", "Who are you?", "What is 23 plus 45?", "Name three colors."]
    questions += ["Repeat after me: the quick brown fox jumps over the lazy dog, the quick brown fox jumps."] * 2
    for question in questions:
        answers = []
        for model in (guessing, plain):
            chats = ChatEngine(model.engine, default_template(model.engine, None))
            request = Request(messages=[{"role": "user", "content": question}], sampling=Sampling(80, temperature=0.0))
            answers.append(collect(chats.stream(request)))
        assert answers[0].end.token_ids == answers[1].end.token_ids and answers[0].text == answers[1].text


def test_v1_usage_tells_the_guessed_tokens_as_openais_prediction_tokens(pair):
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from local_chat.api import OpenAIAPI
    from local_chat.engine.in_order import InArrivalOrder

    guessing, _ = pair
    prompt = max(prompts(60), key=lambda p: answer(guessing, p).end.accepted_tokens)
    api = OpenAIAPI(InArrivalOrder(guessing.engine), "chat_template", None, 10)
    v1 = TestClient(Starlette(routes=api.routes()))
    reply = v1.post("/v1/completions", json={"prompt": prompt, "max_tokens": 40, "temperature": 0}).json()
    details = reply["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] == answer(guessing, prompt).end.accepted_tokens > 0
    assert details["rejected_prediction_tokens"] >= 0


def test_sampled_answers_keep_the_models_distribution(pair):
    """Sampled answers (temperature 0.7, the 3 likeliest tokens) check their guesses by speculative sampling's rule:
    the tokens at each place are distributed as plain sampling's (chi-square over 400 answers each, a p-value per
    place), while many guesses are taken."""
    guessing, plain = pair
    prompt = max(prompts(60), key=lambda p: answer(guessing, p).end.accepted_tokens)

    def tokens(model, seed: int) -> list[int]:
        sampling = Sampling(max_new_tokens=12, temperature=0.7, top_k=3, seed=seed)
        end = collect(model.engine.stream(Request(prompt, sampling))).end
        counted["guessed"] += end.guessed_tokens
        counted["accepted"] += end.accepted_tokens
        return end.token_ids

    counted = {"guessed": 0, "accepted": 0}
    on = [tokens(guessing, seed) for seed in range(400)]
    taken = counted["accepted"]
    off = [tokens(plain, 10_000 + seed) for seed in range(400)]
    assert taken > 50 and counted["guessed"] > taken, counted  # guesses were checked: many taken, some refused
    for place in (1, 4, 7, 10):
        a = [answer[place] for answer in on if len(answer) > place]
        b = [answer[place] for answer in off if len(answer) > place]
        assert chi_square_p(a, b) > 1e-3, (place, sorted(set(a)), sorted(set(b)))


def chi_square_p(a: list[int], b: list[int]) -> float:
    """The p-value of a chi-square test that two samples come from one distribution (categories seen fewer than 10
    times together are pooled)."""
    import torch

    counts = {}
    for index, sample in enumerate((a, b)):
        for value in sample:
            counts.setdefault(value, [0, 0])[index] += 1
    rows = [pair for pair in counts.values() if sum(pair) >= 10]
    rest = [sum(p[0] for p in counts.values() if sum(p) < 10), sum(p[1] for p in counts.values() if sum(p) < 10)]
    rows += [rest] if sum(rest) else []
    if len(rows) < 2:
        return 1.0
    totals = [len(a), len(b)]
    grand = sum(totals)
    statistic = sum(
        (row[i] - sum(row) * totals[i] / grand) ** 2 / (sum(row) * totals[i] / grand) for row in rows for i in (0, 1)
    )
    return float(torch.special.gammaincc(torch.tensor((len(rows) - 1) / 2), torch.tensor(statistic / 2)))


def test_the_sampling_rule_gives_each_place_the_models_distribution():
    """Speculative sampling's rule on set logits: over 20,000 checks of one guessed token, the token that ends up at
    its place (the guess where taken, else the one drawn without it) is distributed as the model's own choice there
    (chi-square), and the guess is taken as often as the model gives it."""
    import torch

    from local_chat.model.speculative import Checker
    from local_chat.model.token_choice import TokenChoice

    logits = torch.tensor([[1.0, 0.2, -0.5, 0.7, 0.0], [0.3, 0.3, 0.3, 0.3, 0.3]])
    prompt = torch.zeros((1, 1), dtype=torch.long)
    checker = Checker(TokenChoice(Sampling(temperature=0.8, top_p=1.0, seed=7), prompt, lambda tokens: False))
    model = torch.softmax(logits[0] / 0.8, dim=-1)
    placed, taken = [], 0
    for _ in range(20_000):
        accepted, following = checker.check(logits, [3])
        placed.append(3 if accepted else following)
        taken += accepted
    expected = [
        int(i) for i in torch.multinomial(model, 20_000, replacement=True, generator=torch.Generator().manual_seed(1))
    ]
    assert chi_square_p(placed, expected) > 1e-3
    assert abs(taken / 20_000 - float(model[3])) < 0.015


def test_a_reader_that_leaves_mid_guess_leaves_the_cache_holding_the_tokens_before_the_last(pair):
    """An answer that leaves the one-at-a-time path for the batch closes its steps after any token, in a guessed run
    or not: the cache then holds the prompt and every token but the last (what the session keeps for the next
    turn), as after plain decoding's steps."""
    from transformers import DynamicCache

    from local_chat.model.generation import generate_tokens
    from local_chat.model.token_choice import TokenChoice

    guessing, _ = pair
    prompt = max(prompts(60), key=lambda p: answer(guessing, p).end.accepted_tokens)
    inputs = guessing.engine.encoder.prepare_inputs([prompt])
    length = inputs.input_ids.shape[1]
    for read in range(1, 30):
        cache, guesses = DynamicCache(), {}
        choice = TokenChoice(Sampling(temperature=0.0), inputs.input_ids, lambda t: False)
        steps = generate_tokens(guessing.llma, inputs, choice, cache, max_new_tokens=40, guesses=guesses)
        for _ in range(read):
            next(steps)
        steps.close()
        assert cache.get_seq_length() == length + read - 1, (read, guesses)
    assert guesses["accepted"] > 0


def test_a_draft_models_guesses_give_the_same_tokens_and_one_of_another_tokenizer_is_refused(
    tmp_path, byte_tokenizer, byte_llama_dir, checkpoints
):
    """--draft_model: a small model of the same tokenizer guesses; greedy answers stay the model's own, token for
    token, whether its guesses are right (the model itself as its draft: all taken) or mostly wrong (another random
    model); a draft of another tokenizer is one sentence."""
    from fixtures import tiny_models
    from local_chat.errors import UserError

    other = tiny_models.save_hf(tiny_models.random_llama(len(byte_tokenizer), seed=5), tmp_path / "other",
                                hf_tokenizer=byte_tokenizer)  # fmt: skip
    plain = MetaModel.from_pretrained(str(byte_llama_dir), speculative="off")
    itself = MetaModel.from_pretrained(str(byte_llama_dir), draft_model=str(byte_llama_dir))
    wrong = MetaModel.from_pretrained(str(byte_llama_dir), draft_model=str(other))
    assert itself.engine.decoding.speculative == "draft"
    for prompt in prompts(20):
        expected = answer(plain, prompt).end.token_ids
        right, guessed = answer(itself, prompt).end, answer(wrong, prompt).end
        assert right.token_ids == expected == guessed.token_ids, prompt
        assert right.accepted_tokens == right.guessed_tokens > 0 or len(expected) < 2
        assert guessed.accepted_tokens < guessed.guessed_tokens or len(expected) < 2
    with pytest.raises(UserError, match="has another tokenizer than the model"):
        MetaModel.from_pretrained(str(byte_llama_dir), draft_model=str(checkpoints["hf"]))


def test_a_draft_model_with_several_ranks_is_one_sentence_before_loading(byte_llama_dir, capsys):
    from local_chat.launchers import browser as launchers

    with pytest.raises(SystemExit):
        launchers.app(["--pretrained_path", str(byte_llama_dir), "--draft_model", str(byte_llama_dir), "--n_gpus", "2",
                       "--device", "cpu", "--no_history"])  # fmt: skip
    assert "--draft_model works on one device for now" in capsys.readouterr().err
