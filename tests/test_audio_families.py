"""Real checkpoints of the families that hear: each a tiny random model of its real transformers class, saved with its
real processor class and published chat template (fixtures/audio_families.py). A recording goes in a message as
OpenAI's `input_audio` part; the prompt is the processor's rendering, the answer the model's own `generate`'s, and
the session's KV cache holds the clip across turns. On the page a recording goes to the model as sound, is kept with
the saved conversation (schema 8) and plays back."""

import base64
import json
import sqlite3
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures import audio_families
from fixtures.app_server import last_of, serve
from local_chat.engine import Request, Sampling, collect
from local_chat.engine.chats import ChatEngine
from local_chat.errors import NO_EYES_HERE, NO_HEARING, UserError
from local_chat.history import store as store_module
from local_chat.history.kinds import Kind
from local_chat.history.store import Store
from local_chat.model.meta import MetaModel
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_settings import NOT_HEARD, ChatSettings
from local_chat.ui.chat_tab import ChatTab
from local_chat.ui.history import SavedChats
from local_chat.ui.turns import kind_of
from local_chat.voice.clips import Clip, wav_bytes

pytest.importorskip("soundfile")

SYSTEM = "Be brief."
FIRST, SECOND = "What is this sound?", "And how loud is it?"
RATE = 16_000
LOW, HIGH = Clip(audio_families.tone(220, 1.0), RATE), Clip(audio_families.tone(1760, 1.0), RATE)  # same length
GREEDY = Sampling(temperature=0, max_new_tokens=6)


@pytest.fixture(scope="module")
def folders():
    return {}


@pytest.fixture(scope="module")
def family(request, folders, tmp_path_factory):
    """(name, loaded MetaModel) of the family named by the test's parameter."""
    name = request.param
    if name not in folders:
        folders[name] = audio_families.build(name, tmp_path_factory.mktemp(name) / name)
    return name, MetaModel.from_pretrained(str(folders[name]), max_seq_len=1024)


def input_audio(clip: Clip) -> dict:
    """OpenAI's part for a recording: its WAV file's bytes in base64."""
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(clip)).decode(), "format": "wav"}}


