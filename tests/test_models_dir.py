"""--models_dir: the checkpoints of folders listed at start-up (launchers/catalog.py), --model picking the one the
app serves, /v1/models listing every one with its state (ids, never paths) and a request for another refused in a
sentence. Real folders: tiny models of two families, the demo model, Accessory and Meta shards, a Hugging Face cache
snapshot, and folders that cannot load."""

import re
import shutil
import threading
import time

import psutil
import pytest
from openai import APIStatusError, OpenAI
from PIL import Image
from test_browser import ARTIFACTS, attach, browser, open_page, send, wait_for_answer  # noqa: F401

from fixtures import tiny_models
from fixtures.app_server import launched
from local_chat.defaults import DEMO_MODEL
from local_chat.errors import UserError
from local_chat.launchers import browser as launchers
from local_chat.launchers.catalog import find_models, pick

GIB = 2**30


@pytest.fixture(scope="module")
def models(tmp_path_factory, byte_llama_dir, checkpoints):
    """A folder of checkpoints, and a second one holding a Hugging Face cache and a name seen again."""
    top = tmp_path_factory.mktemp("models")
    first, cache = top / "first", top / "cache"
    first.mkdir(), cache.mkdir()
    shutil.copytree(byte_llama_dir, first / "byte-llama")
    tiny_models.save_tiny_qwen3(first / "qwen3-tiny")
    (first / "demo").symlink_to(DEMO_MODEL, target_is_directory=True)
    shutil.copytree(checkpoints["meta"], first / "llama-meta")
    shutil.copytree(checkpoints["accessory"], first / "llama-accessory")
    (first / "llama-accessory" / "meta.json").unlink()  # its llama_type unknown: listed with what it lacks
    (first / "broken").mkdir()
    (first / "broken" / "config.json").write_text("{not json")
    (first / "no-weights").mkdir()
    (first / "no-weights" / "config.json").write_text('{"model_type": "llama"}')
    (first / "notes").mkdir()  # not a checkpoint: not listed
    shutil.copytree(byte_llama_dir, first / "torn-weights")  # passes the listing's checks, fails to load
    next((first / "torn-weights").glob("*.safetensors")).write_bytes(b"not a safetensors file" * 1000)
    snapshot = cache / "models--acme--tiny-chat" / "snapshots" / "0123abcd"
    shutil.copytree(byte_llama_dir, snapshot)
    (cache / "models--acme--tiny-chat" / "refs").mkdir()
    (cache / "models--acme--tiny-chat" / "refs" / "main").write_text("0123abcd")
    shutil.copytree(byte_llama_dir, cache / "byte-llama")  # the same name as one of the first folder's
    return first, cache


def test_the_checkpoints_are_listed_with_ids_families_and_what_stops_one(models):
    listed = {m.id: m for m in find_models([str(f) for f in models], load_bytes=4, quant=None, free=64 * GIB)}
    assert sorted(listed) == sorted([
        "broken", "byte-llama", "demo", "llama-accessory", "llama-meta", "no-weights", "qwen3-tiny", "torn-weights",
        "acme/tiny-chat", "byte-llama@2",
    ])  # fmt: skip
    assert listed["qwen3-tiny"].family == "qwen3" and listed["byte-llama"].family == "llama"
    assert listed["demo"].sees_images and not listed["qwen3-tiny"].sees_images
    assert listed["llama-meta"].family == "llama (Meta)" and listed["llama-meta"].problem is None
    assert "lacks a meta.json naming its llama_type" in listed["llama-accessory"].problem
    assert "config.json cannot be read" in listed["broken"].problem
    assert "holds no weights" in listed["no-weights"].problem
    assert listed["acme/tiny-chat"].path.name == "0123abcd"
    assert all(m.size > 0 and m.fits for m in listed.values() if m.problem is None)
    tight = find_models([str(models[0])], load_bytes=4, quant=None, free=1000)
    assert not any(m.fits for m in tight if m.problem is None)
    assert "does not fit the free memory" in next(m for m in tight if m.id == "qwen3-tiny").line()


