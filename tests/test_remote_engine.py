"""The app in front of an engine (--api_base, engine/remote.py): our own /v1 on the demo model, served in this process
with its forward passes counted; a launched local-chat killed mid-answer and restarted; and `transformers serve`,
transformers' own OpenAI-compatible server, an engine nobody here wrote."""

import json
import os
import random
import signal
import sys
import threading
import time

import pytest
from gradio_client import Client, handle_file

from bench.api_vs_serve import has_serving, openai_server, save_chat_llama
from demo_model import data as demo_data
from fixtures.app_server import (
    GENERATE_RECORD_KEYS,
    generate,
    launched,
    serve,
    serve_engine,
    stopped_mid_answer,
    wait_for_pieces,
)
from local_chat.defaults import DEMO_MODEL
from local_chat.engine import ChatOptions, Delta, End, Request, Sampling
from local_chat.engine.chats import ChatEngine
from local_chat.engine.remote import RemoteEngine
from local_chat.errors import UserError
from local_chat.launchers import browser
from local_chat.launchers.loading import free_port
from local_chat.model.meta import MetaModel

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")

FRANCE = "What is the capital of France?"


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL))


@pytest.fixture(scope="module")
def engine(demo):
    """(url, forward counter) of our own app and /v1 on the demo model: the engine."""
    with serve(demo, concurrency=4) as served:
        yield served


@pytest.fixture(scope="module")
def front(engine):
    """(url, its RemoteEngine) of the app in front of `engine`."""
    remote = RemoteEngine(engine[0] + "/v1", sees_images=True)
    with serve_engine(remote, concurrency=4) as url:
        yield url, remote


def test_two_turns_through_the_front(front):
    client = Client(front[0], verbose=False)
    first = client.predict(message=FRANCE, history=[], temperature=0.0, api_name="/chat")
    assert first == "The capital of France is Paris."
    second = client.predict(
        message="What is 23 plus 45?", history=[user(FRANCE), assistant(first)], temperature=0.0, api_name="/chat"
    )
    assert second == "23 plus 45: 3 plus 5 is 8, 2 plus 4 is 6, so 23 plus 45 is 68."
    assert "Lima" in client.predict(instruction="What is the capital of Peru?", api_name="/single_turn")  # completions


def test_a_single_turn_instruction_that_is_a_json_list_stays_a_raw_prompt(front, monkeypatch):
    """Only chat messages go to the engine's chat endpoint: a raw prompt is never read as messages, whatever it
    holds."""
    sent = []
    create = RemoteEngine._create

    def recorded(self, messages, prompt, fields):
        sent.append((messages, prompt))
        return create(self, messages, prompt, fields)

    monkeypatch.setattr(RemoteEngine, "_create", recorded)
    instruction = json.dumps([{"role": "user", "content": "What is the capital of Peru?"}])
    client = Client(front[0], verbose=False)
    client.predict(instruction=instruction, template="None", max_gen_len=8, api_name="/single_turn")
    assert sent == [(None, instruction)]


def test_image_questions_through_the_front(front, tmp_path):
    """The drawn picture reaches the engine's model as a data: URL: it names the shape's colour (one of six colours by
    chance), and a second turn still sees the image."""
    client, right = Client(front[0], verbose=False), 0
    for seed in range(3, 9):
        image, [(colour, kind)] = demo_data.shapes_image(random.Random(seed), 1)
        path = tmp_path / f"shape{seed}.png"
        image.save(path)
        question = f"What color is the {kind}?"
        answer = client.predict(message=question, history=[], image=handle_file(str(path)), api_name="/chat")
        right += colour in answer
    assert right >= 5, f"{right} of 6 right"
    again = client.predict(
        message=question,
        history=[user(question), assistant(answer)],
        image=handle_file(str(path)),
        temperature=0.0,
        api_name="/chat",
    )
    assert again == answer


def test_the_fronts_own_v1_and_the_engines_tokenize(front, engine):
    from openai import OpenAI

    api = OpenAI(base_url=front[0] + "/v1", api_key="unused", max_retries=0)
    reply = api.chat.completions.create(model="x", messages=[user(FRANCE)], temperature=0.0)
    assert reply.choices[0].message.content == "The capital of France is Paris." and reply.usage.prompt_tokens > 5
    assert front[1].counts_with_tokenize and front[1].max_seq_len == 2048  # from the engine's /v1/models
    import httpx

    counted = httpx.post(engine[0] + "/tokenize", json={"messages": [user(FRANCE)]}).json()
    assert counted == {"count": reply.usage.prompt_tokens, "max_model_len": 2048}