def conversation(clip: Clip, first_answer: str | None = None) -> list[dict]:
    """The app's messages: a question about `clip`; with `first_answer`, its answer and a second question."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [input_audio(clip), {"type": "text", "text": FIRST}]},
    ]
    if first_answer is not None:
        messages += [{"role": "assistant", "content": first_answer}, {"role": "user", "content": SECOND}]
    return messages


def reference(name: str, clip: Clip, first_answer: str) -> list[dict]:
    """The same two turns as a user of transformers writes them for the processor. Voxtral's (mistral-common's)
    takes a recording as a WAV file's base64, and no system prompt beside it: its text goes before the question, as
    the chat layer puts it where a template refuses a system prompt."""
    system = [{"role": "system", "content": SYSTEM}]
    audio, question = {"type": "audio", "audio": clip.samples}, FIRST
    if name == "voxtral":
        system, question = [], f"{SYSTEM}\n\n{FIRST}"
        audio = {"type": "audio", "base64": base64.b64encode(wav_bytes(clip)).decode()}
    return [
        *system,
        {"role": "user", "content": [audio, {"type": "text", "text": question}]},
        {"role": "assistant", "content": first_answer},
        {"role": "user", "content": SECOND},
    ]


def answer(model, messages, session=None):
    engine = ChatEngine(model.engine, "chat_template")
    request = Request(messages=messages, sampling=GREEDY, session=session)
    events = list(engine.stream(request))
    return events[0], collect(iter(events[1:]))


@pytest.mark.parametrize("family", audio_families.FAMILIES, indirect=True)
def test_two_turns_about_a_clip_are_the_processors_prompt_and_generates_tokens(family):
    """The second turn's prompt is the processor's rendering of the same conversation, its token ids (the clip's
    audio tokens among them) the processor's, and its greedy tokens those of transformers' `generate`; it runs from
    the session's cache of the first turn, clip included."""
    name, model = family
    _, one = answer(model, conversation(LOW), session="tab")
    assert one.end.error is None and one.end.cached_tokens == 0
    rendered, two = answer(model, conversation(LOW, one.text), session="tab")
    assert two.end.error is None and two.end.cached_tokens > 0
    two_turns = reference(name, LOW, one.text)
    # the published template, given (transformers 5.24 drops Phi-4-multimodal's processor's on loading); Voxtral has
    # none: its processor's one step gives mistral-common's tokens
    published = {} if name == "voxtral" else {"chat_template": audio_families.template(name)}
    rendering = model.processor.apply_chat_template(two_turns, add_generation_prompt=True, tokenize=False, **published)
    assert rendered.text == rendering
    expected = model.processor.apply_chat_template(
        two_turns, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt", **published
    )
    ours = model.engine.encoder.prepare_inputs([rendered.text], [[LOW]])
    assert ours.input_ids[0].tolist() == expected["input_ids"][0].tolist()
    audio_id = model.engine.sessions.audio_token_id
    assert (ours.input_ids == audio_id).sum() > 10
    generated = model.llma.generate(**expected, max_new_tokens=len(two.end.token_ids), do_sample=False)
    assert two.end.token_ids == generated[0, expected["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("family", audio_families.FAMILIES, indirect=True)
def test_the_answer_is_about_the_clip_of_its_turn(family):
    """Two clips of the same length, two answers; a new clip in the same session is heard (not the cached one)."""
    _, model = family
    low, high = answer(model, conversation(LOW))[1], answer(model, conversation(HIGH))[1]
    assert low.end.token_ids != high.end.token_ids
    answer(model, conversation(LOW), session="s")
    again = answer(model, conversation(HIGH), session="s")[1]
    assert again.end.token_ids == high.end.token_ids


@pytest.mark.parametrize("family", ["phi4_multimodal"], indirect=True)
def test_phi4_multimodal_without_torchvision_hears_and_says_why_it_takes_no_image(family):
    """Its image processor needs torchvision: it loads without it, hears, and an image is one sentence that says so."""
    from PIL import Image

    _, model = family
    assert model.engine.summary().hears and not model.engine.summary().sees_images
    picture = "data:image/png;base64," + base64.b64encode(image_bytes(Image.new("RGB", (32, 32), "red"))).decode()
    asked = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": picture}},
                                          {"type": "text", "text": FIRST}]}]  # fmt: skip
    result = collect(ChatEngine(model.engine, "chat_template").stream(Request(messages=asked, sampling=GREEDY)))
    assert result.end.error == NO_EYES_HERE