def test_model_picks_one_and_a_wrong_name_is_a_sentence(models):
    listed = find_models([str(models[0])], load_bytes=4, quant=None, free=None)
    assert pick(listed, None).id == "byte-llama" and pick(listed, "demo").id == "demo"
    with pytest.raises(UserError, match=r"--model 'nope' is not among the checkpoints found \(broken, byte-llama"):
        pick(listed, "nope")
    with pytest.raises(UserError, match="--model 'broken' cannot load: its config.json cannot be read"):
        pick(listed, "broken")


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--api_base", "http://127.0.0.1:9/v1"], "--models_dir lists local checkpoints, and --api_base"),
        (["--pretrained_path", "x"], "--models_dir and --pretrained_path both name the checkpoint"),
        (["--model", "nope"], "--model 'nope' is not among the checkpoints found"),
        (["--max_loaded_models", "0"], "--max_loaded_models 0: give 1 or more."),
        (["--idle_unload", "0"], "--idle_unload 0: give the minutes, above 0."),
        (["--admins", "bob"], "--admins names logins of --auth: add --auth USER:PASSWORD"),
        (["--auth", "alice:pw", "--admins", "bob"], "--admins 'bob' is not a login of --auth; name logins it has."),
    ],
)
def test_flags_that_cannot_go_together_are_one_sentence_before_loading(models, flags, said, capsys):
    with pytest.raises(SystemExit):
        launchers.app(["--models_dir", str(models[0]), *flags])
    assert said in capsys.readouterr().err


def model_processes(app) -> list:
    """The launched app's model processes: its children that multiprocessing spawned, but for its resource tracker."""
    children = psutil.Process(app.pid).children()
    return [child for child in children if "spawn_main" in " ".join(child.cmdline())]


