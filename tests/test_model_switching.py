"""engine/choices/folders.py: --models_dir's models loaded on demand, each in a process of its own, the least recently
used unloaded past --max_loaded_models (never one in use), quiet ones unloaded after --idle_unload, a model that fails
to load listed with its sentence. Real processes and real pipes; each fakes a model that has loaded (no weights)."""

import multiprocessing
import threading
import time

import pytest

from local_chat.engine import Delta, End, EngineSummary, Loading, Request, Sampling, collect
from local_chat.engine.choices.chosen import ModelEngine
from local_chat.engine.choices.folders import ModelProcess, Models
from local_chat.engine.pipe import LoadProgress, ModelFailed, StreamAnswer, Streamed
from local_chat.errors import UserError

FACTS = {
    "tokenizer": None,
    "chat_renderer": None,
    "summary": EngineSummary("fake", 64, False),
    "generation_defaults": Sampling(),
    "template": "default",
    "places": 1,
}


def fake_model(connection, reply, load_seconds: float) -> None:
    """A model's process: after `load_seconds` (halfway, it says it has loaded half its weights), `reply` (its facts,
    or a failure; "die": it exits with code 3), then each answer is "hi"."""
    time.sleep(load_seconds / 2)
    connection.send(LoadProgress("weights", 0.5))
    time.sleep(load_seconds / 2)
    if reply == "die":
        raise SystemExit(3)
    connection.send(reply)
    while True:
        try:
            asked = connection.recv()
        except EOFError:
            return
        if isinstance(asked, StreamAnswer):
            connection.send(Streamed(asked.number, Delta("hi")))
            connection.send(Streamed(asked.number, End("stop", completion_tokens=1)))


class FakeModels:
    """Starts `fake_model` processes: `replies` per id (default: loaded), `load_seconds` per id (default: 0)."""

    def __init__(self, replies=None, load_seconds=None):
        self.replies, self.load_seconds, self.started = replies or {}, load_seconds or {}, {}

    def __call__(self, model_id: str) -> ModelProcess:
        context = multiprocessing.get_context("fork")
        mine, there = context.Pipe()
        reply, seconds = self.replies.get(model_id, FACTS), self.load_seconds.get(model_id, 0.0)
        process = context.Process(target=fake_model, args=(there, reply, seconds), daemon=True)
        process.start()
        there.close()
        self.started[model_id] = process
        return ModelProcess(process, mine)


def house(start, max_loaded=1, idle_unload_s=None, ids=("a", "b", "c")) -> Models:
    listed = [(model_id, None) for model_id in ids] + [("broken", "its config.json cannot be read.")]
    return Models(listed, start, max_loaded=max_loaded, idle_unload_s=idle_unload_s)


def used(models: Models, model_id: str) -> None:
    models.lease(model_id).release()


def test_models_load_when_asked_for_and_the_least_recently_used_makes_room():
    start = FakeModels()
    models = house(start, max_loaded=2)
    try:
        assert models.states() == [("a", "available"), ("b", "available"), ("c", "available")]
        used(models, "a"), used(models, "b"), used(models, "a")
        assert dict(models.states()) == {"a": "loaded", "b": "loaded", "c": "available"}
        used(models, "c")  # b was used longest ago: its process ends
        assert dict(models.states()) == {"a": "loaded", "b": "available", "c": "loaded"}
        assert not start.started["b"].is_alive() and start.started["a"].is_alive()
        first_a = start.started["a"]
        used(models, "a")
        assert start.started["a"] is first_a  # loaded already: not started again
    finally:
        models.close()
    assert not any(process.is_alive() for process in start.started.values())


def test_a_model_in_use_is_never_unloaded_and_the_other_waits_for_its_answers():
    start = FakeModels()
    models = house(start)
    try:
        held = models.lease("a")
        other = threading.Thread(target=used, args=(models, "b"))
        other.start()
        other.join(0.8)
        assert other.is_alive() and start.started["a"].is_alive() and "b" not in start.started
        assert models.waiting_sentence("b") == "waiting for a to finish its answers before loading b"
        held.release()
        other.join(10)
        assert not other.is_alive() and dict(models.states()) == {"a": "available", "b": "loaded", "c": "available"}
        assert not start.started["a"].is_alive()
    finally:
        models.close()