def image_bytes(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_model_that_cannot_hear_says_so_in_one_sentence(byte_model):
    chats = ChatEngine(byte_model.engine, "chat_template")
    result = collect(chats.stream(Request(messages=conversation(LOW), sampling=GREEDY)))
    assert result.end.error == NO_HEARING


@pytest.mark.parametrize("family", audio_families.FAMILIES[:1], indirect=True)
def test_a_recording_through_v1_with_the_openai_client_and_chat_with_gradio_client(family, tmp_path):
    """/v1/chat/completions with an `input_audio` part (and one that is not sound: its sentence, a 400); the page's
    /chat API with the recording as a file beside the message, through gradio_client."""
    import openai
    from gradio_client import Client, handle_file
    from openai import OpenAI

    _, model = family
    expected = answer(model, conversation(LOW))[1]
    with serve(model) as (url, _):
        api = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        reply = api.chat.completions.create(model="m", messages=conversation(LOW), max_tokens=6, temperature=0)
        assert reply.choices[0].message.content == expected.text
        broken = conversation(LOW)
        broken[1]["content"][0]["input_audio"]["data"] = base64.b64encode(b"not sound at all").decode()
        with pytest.raises(openai.BadRequestError) as error:
            api.chat.completions.create(model="m", messages=broken, max_tokens=6)
        recording = tmp_path / "question.wav"
        recording.write_bytes(wav_bytes(LOW))
        page_api = Client(url, verbose=False)
        heard = page_api.predict(
            message=FIRST, history=[], system=SYSTEM, audio=handle_file(str(recording)), max_gen_len=6,
            temperature=0.0, api_name="/chat",
        )  # fmt: skip
    assert "cannot be read as sound" in str(error.value)
    assert heard == expected.text.strip()


@pytest.mark.parametrize("family", audio_families.FAMILIES, indirect=True)
def test_answers_about_clips_at_once_are_those_given_alone(family):
    """Four answers about four clips at the same time (they run in the batch beside each other) are the greedy
    answers each gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    _, model = family
    clips = [Clip(audio_families.tone(hertz, seconds), RATE) for hertz, seconds in ((220, 1), (440, 1.2), (880, 1.4),
                                                                                     (1760, 2))]  # fmt: skip
    alone = [answer(model, conversation(clip))[1].end.token_ids for clip in clips]
    model.engine.start_batching(4)
    try:
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda clip: answer(model, conversation(clip))[1].end.token_ids, clips))
    finally:
        model.engine.stop_batching()
    assert together == alone and len(set(map(tuple, alone))) == 4


# ----- the page -----

BROWSER = "b" * 40
OWNER = "browser:" + BROWSER
REQUEST = SimpleNamespace(session_hash="tab", username=None)


def page_settings(conversation=None) -> ChatSettings:
    return ChatSettings(conversation, BROWSER, "chat_template", SYSTEM, "padded_resize", 6, 0.0, 0.75, 0, 1.0)


def send(tab: ChatTab, box: dict, history=(), conversation=None):
    """The chat tab's Send as the page runs it: its last update."""
    return last_of(tab.submit(REQUEST, box, list(history), page_settings(conversation)))


@pytest.mark.parametrize("family", audio_families.FAMILIES[:1], indirect=True)
def test_the_page_sends_a_recording_to_a_model_that_hears_and_keeps_it(family, tmp_path):
    """A recording attached in the message box goes to the model as sound (the answer /v1 gives for the same
    conversation), is kept with the saved conversation as a WAV file and shown as a player of its signed address;
    reopened, the next turn hears it again from the store."""
    _, model = family
    recording = tmp_path / "question.wav"
    recording.write_bytes(wav_bytes(LOW))
    store = Store(tmp_path / "chats.db")
    tab = ChatTab(model.engine, Cancels(), "chat_template", "padded_resize", SavedChats(store))
    sent = send(tab, {"text": FIRST, "files": [str(recording)]})
    entries, conversation_id = sent.chat, sent.conversation_id
    question, answered = entries[0], [e for e in entries if kind_of(e) == Kind.ANSWER][0]
    assert question["text"] == FIRST and len(question["clips"]) == 1
    assert '<audio controls src="/history/image/' in question["content"]
    assert answered["content"] == answer(model, conversation(LOW))[1].text
    saved = store.get(OWNER, conversation_id).messages[0]["content"]
    assert [p["type"] for p in saved] == ["audio", "text"]
    assert store.sound_path(saved[0]["sha256"]).read_bytes() == wav_bytes(LOW)
    address = question["content"].split('src="', 1)[1].split('"', 1)[0]
    digest, signature = address.split("/")[-1].split("?sig=")
    assert store.image_for_owner_of(conversation_id, digest, signature) == store.sound_path(digest)
    assert store.image_for_owner_of(conversation_id, digest, "0" * 32) is None

    reopened = SavedChats(store).shown(OWNER, conversation_id, store.get(OWNER, conversation_id).messages)
    second = send(tab, {"text": SECOND, "files": []}, reopened, conversation_id)
    expected = answer(model, conversation(LOW, answered["content"]))[1]
    assert [e for e in second.chat if kind_of(e) == Kind.ANSWER][-1]["content"] == expected.text
    store.close()


def test_a_recording_for_a_model_that_does_not_hear_is_taken_out_with_its_sentence(byte_model, tmp_path, monkeypatch):
    warned = []
    monkeypatch.setattr("local_chat.ui.chat_tab.gr.Warning", warned.append)
    recording = tmp_path / "question.wav"
    recording.write_bytes(wav_bytes(LOW))
    tab = ChatTab(byte_model.engine, Cancels(), "chat_template", "padded_resize", SavedChats(None))
    sent = send(tab, {"text": FIRST, "files": [str(recording)]})
    assert warned == [NOT_HEARD] and sent.box == {"text": FIRST, "files": []}  # the text stays in the box


def test_a_version_7_database_is_upgraded_and_the_old_app_refuses_the_new_one(tmp_path, monkeypatch):
    path = tmp_path / "conversations.db"
    with sqlite3.connect(path) as db:
        db.executescript((Path(__file__).resolve().parent / "data" / "conversations-v7.sql").read_text())
    store = Store(path)
    found = store.get(OWNER.replace("b" * 40, "f" * 32), "conversation-seven")
    assert [m["role"] for m in found.messages] == ["user", "assistant", "user", "assistant"]
    assert found.messages[2]["content"][0] == {"type": "image", "sha256": "a" * 64}
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == store_module.SCHEMA_VERSION == 8
    store.close()
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 7)  # the app before this schema: it would drop recordings
    with pytest.raises(UserError, match="was written by a newer version of this app"):
        Store(path)


