"""The OpenAI-compatible /v1 API, driven by the official `openai` client (and raw HTTP where a client would refuse to
send the mistake), on the demo model served as the launchers serve it."""

import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from openai import APIStatusError, AuthenticationError, BadRequestError, OpenAI

from demo_model import data as demo_data
from fixtures.app_server import serve
from local_chat.defaults import DEMO_MODEL
from local_chat.model.meta import MetaModel
from local_chat.prompting.images import png_bytes, png_data_url

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")

FRANCE = "What is the capital of France?"
GREEDY = dict(model="anything", temperature=0.0)


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL))


@pytest.fixture(scope="module")
def server(demo):
    with serve(demo, concurrency=2) as (url, counter):
        yield url, counter


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)


def ask(client, *messages, **settings):
    return client.chat.completions.create(messages=list(messages), **(GREEDY | settings))


def user(text):
    return {"role": "user", "content": text}


def test_a_question_answered_whole_and_streamed(client):
    whole = ask(client, user(FRANCE))
    assert whole.choices[0].message.content == "The capital of France is Paris."
    assert whole.choices[0].finish_reason == "stop" and whole.model == "demo-model"
    usage = whole.usage
    assert usage.completion_tokens > 3 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    chunks = list(ask(client, user(FRANCE), stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3  # token by token
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == usage.completion_tokens


def test_two_turns_reuse_the_first_turns_cache(client):
    first = ask(client, user(FRANCE))
    answer = {"role": "assistant", "content": first.choices[0].message.content}
    second = ask(client, user(FRANCE), answer, user("What is the capital of Japan?"))
    assert second.choices[0].message.content == "The capital of Japan is Tokyo."
    # the conversation's earlier tokens came from the KV cache the first turn left
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_a_system_prompt_reaches_the_model(client):
    long_system = {"role": "system", "content": "Answer briefly. " * 700}  # more than the demo model's context
    with pytest.raises(BadRequestError, match=r"This message needs \d+ tokens \(with the template, system prompt"):
        ask(client, long_system, user("Hi"))
    assert ask(client, {"role": "system", "content": ""}, user(FRANCE)).choices[0].message.content.endswith("Paris.")


def test_stop_strings_and_the_length_limit(client):
    cut = ask(client, user(FRANCE), stop=["Paris", "nowhere"])
    assert cut.choices[0].message.content == "The capital of France is " and cut.choices[0].finish_reason == "stop"
    short = ask(client, user(FRANCE), max_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    streamed = list(ask(client, user(FRANCE), max_completion_tokens=3, stream=True))
    assert streamed[-1].choices[0].finish_reason == "length"


def test_the_same_seed_gives_the_same_answer(client):
    def sampled(seed: int) -> str:
        settings = dict(model="x", prompt="Hello, my name is", max_tokens=16, temperature=2.0, top_p=1.0, seed=seed)
        return client.completions.create(**settings).choices[0].text

    assert sampled(7) == sampled(7)
    assert len({sampled(seed) for seed in range(5)}) > 1


def test_logprobs_cover_exactly_the_tokens_sent(client):
    whole = ask(client, user(FRANCE), logprobs=True, top_logprobs=3)
    content = whole.choices[0].logprobs.content
    assert "".join(t.token for t in content).strip() == whole.choices[0].message.content
    # cut by a stop string inside a token: the tokens whose text was sent, the one sent in part among them
    cut = ask(client, user(FRANCE), logprobs=True, stop=["aris"])
    shown, tokens = cut.choices[0].message.content, cut.choices[0].logprobs.content
    assert shown == "The capital of France is P" and "".join(t.token for t in tokens).strip().startswith(shown)
    assert not "".join(t.token for t in tokens[:-1]).strip().startswith(shown)
    content = ask(client, user(FRANCE), logprobs=True, top_logprobs=3, stop=["Paris"]).choices[0].logprobs.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 for t in content)
    assert all(t.top_logprobs[0].logprob >= t.logprob for t in content)  # greedy: the chosen token is the likeliest
    streamed = list(ask(client, user(FRANCE), logprobs=True, stream=True, stop=["Paris"]))
    tokens = [t.token for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert tokens == [t.token for t in content]


def test_completions_and_models(client):
    listed = client.models.list().data
    assert [m.id for m in listed] == ["demo-model"] and listed[0].model_extra["context_length"] == 2048
    done = client.completions.create(model="x", prompt="The capital of France", max_tokens=5, temperature=0.0)
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage.prompt_tokens > 2
    parts = list(client.completions.create(model="x", prompt="Hello", max_tokens=5, temperature=0.0, stream=True))
    assert (
        "".join(p.choices[0].text for p in parts if p.choices)
        == client.completions.create(model="x", prompt="Hello", max_tokens=5, temperature=0.0).choices[0].text
    )


def data_url(image) -> str:
    return png_data_url(png_bytes(image))


def test_an_image_question_with_a_data_url(client):
    """The drawn picture reaches the model: it names the shape's colour (one of six colours by chance)."""
    right = 0
    for seed in range(3, 9):
        image, [(colour, kind)] = demo_data.shapes_image(random.Random(seed), 1)
        question = [
            {"type": "image_url", "image_url": {"url": data_url(image)}},
            {"type": "text", "text": f"What color is the {kind}?"},
        ]
        right += colour in ask(client, user(question)).choices[0].message.content
    assert right >= 5, f"{right} of 6 right"


@pytest.mark.parametrize(
    "body, sentence",
    [
        ({"messages": []}, "`messages` must be a non-empty list"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "role 'wizard'"),
        ({"messages": [user("hi")], "temperature": 5}, "`temperature` is 5"),
        ({"messages": [user("hi")], "n": 2}, "`n` is 2"),
        ({"messages": [user([{"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}])]}, "never fetches"),
        ({"messages": [user("hi"), {"role": "assistant", "content": "hello"}]}, "The last message must be the user's"),
        ({"messages": [user("hi")], "top_logprobs": 30, "logprobs": True}, "`top_logprobs` is 30"),
    ],
)
def test_a_bad_request_is_a_400_with_a_sentence_and_the_next_is_answered(server, client, body, sentence):
    reply = httpx.post(server[0] + "/v1/chat/completions", json={"model": "x", **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert sentence in error["message"] and error["type"] == "invalid_request_error" and "Traceback" not in reply.text
    assert ask(client, user(FRANCE)).choices[0].message.content == "The capital of France is Paris."


def test_an_image_to_a_text_only_model_and_a_body_over_the_cap(byte_model):
    with serve(byte_model, max_upload_mb=1) as (url, _):
        image, _ = demo_data.shapes_image(random.Random(1), 1)
        question = user([{"type": "image_url", "image_url": {"url": data_url(image)}}, {"type": "text", "text": "?"}])
        reply = httpx.post(url + "/v1/chat/completions", json={"messages": [question]}, timeout=60)
        assert reply.status_code == 400 and "cannot see images" in reply.json()["error"]["message"]
        huge = httpx.post(url + "/v1/chat/completions", content=b"x" * 3_000_000, timeout=60)
        assert huge.status_code == 413 and "--max_upload_mb is 1" in huge.json()["error"]["message"]
        unknown = httpx.get(url + "/v1/embeddings", timeout=60)
        assert unknown.status_code == 404 and "/v1/chat/completions" in unknown.json()["error"]["message"]
        good = httpx.post(url + "/v1/chat/completions", json={"messages": [user("Hi")], "max_tokens": 4}, timeout=60)
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1


def test_a_long_conversation_loses_its_oldest_turns(client):
    turns = [user("What is the capital of Japan?"), {"role": "assistant", "content": "The capital of Japan is Tokyo."}]
    turns *= 80  # about 3,000 tokens: more than the demo model's context
    answer = ask(client, {"role": "system", "content": "Be brief."}, *turns, user(FRANCE), max_tokens=64)
    assert answer.choices[0].message.content and answer.usage.prompt_tokens <= 2048 - 64


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_client_that_disconnects_stops_the_model(demo, stream):
    with serve(demo, delay=0.05) as (url, counter):
        body = {"messages": [user("Who are you?")], "max_tokens": 400, "stream": stream}
        with httpx.Client(timeout=60) as http:
            if stream:
                with http.stream("POST", url + "/v1/chat/completions", json=body) as reply:
                    lines = reply.iter_lines()
                    for _ in range(8):  # a few tokens in
                        next(lines)
                    at_disconnect = counter.calls
            else:
                start = counter.calls
                with pytest.raises(httpx.ReadTimeout):
                    http.post(url + "/v1/chat/completions", json=body, timeout=1.0)
                at_disconnect = counter.calls
                assert at_disconnect - start > 5  # it was answering
        stopped_at = counter.settled(quiet=0.5)
        assert stopped_at - at_disconnect <= 2, f"{stopped_at - at_disconnect} forward passes after the disconnect"


def test_keys(demo, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# one a line\nfirst-key\nsecond-key\n")
    from local_chat.launchers.flags import api_keys

    with serve(demo, api_keys=api_keys(str(keys))) as (url, _):
        for key in (None, "wrong-key"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            reply = httpx.post(url + "/v1/chat/completions", json={"messages": [user("Hi")]}, headers=headers)
            assert reply.status_code == 401 and "API key" in reply.json()["error"]["message"]
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=url + "/v1", api_key="wrong-key", max_retries=0).models.list()
        assert readme_says(reply.json()["error"]["message"])  # the README quotes what the server answers
        right = OpenAI(base_url=url + "/v1", api_key="second-key", max_retries=0)
        assert ask(right, user(FRANCE)).choices[0].message.content == "The capital of France is Paris."


CONVERSATIONS = [
    ["What is the capital of France?", "What is 23 plus 45?", "Who are you?"],
    ["What is the capital of Japan?", "What is the capital of Peru?", "What can you do?"],
    ["What is 2 plus 2?", "What is the capital of Italy?", "What is the capital of Japan?"],
    ["Who are you?", "What is the capital of Spain?", "What is 10 plus 5?"],
]


def conversation(client, questions) -> list[str]:
    messages, answers = [], []
    for question in questions:
        messages.append(user(question))
        answers.append(ask(client, *messages, max_tokens=48).choices[0].message.content)
        messages.append({"role": "assistant", "content": answers[-1]})
    return answers


def test_eight_clients_at_once_get_the_answers_each_gets_alone(server):
    clients = [OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0) for _ in range(8)]
    plans = [CONVERSATIONS[i % len(CONVERSATIONS)] for i in range(8)]
    alone = [conversation(clients[0], plan) for plan in CONVERSATIONS]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(conversation, clients, plans))
    assert together == [alone[i % len(CONVERSATIONS)] for i in range(8)]


def readme_says(sentence: str) -> bool:
    """Whether the README or the docs it links (docs/api.md: the API) quote `sentence` (their lines joined as
    Markdown shows them)."""
    root = Path(__file__).resolve().parent.parent
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return any(sentence in " ".join(doc.read_text().split()) for doc in docs)


def test_an_unknown_path_is_a_404_as_the_readme_quotes_it(server):
    reply = httpx.get(server[0] + "/v1/files", timeout=60)
    assert reply.status_code == 404 and readme_says(reply.json()["error"]["message"]), reply.json()


def test_an_error_body_is_openai_shaped_even_for_broken_json(server):
    reply = httpx.post(server[0] + "/v1/chat/completions", content=b"{broken", timeout=60)
    assert reply.status_code == 400 and set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert json.loads(reply.text)["error"]["message"].startswith("The request body is not valid JSON")


def test_a_failed_model_is_a_503(server, demo, monkeypatch):
    monkeypatch.setattr(type(demo.engine), "failure", property(lambda self: "A model worker stopped."))
    with pytest.raises(APIStatusError) as caught:
        ask(OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0), user(FRANCE))
    assert caught.value.status_code == 503 and "A model worker stopped." in str(caught.value)


def test_page_and_api_wait_in_one_queue_in_arrival_order(byte_model):
    """engine/in_order.py: with one place, requests start in the order they arrived, and a waiting one hears how
    many go first."""
    from local_chat.engine import Queued, Request, Sampling
    from local_chat.engine.in_order import InArrivalOrder

    engine, started, lock = InArrivalOrder(byte_model.engine, 1), [], threading.Lock()
    first = engine.stream(Request("Hello", Sampling(30, temperature=0.0)))
    next(first)  # the first answer is under way

    def run(number: int, arrived: threading.Event):
        events = engine.stream(Request("Hi", Sampling(2, temperature=0.0)))
        queued = next(events)
        arrived.set()
        for event in events:
            if not isinstance(event, Queued):
                with lock:
                    started.append((number, queued.ahead))
                break
        events.close()

    threads = []
    for number in range(4):
        arrived = threading.Event()
        threads.append(threading.Thread(target=run, args=(number, arrived)))
        threads[-1].start()
        arrived.wait(10)
    list(first)
    for thread in threads:
        thread.join(30)
    assert started == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_auth_without_an_api_key_turns_v1_off_and_keys_are_checked(tmp_path):
    from local_chat.errors import UserError
    from local_chat.launchers.flags import api_keys, api_off_reason, parser

    flags = parser("x")
    assert "--api_key" in api_off_reason(flags.parse_args(["--auth", "alice:secret"]))
    assert api_off_reason(flags.parse_args(["--auth", "alice:secret", "--api_key", "k"])) is None
    assert api_off_reason(flags.parse_args([])) is None
    empty = tmp_path / "keys.txt"
    empty.write_text("# nothing yet\n")
    for bad in (str(empty), "two words"):
        with pytest.raises(UserError, match="--api_key"):
            api_keys(bad)


def test_why_an_answer_ended_is_one_type_read_one_way_from_and_to_the_wire():
    """`End.finish_reason` is a `FinishReason` (a string given is read as one, an unknown one refused); the OpenAI
    wire's reasons map to it and back in one module (engine/openai_wire.py): a cancelled or failed answer is "stop"
    on the wire (an error is told by the reply's status)."""
    from local_chat.engine import End, FinishReason
    from local_chat.engine.openai_wire import finish_from_wire, finish_to_wire

    assert End("length").finish_reason is FinishReason.LENGTH
    with pytest.raises(ValueError, match="'done' is not a valid FinishReason"):
        End("done")
    assert {r: finish_to_wire(r) for r in FinishReason} == {
        FinishReason.STOP: "stop",
        FinishReason.LENGTH: "length",
        FinishReason.TOOL_CALLS: "tool_calls",
        FinishReason.CANCELLED: "stop",
        FinishReason.ERROR: "stop",
    }
    read = [finish_from_wire(r) for r in ("stop", "length", "tool_calls", "eos", "content_filter")]
    assert read == [
        FinishReason.STOP,
        FinishReason.LENGTH,
        FinishReason.TOOL_CALLS,
        FinishReason.STOP,
        FinishReason.STOP,
    ]
