"""The app's API, driven through gradio_client as an outside program would, on the demo model."""

import random
import threading
import time

import numpy as np
import pytest
from gradio_client import Client, handle_file

from demo_model import data as demo_data
from fixtures.app_server import serve, stopped_mid_answer
from local_chat.defaults import DEMO_MODEL
from local_chat.model.meta import MetaModel

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")

FRANCE = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
]


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL))


@pytest.fixture(scope="module")
def server(demo):
    with serve(demo) as (url, counter):
        yield url, counter


def test_api_lists_chat_and_single_turn(server):
    endpoints = Client(server[0], verbose=False).view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/chat", "/single_turn"} <= set(endpoints)
    names = [p["parameter_name"] for p in endpoints["/chat"]["parameters"]]
    assert names == [
        "message",
        "history",
        "image",
        "max_gen_len",
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "system",
        "template",
        "audio",
    ]


def test_two_turn_conversation(server):
    client = Client(server[0], verbose=False)
    first = client.predict(message="What is the capital of France?", history=[], api_name="/chat")
    assert first == "The capital of France is Paris."
    second = client.predict(message="What is the capital of Japan?", history=FRANCE, api_name="/chat")
    assert second == "The capital of Japan is Tokyo."


def test_system_prompt_and_template_reach_the_prompt(server):
    client = Client(server[0], verbose=False)
    long_system = "Answer briefly. " * 700  # ~2,100 tokens: more than the demo model's context
    for call in (dict(system=long_system, history=[]), dict(history=[{"role": "system", "content": long_system}])):
        with pytest.raises(Exception, match="with the template, system prompt"):
            client.predict(message="Hi", api_name="/chat", **call)
    assert (
        client.predict(
            message="What is the capital of France?", history=[], system="", template="default", api_name="/chat"
        )
        == "The capital of France is Paris."
    )


def test_single_turn_and_its_templates(server):
    client = Client(server[0], verbose=False)
    assert "Lima" in client.predict(instruction="What is the capital of Peru?", api_name="/single_turn")
    with pytest.raises(Exception, match="Unknown prompt template"):
        client.predict(instruction="Hi", template="nonsense", api_name="/single_turn")


def test_streaming_submit_grows_the_answer(server):
    job = Client(server[0], verbose=False).submit(message="Who are you?", history=[], api_name="/chat")
    final = job.result()
    pieces = job.outputs()
    assert len(pieces) > 3 and all(final.startswith(p) for p in pieces)
    assert "###" not in final and final.startswith("I am the built-in demo model")


def test_image_question_through_the_api(server, tmp_path):
    """The image reaches the model: the demo model counts the shapes in it (94% in its evaluation; one, two or three
    shapes, so one in three by chance), so four of six right is the API's doing, not luck."""
    client, right = Client(server[0], verbose=False), 0
    for seed in range(3, 9):
        image, shapes = demo_data.shapes_image(random.Random(seed), 1 + seed % 3)
        path = tmp_path / f"shapes{seed}.png"
        image.save(path)
        answer = client.predict(
            message="How many shapes are there?",
            history=[],
            image=handle_file(str(path)),
            temperature=0.0,
            api_name="/chat",
        )
        right += str(len(shapes)) in answer
    assert right >= 4, f"{right} of 6 right"


def test_bad_image_is_one_clear_sentence(server, tmp_path):
    path = tmp_path / "not-an-image.png"
    path.write_text("hello")
    with pytest.raises(Exception, match="not an image this app can read"):
        Client(server[0], verbose=False).predict(
            message="What is in the image?", history=[], image=handle_file(str(path)), api_name="/chat"
        )


def test_a_recording_for_a_model_that_does_not_hear_is_its_sentence(server, tmp_path):
    """The demo model does not hear: /chat's `audio` is refused with the sentence that says so."""
    from local_chat.errors import NO_HEARING
    from local_chat.voice.clips import Clip, wav_bytes

    path = tmp_path / "question.wav"
    path.write_bytes(wav_bytes(Clip(np.zeros(8000, dtype=np.float32), 16_000)))
    with pytest.raises(Exception) as error:
        Client(server[0], verbose=False).predict(
            message="What is this sound?", history=[], audio=handle_file(str(path)), api_name="/chat"
        )
    assert NO_HEARING in str(error.value)


def test_stop_ends_generation_on_the_server_within_two_steps(demo):
    with serve(demo, delay=0.05) as (url, counter):
        client = Client(url, verbose=False)
        stopped_at = stopped_mid_answer(url, counter)
        started = time.time()
        assert (
            client.predict(message="What is the capital of Italy?", history=[], api_name="/chat")
            == "The capital of Italy is Rome."
        )
        assert counter.calls - stopped_at < 15  # the next answer did not wait for the old one to finish
        assert time.time() - started < 10


def test_two_clients_at_once_get_their_own_answers(demo):
    with serve(demo, delay=0.01) as (url, _):
        questions = {"Spain": "Madrid", "Kenya": "Nairobi"}
        answers = {}

        def ask(country):
            client = Client(url, verbose=False)
            answers[country] = client.predict(
                message=f"What is the capital of {country}?", history=[], api_name="/chat"
            )

        threads = [threading.Thread(target=ask, args=(c,)) for c in questions]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert answers == {c: f"The capital of {c} is {cap}." for c, cap in questions.items()}