def test_a_quiet_model_is_unloaded_after_idle_unload():
    start = FakeModels()
    models = house(start, idle_unload_s=0.3)
    try:
        used(models, "a")
        deadline = time.monotonic() + 10
        while dict(models.states())["a"] != "available" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert dict(models.states())["a"] == "available" and not start.started["a"].is_alive()
        used(models, "a")  # loaded again when asked for
        assert dict(models.states())["a"] == "loaded"
    finally:
        models.close()


def test_a_model_that_fails_to_load_says_why_and_the_others_still_work():
    start = FakeModels(replies={"b": ModelFailed("its weights are torn."), "c": "die"})
    models = house(start, max_loaded=3)
    try:
        with pytest.raises(UserError, match=r"^b could not load: its weights are torn\.$"):
            models.lease("b")
        with pytest.raises(UserError, match=r"^c could not load: its process stopped \(exit code 3\)"):
            models.lease("c")
        assert models.states() == [("a", "available")]  # the others listed with their sentences on the page
        assert models.unknown_sentence("b") == "b cannot load: its weights are torn."
        assert models.unknown_sentence("broken") == "broken cannot load: its config.json cannot be read."
        with pytest.raises(UserError, match="b cannot load"):
            models.lease("b")  # not tried again
        assert "the models are a" in models.unknown_sentence("nope")
        used(models, "a")
        assert not start.started["b"].is_alive() and not start.started["c"].is_alive()
    finally:
        models.close()


def test_an_answer_to_a_model_being_loaded_says_so_then_streams():
    models = house(FakeModels(load_seconds={"a": 0.8}))
    try:
        events = list(ModelEngine(models, "a").stream(Request(prompt="Hello")))
        assert isinstance(events[0], Loading) and events[0].sentence.startswith("loading a")
        assert [e.text for e in events if isinstance(e, Delta)] == ["hi"] and isinstance(events[-1], End)
        assert collect(models.stream("nope", Request(prompt="Hello"))).end.error.startswith("There is no model 'nope'")
    finally:
        models.close()


def test_a_load_says_how_far_it_has_come_as_its_process_tells():
    models = house(FakeModels(load_seconds={"a": 2.0}))
    try:
        loading = threading.Thread(target=used, args=(models, "a"))
        loading.start()
        deadline = time.monotonic() + 10
        while models.load_progress("a") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert models.load_progress("a") == LoadProgress("weights", 0.5)
        assert models.waiting_sentence("a").startswith("loading a: weights 50%, ")
        loading.join(10)
        assert models.load_progress("a") is None and dict(models.states())["a"] == "loaded"
    finally:
        models.close()


def test_a_model_process_tells_how_far_transformers_has_loaded_the_weights(tmp_path):
    from fixtures.tiny_models import random_llama, save_hf, train_byte_level_tokenizer
    from local_chat.launchers.model_processes import _progress_told
    from local_chat.model.meta import MetaModel

    tokenizer = train_byte_level_tokenizer()
    folder = save_hf(random_llama(len(tokenizer)), tmp_path / "tiny", hf_tokenizer=tokenizer)
    mine, there = multiprocessing.get_context("fork").Pipe()
    with _progress_told(there, every=0.25):
        MetaModel.from_pretrained(str(folder), device="cpu")
    told = []
    while mine.poll(0):
        told.append(mine.recv())
    assert told[-1] == LoadProgress("weights", 1.0) and 2 <= len(told) <= 5, told
    assert all(0 < a.done < b.done for a, b in zip(told, told[1:]))


def test_a_streamed_v1_answer_says_what_it_waits_for_while_its_model_loads():
    import json

    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from local_chat.api import OpenAIAPI

    models = house(FakeModels(replies={"c": ModelFailed("its weights are torn.")}, load_seconds={"b": 2.5}))
    try:
        used(models, "a")
        api = OpenAIAPI(ModelEngine(models, "a"), "default", None, 10, name="a", models=models)
        client = TestClient(Starlette(routes=api.routes()))

        def streamed(model: str) -> list[str]:
            asked = {"model": model, "prompt": "Hi", "max_tokens": 2, "stream": True}
            with client.stream("POST", "/v1/completions", json=asked) as response:
                assert response.status_code == 200
                return [line for line in response.iter_lines() if line]

        lines = streamed("b")  # not loaded: comments while it loads, then the answer
        comments = [line for line in lines if line.startswith(":")]
        assert lines[0] == comments[0] and any(c.startswith(": loading b: weights 50%, ") for c in comments), lines
        texts = [json.loads(line[6:])["choices"][0]["text"] for line in lines if line.startswith("data: {")]
        assert "".join(texts) == "hi" and lines[-1] == "data: [DONE]" and dict(models.states())["b"] == "loaded"
        assert not any(line.startswith(":") for line in streamed("b"))  # loaded: no wait, no comment
        failed = streamed("c")
        assert json.loads(failed[-2][6:])["error"]["message"] == "c could not load: its weights are torn."
        refused = client.post("/v1/completions", json={"model": "nope", "prompt": "Hi", "stream": True})
        assert refused.status_code == 404  # what is known at once is still a status
    finally:
        models.close()