def test_the_engines_context_limits_the_conversation(front):
    """Counted with the engine's /tokenize: a conversation longer than the engine's context loses its oldest turns,
    and a message too long for it alone is one sentence."""
    chats = ChatEngine(front[1], "chat_template")
    turns = [
        m for n in range(40) for m in (user(f"What is {n} plus {n}? " * 6), assistant(f"{n} plus {n} is {2 * n}."))
    ]
    rendered, sent, _ = chats.prepared(Request(messages=[*turns, user(FRANCE)], chat=ChatOptions(answer_tokens=256)))
    assert rendered.dropped_turns > 0 and sent.messages == [*turns[2 * rendered.dropped_turns :], user(FRANCE)]
    assert front[1].messages_length(sent.messages) == rendered.prompt_tokens <= front[1].max_seq_len - 256
    with pytest.raises(UserError, match=r"needs \d+ tokens .* context holds 2048"):
        chats.prepared(Request(messages=[user("plus " * 3000)], chat=ChatOptions(answer_tokens=256)))


def test_stop_at_the_front_stops_the_engine_within_two_steps(demo):
    with serve(demo, delay=0.05) as (url, counter):
        with serve_engine(RemoteEngine(url + "/v1")) as front:
            stopped_mid_answer(front, counter)
            client = Client(front, verbose=False)
            answer = client.predict(message="What is the capital of Italy?", history=[], api_name="/chat")
            assert answer == "The capital of Italy is Rome."


def test_a_cancel_flag_closes_the_stream_at_once(demo):
    """The page's Stop sets the answer's cancel flag: the stream to the engine is closed even while it is silent."""
    with serve(demo, delay=0.05) as (url, counter):
        remote, cancel = RemoteEngine(url + "/v1"), threading.Event()
        events = remote.stream(Request(json.dumps([user("Who are you?")]), Sampling(temperature=0), cancel=cancel))
        assert isinstance(next(events), Delta)
        cancel.set()
        at_cancel = counter.calls
        rest = list(events)
        assert isinstance(rest[-1], End) and rest[-1].finish_reason == "cancelled"
        assert counter.settled(quiet=0.5) - at_cancel <= 2


def test_an_engine_killed_mid_answer_then_restarted(byte_llama_dir):
    port = free_port()
    flags = ("--pretrained_path", str(byte_llama_dir))
    engine_app, _ = launched(*flags, port=port)
    try:
        with serve_engine(RemoteEngine(f"http://127.0.0.1:{port}/v1")) as front:
            client = Client(front, verbose=False)
            job = client.submit(message="Hello", history=[], max_gen_len=2000, api_name="/chat")
            wait_for_pieces(job, 3)
            os.killpg(engine_app.pid, signal.SIGKILL)
            engine_app.wait()
            with pytest.raises(Exception, match="stopped in the middle of the answer.*send the message again"):
                job.result(timeout=60)
            with pytest.raises(Exception, match="cannot be reached.*send the message again"):
                client.predict(message="Hello again", history=[], api_name="/chat")
            engine_app, _ = launched(*flags, port=port)
            assert client.predict(message="Hello again", history=[], max_gen_len=8, api_name="/chat")
    finally:
        if engine_app.poll() is None:
            os.killpg(engine_app.pid, signal.SIGKILL)


def test_an_engines_refusal_is_shown_with_its_own_message(front):
    """The engine's error (a prompt over its context, which the front does not count for a raw prompt) in the chat."""
    with pytest.raises(Exception, match="The engine refused the request: The prompt is \\d+ tokens long"):
        Client(front[0], verbose=False).predict(instruction="plus " * 3000, template="None", api_name="/single_turn")


@pytest.mark.parametrize(
    "argv, sentence",
    [
        (["--model", "m"], "--model goes with --api_base URL"),
        (["--api_base", "http://127.0.0.1:9/v1", "--quant", "4"], "so --quant cannot apply"),
        (["--api_base", "127.0.0.1:8000"], "is not a URL"),
        (["--api_base", "http://127.0.0.1:{free}/v1"], "cannot be reached"),
        (["--api_base", "{front}/v1", "--model", "nonexistent"], "has no model 'nonexistent'; pass --model with one"),
    ],
)
def test_engine_flags_are_checked_in_one_sentence(front, capsys, argv, sentence):
    argv = [a.format(free=free_port(), front=front[0]) for a in argv]
    with pytest.raises(SystemExit) as ended:
        browser.app(argv)
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert sentence in err and "Traceback" not in err