def front_routes_by_model(engine_url: str) -> None:
    """An app in front of this one (--api_base, its /v1 built as the launcher builds it) lists the engine's models
    with their states and sends each request to the one its `model` names; a name the engine does not list is
    answered by the --model one, as before the front routed."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from local_chat.api import OpenAIAPI
    from local_chat.engine.choices.chosen import ModelEngine
    from local_chat.engine.choices.served import EngineModels
    from local_chat.engine.remote import RemoteEngine
    from local_chat.prompting import default_template

    first = RemoteEngine(engine_url, model="llama-accessory")  # loaded: the engine's last answer was its
    models = EngineModels(first, 4, default_template)
    api = OpenAIAPI(ModelEngine(models, first.model), "chat_template", None, 10, name=first.model, models=models)
    front = TestClient(Starlette(routes=api.routes()))
    states = {card["id"]: card["state"] for card in front.get("/v1/models").json()["data"]}
    assert states["llama-accessory"] == "loaded" and states["qwen3-tiny"] == "available"
    asked = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    for model in ("someone-else", "qwen3-tiny"):
        reply = front.post("/v1/chat/completions", json={**asked, "model": model}).json()
        assert reply["model"] == ("qwen3-tiny" if model == "qwen3-tiny" else "llama-accessory"), reply
    states = {card["id"]: card["state"] for card in front.get("/v1/models").json()["data"]}
    assert states["qwen3-tiny"] == "loaded"  # the engine loaded it for the front's request


def test_v1_picks_the_model_by_id_and_loads_it_in_its_own_process_unloading_the_other(models, tmp_path):
    config = tmp_path / "models.yaml"
    config.write_text("llama-accessory:\n  llama_type: llama  # what its folder lacks\n")
    app, client = launched("--models_dir", *map(str, models), "--model", "qwen3-tiny", "--models_config", str(config))
    try:
        api = OpenAI(base_url=client.src.rstrip("/") + "/v1", api_key="unused", max_retries=0)
        cards = {card.id: card.model_extra["state"] for card in api.models.list().data}
        assert cards["qwen3-tiny"] == "loaded" and cards["byte-llama"] == "available" and "broken" not in cards
        contexts = {card.id: card.model_extra.get("context_length") for card in api.models.list().data}
        assert all(isinstance(context, int) and context > 0 for context in contexts.values()), contexts
        assert not any("/tmp" in name for name in cards)  # ids, never paths
        [first] = model_processes(app)
        question = [{"role": "user", "content": "Hi"}]
        reply = api.chat.completions.create(model="qwen3-tiny", messages=question, max_tokens=4)
        assert reply.model == "qwen3-tiny" and reply.choices[0].finish_reason in ("stop", "length")
        reply = api.chat.completions.create(model="byte-llama", messages=question, max_tokens=4)
        assert reply.model == "byte-llama" and reply.choices[0].finish_reason in ("stop", "length")
        cards = {card.id: card.model_extra["state"] for card in api.models.list().data}
        assert cards["byte-llama"] == "loaded" and cards["qwen3-tiny"] == "available"  # --max_loaded_models 1
        assert not first.is_running() and len(model_processes(app)) == 1  # its process ended: its memory freed
        assert api.models.retrieve("qwen3-tiny").model_extra["state"] == "available"
        with pytest.raises(APIStatusError) as torn:
            api.chat.completions.create(model="torn-weights", messages=question, max_tokens=4)
        assert torn.value.status_code == 503 and "torn-weights could not load" in torn.value.body["message"]
        prompt = "The capital of France is"
        reply = api.completions.create(model="llama-accessory", prompt=prompt, max_tokens=4)  # its settings applied
        assert reply.model == "llama-accessory" and reply.choices[0].finish_reason in ("stop", "length")
        with pytest.raises(APIStatusError) as unknown:
            api.chat.completions.create(model="nope", messages=question, max_tokens=4)
        assert unknown.value.status_code == 404 and "qwen3-tiny" in unknown.value.body["message"]
        front_routes_by_model(client.src.rstrip("/") + "/v1")
        answer = client.predict(message="Hi", history=[], max_gen_len=4, api_name="/chat")  # the page's model
        assert isinstance(answer, str) and "could not" not in answer
        cards = {card.id: card.model_extra["state"] for card in api.models.list().data}
        assert cards["qwen3-tiny"] == "loaded" and "torn-weights" not in cards
    finally:
        app.terminate()
        output = app.communicate(timeout=30)[0]
    assert "Checkpoints found (--models_dir):" in output and "Starting with qwen3-tiny;" in output
    assert "broken: its config.json cannot be read" in output


def test_the_flags_of_models_on_demand_go_with_models_dir(capsys):
    with pytest.raises(SystemExit):
        launchers.app(["--max_loaded_models", "2"])
    assert (
        "--max_loaded_models, --idle_unload, --models_config and --admins go with --models_dir"
        in capsys.readouterr().err
    )


def test_the_page_picks_a_model_and_the_conversation_goes_on_with_it(browser, tmp_path, models):  # noqa: F811
    """The picker lists the models; a switch makes the next answer come from the new model (its template in
    "Prompt sent to the model"), the images left out with a notice, the thinking switch and the answer settings
    following the model, and each answer says which model gave it; reopening the conversation offers its model."""
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "demo").symlink_to(DEMO_MODEL, target_is_directory=True)
    (folder / "qwen3-tiny").symlink_to(models[0] / "qwen3-tiny", target_is_directory=True)
    image = tmp_path / "red.png"
    Image.new("RGB", (64, 64), "red").save(image)
    config = tmp_path / "models.yaml"
    config.write_text("qwen3-tiny:\n  system: You are a terse assistant.\n  temperature: 0.0\n")
    app, client = launched("--models_dir", str(folder), "--model", "demo", "--models_config", str(config))
    try:
        page = open_page(browser, client.src)
        attach(page, image)
        send(page, "What color is the image?")
        wait_for_answer(page, lambda text: text.endswith("."), timeout=60)
        page.locator(".model-picker input").first.click()
        options = [option.strip("✓ \n") for option in page.get_by_role("option").all_inner_texts()]
        assert options == ["demo", "qwen3-tiny"]
        page.screenshot(path=str(ARTIFACTS / "model-picker.png"), full_page=True)
        page.get_by_role("option", name="qwen3-tiny").click()
        page.get_by_text("Now answering: qwen3-tiny").wait_for(timeout=60_000)
        send(page, "Hi")
        page.get_by_text("qwen3-tiny does not see images").wait_for(timeout=30_000)
        stats = page.locator("text=/tokens · first token/")
        stats.nth(1).wait_for(timeout=60_000)
        lines = stats.all_inner_texts()
        assert lines[0].endswith("· demo") and lines[1].endswith("· qwen3-tiny"), lines
        page.locator("button", has_text="Prompt sent to the model").first.click()
        page.locator(".prompt-view").first.wait_for()
        sent = page.locator(".prompt-view").first.inner_text()
        assert "<|im_start|>system\nYou are a terse assistant." in sent  # --models_config's system prompt
        assert "<|im_start|>user" in sent  # in Qwen3's own template
        thinking = page.locator(".thinking")  # Qwen3's template reads enable_thinking; the demo's reads none
        assert thinking.is_visible() and thinking.get_by_label("think", exact=True).is_checked()
        page.locator(".label-wrap", has_text="Settings").first.click()
        temperature = page.get_by_label("number input for Temperature (0 = greedy)").first
        assert temperature.input_value() == "0"  # its --models_config's
        page.screenshot(path=str(ARTIFACTS / "model-switched.png"), full_page=True)
        page.reload()  # a new session, on --model's demo, reopens the conversation: it offers qwen3-tiny
        page.get_by_text("This conversation's latest answer came from qwen3-tiny").wait_for(timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "model-offered.png"), full_page=True)
        page.get_by_role("button", name="Go on with qwen3-tiny").click()
        page.get_by_text("Now answering: qwen3-tiny").wait_for(timeout=60_000)
        assert page.locator(".model-picker input").first.input_value() == "qwen3-tiny"
    finally:
        app.terminate()
        app.communicate(timeout=30)


def test_models_config_sets_each_models_flags_and_refuses_what_it_cannot_use(models, tmp_path):
    from local_chat.engine import Sampling
    from local_chat.launchers.flags import parser
    from local_chat.launchers.models_config import check_models_config, model_flags, read_models_config, sampling_of

    ids = ["qwen3-tiny", "llama-accessory"]
    config = tmp_path / "models.yaml"
    config.write_text("qwen3-tiny:\n  dtype: bf16\n  compile: false\n  temperature: 0\n  top_k: 20\n")
    settings = read_models_config(str(config))
    check_models_config(settings, ids)
    flags = model_flags(parser("app").parse_args(["--compile", "--quant", "8"]), settings["qwen3-tiny"], "qwen3-tiny")
    assert (flags.dtype, flags.compile, flags.quant) == ("bf16", False, 8)  # the command line's, overridden
    assert sampling_of(Sampling(), settings["qwen3-tiny"], "qwen3-tiny") == Sampling(temperature=0.0, top_k=20)
    for text, said in [
        ("nope:\n  dtype: fp16\n", "there is no model 'nope' in --models_dir (the ids are qwen3-tiny,"),
        ("qwen3-tiny:\n  colour: red\n", "qwen3-tiny: 'colour' is not a per-model setting; use template,"),
        ("qwen3-tiny:\n  dtype: float99\n", "qwen3-tiny: argument --dtype: invalid choice: 'float99'"),
        ("qwen3-tiny:\n  temperature: hot\n", "qwen3-tiny: temperature is 'hot'; give a number."),
        ("qwen3-tiny:\n  top_p: 7\n", "qwen3-tiny: `top_p` is 7; give from 0 to 1."),
        ("qwen3-tiny: [1, 2]\n", "give model ids as top-level keys"),
        ("qwen3-tiny:\n  dtype: [\n", "is not valid YAML"),
    ]:
        config.write_text(text)
        with pytest.raises(UserError, match=re.escape(said)):
            check_models_config(read_models_config(str(config)), ids)
    lacking = {m.id: m for m in find_models([str(models[0])], 4, None, None)}["llama-accessory"]
    assert "give it in --models_config" in lacking.problem and "(llama_type)" in lacking.problem
    given = {"llama-accessory": {"llama_type": "llama"}}
    assert {m.id: m for m in find_models([str(models[0])], 4, None, None, given)}["llama-accessory"].problem is None


def slowest_answer_during(url: str, busy) -> float:
    """The longest `GET url` took (seconds; a probe cut at 5 s counts as 5) while `busy()` is true, for 2 minutes at
    most, probed every 0.2 s: the server's loop is free when every probe answers at once."""
    import httpx

    slowest, deadline = 0.0, time.monotonic() + 120
    with httpx.Client(timeout=5.0) as http:
        while busy() and time.monotonic() < deadline:
            started = time.monotonic()
            try:
                http.get(url).raise_for_status()
                took = time.monotonic() - started
            except httpx.TimeoutException:
                took = 5.0
            slowest = max(slowest, took)
            time.sleep(0.2)
    return slowest