def test_with_admins_only_they_load_a_model_on_the_page_and_v1_answers_with_loaded_ones():
    import asyncio
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from local_chat.api import OpenAIAPI
    from local_chat.engine.choices.folders import NotLoaded
    from local_chat.ui.chat import Cancels
    from local_chat.ui.model_picker import ModelPicker
    from local_chat.ui.single_turn import SingleTurnTab

    models = house(FakeModels(), max_loaded=2)
    try:
        used(models, "a")
        with pytest.raises(NotLoaded, match=r"^b is not loaded; an admin loads it on the page\.$"):
            models.lease("b", may_load=False)
        models.lease("a", may_load=False).release()  # a loaded one: anyone

        api = OpenAIAPI(ModelEngine(models, "a"), "plain", None, 10, name="a", models=models, loads=False)
        client = TestClient(Starlette(routes=api.routes()))
        refused = client.post("/v1/completions", json={"model": "b", "prompt": "Hi", "max_tokens": 2})
        assert (
            refused.status_code == 409
            and refused.json()["error"]["message"] == "b is not loaded; an admin loads it on the page."
        )
        states = {card["id"]: card["state"] for card in client.get("/v1/models").json()["data"]}
        assert states == {"a": "loaded", "b": "available", "c": "available"}

        picker = ModelPicker(models, "a", 10, admins=["alice"])
        picker._tabs = []

        async def chosen_by(user: str) -> list:
            return [out async for out in picker.choose("b", "a", SimpleNamespace(username=user))]

        *_, (current, shown, _, status, _) = asyncio.run(chosen_by("bob"))
        assert (current, shown) != ("b", "b") and "b is not loaded; an admin loads it on the page." in status
        assert dict(models.states())["b"] == "available"
        *_, (current, _, _, status, _) = asyncio.run(chosen_by("alice"))
        assert current == "b" and status == "Now answering: **b**." and dict(models.states())["b"] == "loaded"
        used(models, "a"), used(models, "c")  # b is the least recently used: unloaded to make room for c
        assert dict(models.states())["b"] == "available"
        with pytest.raises(NotLoaded, match=r"^b is not loaded any more; an admin loads it on the page"):
            picker.engine_of("b", SimpleNamespace(username="bob"))  # bob's page still on b: his answers refused
        assert dict(models.states())["b"] == "available"

        single = SingleTurnTab(ModelEngine(models, "a"), Cancels(), picker)  # the Single-turn tab: the session's model

        async def single_turn(user: str) -> list:
            asker = SimpleNamespace(username=user, session_hash=user)
            return [out async for out in single.run("Hi", "", "alpaca", 8, 0.0, 1.0, 0, 1.0, "b", asker)]

        assert asyncio.run(single_turn("bob"))[-1][0].startswith("⚠️ b is not loaded any more")
        assert asyncio.run(single_turn("alice"))[-1][0] == "hi" and dict(models.states())["b"] == "loaded"
    finally:
        models.close()


def test_stop_while_the_model_loads_ends_the_answer_at_once_and_the_load_goes_on():
    models = house(FakeModels(load_seconds={"a": 1.5}))
    try:
        request = Request(prompt="Hello", cancel=threading.Event())
        events = models.stream("a", request)
        assert isinstance(next(events), Loading)
        request.cancel.set()
        stopped_at = time.monotonic()
        assert next(events) == End("cancelled") and time.monotonic() - stopped_at < 1.0
        deadline = time.monotonic() + 10
        while dict(models.states())["a"] != "loaded" and time.monotonic() < deadline:
            time.sleep(0.1)
        used(models, "b")  # a is loaded and in no one's use: it makes room
        assert dict(models.states()) == {"a": "available", "b": "loaded", "c": "available"}
    finally:
        models.close()