def test_an_image_demo_needs_vision(front, capsys):
    with pytest.raises(SystemExit):
        browser.multi_turn_mm(["--api_base", front[0] + "/v1"])
    assert "add --vision if the engine's model sees them" in capsys.readouterr().err


# ----- transformers serve: an engine nobody here wrote -----


@pytest.fixture(scope="module")
def transformers_serve(tmp_path_factory):
    """The /v1 address of `transformers serve` on a tiny random Llama folder with a chat template."""
    if not has_serving():
        pytest.skip('transformers[serving] is not installed (pip install -e ".[dev]")')
    folder = save_chat_llama("tiny", tmp_path_factory.mktemp("serve") / "chat-llama")
    port = free_port()
    serve_command = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve"]
    with openai_server([*serve_command, str(folder), "--port", str(port), "--device", "cpu"], port):
        yield f"http://127.0.0.1:{port}/v1"


def test_two_turns_against_transformers_serve(transformers_serve, capsys):
    remote = RemoteEngine(transformers_serve)
    assert not remote.context_known and not remote.counts_with_tokenize  # it says neither: estimated here
    with serve_engine(remote) as front:
        client = Client(front, verbose=False)
        first = client.predict(message="Hello", history=[], max_gen_len=16, api_name="/chat")
        # top k and the repetition penalty, which transformers serve refuses (422): the request goes without them
        second = client.predict(
            message="And then?",
            history=[user("Hello"), assistant(first)],
            max_gen_len=16,
            top_k=5,
            repetition_penalty=1.3,
            api_name="/chat",
        )
        assert first and second and remote.estimated_tokens(400) > 0
    assert "refuses stream_options, top_k, repetition_penalty" in capsys.readouterr().err


def test_stop_closes_the_stream_to_transformers_serve(transformers_serve):
    remote, cancel = RemoteEngine(transformers_serve), threading.Event()
    events = remote.stream(Request(json.dumps([user("Hello")]), Sampling(max_new_tokens=4000), cancel=cancel))
    pieces = [next(events) for _ in range(3)]
    cancel.set()
    started = time.perf_counter()
    end = list(events)[-1]
    assert all(isinstance(p, Delta) for p in pieces)
    assert end.finish_reason == "cancelled" and time.perf_counter() - started < 1.0
    assert end.completion_tokens < 4000
    answer = remote.complete([Request(json.dumps([user("Hi")]), Sampling(max_new_tokens=8))])[0]
    assert answer.end.finish_reason != "error" and answer.text  # the engine answers the next request


def test_generate_with_api_base_against_transformers_serve(transformers_serve, tmp_path):
    prompts = ["Hello", "What is the capital of France?", "Count to three."]
    written = generate(
        tmp_path, "remote", "--api_base", transformers_serve, "--prompts", *prompts, "--batch_size", "3",
        "--max_new_tokens", "8",
    )  # fmt: skip
    records = [json.loads(line) for line in written.splitlines()]
    assert [r["prompt"] for r in records] == prompts
    for record in records:
        assert set(record) == GENERATE_RECORD_KEYS
        assert record["finish_reason"] == "length" and record["response"] and record["input_tokens"] > 0


def test_the_fronts_v1_leaves_out_the_oldest_turns_the_engine_cannot_hold(front):
    """Chat messages go to the engine as messages, without the oldest turns where the conversation outgrows the
    engine's context (counted with its /tokenize), as the page's do."""
    from openai import OpenAI

    turns = [
        m for n in range(40) for m in (user(f"What is {n} plus {n}? " * 6), assistant(f"{n} plus {n} is {2 * n}."))
    ]
    api = OpenAI(base_url=front[0] + "/v1", api_key="unused", max_retries=0)
    reply = api.chat.completions.create(model="x", messages=[*turns, user(FRANCE)], temperature=0.0, max_tokens=64)
    assert reply.choices[0].message.content and reply.choices[0].finish_reason == "stop"  # answered, not refused
    assert reply.usage.prompt_tokens <= 2048 - 64  # the whole conversation is longer than the context