def test_a_message_sent_while_another_model_loads_never_holds_up_the_server(browser, tmp_path, models):  # noqa: F811
    """--max_loaded_models 1: the page picks another model and, while it loads, sends a message (to the session's
    model, which made room for the load); /v1 asks too. Both wait for the models off the server's loop, saying so:
    `GET /` answers within a second throughout, and both answers come."""
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "byte-llama").symlink_to(models[0] / "byte-llama", target_is_directory=True)
    (folder / "qwen3-tiny").symlink_to(models[0] / "qwen3-tiny", target_is_directory=True)
    app, client = launched("--models_dir", str(folder), "--model", "byte-llama")
    try:
        page = open_page(browser, client.src)
        page.locator(".model-picker input").first.click()
        page.get_by_role("option", name="qwen3-tiny").click()
        page.get_by_text("Waiting for the model: loading qwen3-tiny").wait_for(timeout=30_000)
        send(page, "Hi")
        api = OpenAI(base_url=client.src.rstrip("/") + "/v1", api_key="unused", max_retries=0)
        v1_answers: list = []
        asking = threading.Thread(
            target=lambda: v1_answers.append(
                api.chat.completions.create(
                    model="byte-llama", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
                )
            )
        )
        asking.start()
        answered = page.locator("text=/tokens · first token/")
        slowest = slowest_answer_during(client.src, lambda: answered.count() == 0 or asking.is_alive())
        page.screenshot(path=str(ARTIFACTS / "loading-does-not-hang.png"), full_page=True)
        assert slowest < 1.0, f"GET / took {slowest:.1f} s while a model loaded"
        assert v1_answers and v1_answers[0].model == "byte-llama"
        assert answered.first.inner_text().endswith("· byte-llama")  # the session's model until the switch ends
    finally:
        app.terminate()
        app.communicate(timeout=30)