@pytest.mark.parametrize("family", audio_families.FAMILIES[:1], indirect=True)
def test_in_chromium_a_recording_goes_to_the_model_and_plays_back(family, tmp_path):
    """The microphone (fed from a WAV file) records a question for the model that hears: it stays attached (no
    --stt_model), goes with Send, and the saved question shows a player whose sound loads from its signed address."""
    pytest.importorskip("playwright")
    import shutil

    from playwright.sync_api import sync_playwright
    from test_browser import ARTIFACTS, CHROMIUM, READY, send, wait_for_answer

    _, model = family
    question = tmp_path / "question.wav"
    question.write_bytes(wav_bytes(Clip(audio_families.tone(440, 3.0), 48_000)))
    fake_audio = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                  f"--use-file-for-fake-audio-capture={question}"]  # fmt: skip
    ARTIFACTS.mkdir(exist_ok=True)
    store = Store(tmp_path / "chats.db")
    with sync_playwright() as p, serve(model, store=store) as (url, _):
        executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox", *fake_audio])
        page = browser.new_context(permissions=["microphone"]).new_page()
        page.goto(url)
        page.wait_for_selector(READY)
        page.get_by_label("Record audio").click()
        page.get_by_label("Start recording").click()
        page.wait_for_timeout(2000)
        page.get_by_label("Stop recording").click()
        page.get_by_label("Attach audio").click()
        page.wait_for_selector(".message [data-testid='file-preview'], .message .thumbnail-item")
        send(page, FIRST)
        wait_for_answer(page, lambda text: len(text) > 0)
        player = page.wait_for_selector("[data-testid='user'] audio", timeout=20_000)
        loaded = page.evaluate(
            "a => new Promise(done => { a.onloadedmetadata = () => done(a.duration); a.onerror = () => done(-1);"
            " a.load(); })",
            player,
        )
        page.screenshot(path=str(ARTIFACTS / "audio-question.png"), full_page=True)
        browser.close()
    assert 1.5 < loaded < 3.5  # the recording's own length, served back
    saved = [json.loads(entries) for (entries,) in sqlite3.connect(store.path).execute("SELECT entries FROM nodes")]
    question_parts = saved[0][0]["content"]
    assert [part["type"] for part in question_parts] == ["audio", "text"]  # kept as sound, not as its text
    store.close()


def test_the_models_dir_lists_the_models_that_hear(tmp_path):
    from local_chat.launchers.catalog import find_models

    for name in audio_families.FAMILIES:
        audio_families.build(name, tmp_path / name)
    lines = {m.id: m.line() for m in find_models([str(tmp_path)], 4, None, None)}
    assert lines == {
        "qwen2_audio": "qwen2_audio (qwen2_audio, 1 MiB, hears)",
        "qwen2_5_omni": "qwen2_5_omni (qwen2_5_omni, 1 MiB, sees images, hears)",
        "voxtral": "voxtral (voxtral, 1 MiB, hears)",
        "phi4_multimodal": "phi4_multimodal (phi4_multimodal, 1 MiB, sees images, hears)",  # where torchvision loads
    }


@pytest.mark.parametrize("family", ["voxtral"], indirect=True)
def test_voxtral_without_mistral_common_is_one_sentence(family, folders, monkeypatch):
    """Voxtral's prompts are mistral-common's: without it, the folder is refused with the extra to install."""
    monkeypatch.setitem(sys.modules, "mistral_common", None)
    with pytest.raises(UserError, match=r"holds a Voxtral model, whose prompts mistral-common renders, and it is not "
                                        r"installed; install the voxtral extra"):  # fmt: skip
        MetaModel.from_pretrained(str(folders["voxtral"]))
