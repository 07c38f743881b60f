"""Voice (local_chat/voice/, ui/voice.py, api/audio.py): a tiny random Whisper of the real class with its real feature
extractor transcribes as transformers' own pipeline does; espeak-ng speaks an answer sentence by sentence, the first
before the answer ends; a tiny VITS speaks as its model does, a tiny Kokoro as the kokoro package does; /v1/audio
through the `openai` client; in Chromium, the microphone fed from a WAV file puts its transcript in the box, and
answers are read aloud."""

import asyncio
import io
import re
import shutil
import sys
import time
import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fixtures.app_server import serve
from fixtures.voice_models import WINDOW_S, build_vits, build_whisper, spoken_wav
from local_chat.defaults import DEMO_MODEL
from local_chat.errors import UserError
from local_chat.model.meta import MetaModel
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_settings import ChatSettings
from local_chat.ui.chat_tab import ChatTab
from local_chat.ui.history import SavedChats
from local_chat.ui.voice import answer_text
from local_chat.voice import Voice, sentences_of, voice_of
from local_chat.voice.clips import Clip, encoded, read_clip, resampled
from local_chat.voice.espeak import NO_ESPEAK, Espeak
from local_chat.voice.kokoro import KokoroSpeaker
from local_chat.voice.speech import Sentences, TransformersSpeaker
from local_chat.voice.transcribe import Transcriber

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("voice")
    return SimpleNamespace(
        whisper=build_whisper(root / "whisper"),
        vits=build_vits(root / "vits"),
        question=spoken_wav(QUESTION, root / "question.wav"),
        other=spoken_wav("Tell me a joke about cats and dogs.", root / "other.wav", voice="en-gb"),
    )


@pytest.fixture(scope="module")
def transcriber(folders):
    return Transcriber(str(folders.whisper))


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL), speculative="off")


def clip_of(path: Path) -> Clip:
    return read_clip(path.read_bytes(), path.name, 20)


# ----- sentences -----


def test_sentences_end_where_a_reader_pauses_streamed_or_whole():
    text = (
        "I am a **bot**. It says e.g. this, and Dr. Who agrees! Pi is 3.14 or so.\n"
        "1. First point\n2. Second point\n\n```python\nprint('code is not read')\n```\n"
        "See [the docs](https://x.y). Done"
    )
    expected = ["I am a bot.", "It says e.g. this, and Dr. Who agrees!", "Pi is 3.14 or so.", "1. First point",
                "2. Second point", "See the docs.", "Done"]  # fmt: skip
    assert sentences_of(text) == expected
    streamed, sentences = [], Sentences()
    for end in range(1, len(text) + 1):  # a character at a time, as an answer streams
        streamed += sentences.more(text[:end])
    assert streamed + sentences.rest(text) == expected
    assert sentences_of("   ") == []


# ----- speech in -----


def test_the_transcript_is_transformers_pipelines_own(folders, transcriber):
    from transformers import pipeline

    asr = pipeline("automatic-speech-recognition", model=str(folders.whisper), device="cpu")
    texts = []
    for path in (folders.question, folders.other):
        clip = clip_of(path)
        theirs = asr({"raw": resampled(clip, 16_000).samples, "sampling_rate": 16_000},
                     generate_kwargs={"num_beams": 1, "task": "transcribe"})["text"]  # fmt: skip
        texts.append(transcriber.transcribe(clip))
        assert texts[-1] == theirs.strip() and texts[-1]
    assert texts[0] != texts[1]  # the sound makes the text
    languages = {transcriber.transcribe(clip_of(folders.question), language=code) for code in ("en", "de", "fr")}
    assert len(languages) > 1  # the language's token is given
    raw = {"raw": resampled(clip_of(folders.question), 16_000).samples, "sampling_rate": 16_000}
    translated = asr(raw, generate_kwargs={"num_beams": 1, "task": "translate"})["text"].strip()
    assert transcriber.transcribe(clip_of(folders.question), task="translate") == translated
    with pytest.raises(UserError, match="cannot transcribe"):
        transcriber.transcribe(clip_of(folders.question), language="xx")


def test_a_recording_longer_than_whispers_window_is_transcribed_whole(folders, transcriber):
    clip = clip_of(folders.question)
    long = Clip(np.tile(clip.samples, 4), clip.rate)  # past the tiny Whisper's 3 s window (a real one's is 30 s)
    assert long.seconds > 2 * WINDOW_S
    assert len(transcriber.transcribe(long)) > len(transcriber.transcribe(clip))


def test_recordings_that_cannot_be_heard_are_one_sentence_each(folders):
    with pytest.raises(UserError, match=r"notes.txt cannot be read as sound .*; send WAV, FLAC, MP3 or Ogg"):
        read_clip(b"just some text", "notes.txt", 20)
    with pytest.raises(UserError, match=r"over the 0.01 MB limit"):
        read_clip(folders.question.read_bytes(), "question.wav", 0.01)
    with pytest.raises(UserError, match=r"lasts 2 s, over the 1 s limit"):
        read_clip(folders.question.read_bytes(), "question.wav", 20, max_seconds=1)
    silent = io.BytesIO()
    with wave.open(silent, "wb") as file:
        file.setnchannels(1), file.setsampwidth(2), file.setframerate(16_000)
    with pytest.raises(UserError, match="is empty"):
        read_clip(silent.getvalue(), "empty.wav", 20)
    with pytest.raises(UserError, match="has no config.json"):
        Transcriber(str(folders.question.parent))
    with pytest.raises(UserError, match="is a vits model; give a Whisper folder"):
        Transcriber(str(folders.vits))


def test_the_message_box_gets_a_recordings_text_and_a_bad_one_says_why(folders, transcriber, tmp_path, monkeypatch):
    from local_chat.ui.voice import PageVoice

    warned = []
    monkeypatch.setattr("gradio.Warning", lambda message, *args, **kwargs: warned.append(message))
    page = PageVoice(Voice(transcriber, None), max_upload_mb=20)
    notes = tmp_path / "notes.txt"
    notes.write_text("not sound")
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF....WAVEfmt ")
    document = tmp_path / "paper.pdf"
    box = {"text": "Please answer: ", "files": [str(folders.question), str(broken), str(document)]}
    heard = asyncio.run(page.transcribed(box))
    expected = transcriber.transcribe(clip_of(folders.question))
    assert heard == {"text": "Please answer: " + expected, "files": [str(document)]}  # the document stays
    assert warned == ["Taken out of the message (your text is still there): The file broken.wav cannot be read as "
                      "sound (Error in WAV file. No 'data' chunk marker); send WAV, FLAC, MP3 or Ogg."]  # fmt: skip
    for files in ([], [str(notes), str(document)]):  # no recording among them: the box as it is
        assert asyncio.run(page.transcribed({"text": "typed", "files": files})) == {"__type__": "update"}
    page.model_hears = lambda model: model == "qwen2-audio"  # a model that hears takes the recording itself
    assert asyncio.run(page.transcribed(box, "qwen2-audio")) == {"__type__": "update"}
    assert asyncio.run(page.transcribed(box, "demo"))["files"] == [str(document)]


# ----- speech out -----


def test_espeak_speaks_each_voice_and_speed_and_says_what_is_wrong():
    speaker = Espeak()
    slow, fast = speaker.speak("Hello there.", "alloy", 0.5), speaker.speak("Hello there.", "alloy", 2.0)
    assert slow.rate == 22_050 and slow.seconds > 1.5 * fast.seconds
    assert not np.array_equal(speaker.speak("Hello.", "nova").samples, speaker.speak("Hello.", "onyx").samples)
    assert speaker.speak("Hallo.", "de+klatt").seconds > 0.2  # any of espeak-ng's voices, and its variants
    for wrong in ("no-such-voice", "en; rm -rf /"):
        with pytest.raises(UserError, match=f"There is no voice '{re.escape(wrong)}'; give one of alloy"):
            speaker.speak("Hello.", wrong)
    for kind in ("wav", "mp3", "flac", "opus"):
        assert read_clip(encoded(slow, kind), f"speech.{kind}", 20).seconds == pytest.approx(slow.seconds, abs=0.1)


def test_the_speaker_flags_each_say_what_they_give(folders, monkeypatch):
    assert voice_of(None, None).speaker.name == "espeak-ng" and voice_of(None, "off").speaker is None
    assert isinstance(voice_of(None, str(folders.vits)).speaker, TransformersSpeaker)
    with pytest.raises(UserError, match="--tts_model .* has no config.json"):
        voice_of(None, str(folders.question.parent))

    def missing():
        raise UserError(NO_ESPEAK)

    monkeypatch.setattr("local_chat.voice.espeak._library", missing)
    quiet = voice_of(None, None)  # the default: speech out off, said once in the terminal
    assert not quiet.speaks and quiet.note == "Speech out is off: " + NO_ESPEAK
    with pytest.raises(UserError, match="espeak-ng is not installed; install the voice extra"):
        voice_of(None, "espeak-ng")  # asked for by name: the app does not start without it


def test_a_vits_folder_speaks_as_its_model_does(folders):
    import torch
    from transformers import VitsModel, VitsTokenizer

    speaker = TransformersSpeaker(str(folders.vits))
    torch.manual_seed(0)
    ours = speaker.speak("hello there, how are you?")
    model, tokenizer = VitsModel.from_pretrained(folders.vits), VitsTokenizer.from_pretrained(folders.vits)
    torch.manual_seed(0)
    with torch.inference_mode():
        theirs = model(**tokenizer("hello there, how are you?", return_tensors="pt")).waveform[0].numpy()
    assert ours.rate == 16_000 and ours.seconds > 0.1 and np.allclose(ours.samples, theirs)
    with pytest.raises(UserError, match="has no config.json"):
        TransformersSpeaker(str(folders.question.parent))


@pytest.fixture(scope="module")
def kokoro_folders(tmp_path_factory):
    """A tiny random Kokoro folder (voices af_heart, af_alloy, ef_dora), and one of its Spanish voice alone."""
    pytest.importorskip("kokoro")
    from fixtures.voice_models import build_kokoro

    root = tmp_path_factory.mktemp("kokoro")
    every, spanish = build_kokoro(root / "Kokoro-82M"), root / "Kokoro-es"
    (spanish / "voices").mkdir(parents=True)
    for name in ("config.json", "kokoro-v1_0.pth", "voices/ef_dora.pt"):
        (spanish / name).hardlink_to(every / name)
    return SimpleNamespace(every=every, spanish=spanish)


def test_a_kokoro_folder_speaks_as_the_kokoro_package_does(kokoro_folders):
    import torch
    from kokoro import KModel, KPipeline

    folder, text = kokoro_folders.spanish, "Hola, ¿cómo estás? Muy bien, gracias."
    speaker = voice_of(None, str(folder)).speaker
    assert isinstance(speaker, KokoroSpeaker) and speaker.default == "ef_dora"
    torch.manual_seed(0)
    ours = speaker.speak(text, "alloy")  # an OpenAI name the folder has no voice for: its default
    model = KModel(repo_id="hexgrad/Kokoro-82M", config=str(folder / "config.json"),
                   model=str(folder / "kokoro-v1_0.pth")).eval()  # fmt: skip
    torch.manual_seed(0)
    with torch.inference_mode():
        pipeline = KPipeline(lang_code="e", repo_id="hexgrad/Kokoro-82M", model=model)
        theirs = np.concatenate([r.audio.numpy() for r in pipeline(text, voice=str(folder / "voices/ef_dora.pt"))])
    assert ours.rate == 24_000 and ours.seconds > 0.1 and np.allclose(ours.samples, theirs)
    assert speaker.speak(text, "ef_dora", 0.5).seconds > 1.5 * speaker.speak(text, "ef_dora", 2.0).seconds
    with pytest.raises(UserError, match=r"There is no voice 'bob'; give one of ef_dora \(the folder's voices/\)"):
        speaker.speak("Hola.", "bob")


def test_kokoro_names_what_it_lacks_in_one_sentence(kokoro_folders, tmp_path, monkeypatch):
    import spacy.util

    if spacy.util.is_package("en_core_web_sm"):  # English voices speak, an OpenAI name finds its voice
        speaker = voice_of(None, str(kokoro_folders.every)).speaker
        assert speaker.voice_named("alloy") == "af_alloy" and speaker.speak("Hello there.").seconds > 0.1
    else:  # the page's English voice cannot speak: said at start-up, with the command that mends it
        with pytest.raises(UserError, match="English voices need spaCy's en_core_web_sm; run `python -m spacy"):
            voice_of(None, str(kokoro_folders.every))
    (tmp_path / "config.json").hardlink_to(kokoro_folders.every / "config.json")
    with pytest.raises(UserError, match="has no .pth weights; give the whole Kokoro folder"):
        voice_of(None, str(tmp_path))
    monkeypatch.setitem(sys.modules, "kokoro", None)
    with pytest.raises(UserError, match="is a Kokoro folder, and the kokoro package is not installed; install the"):
        voice_of(None, str(kokoro_folders.spanish))


def spoken_updates(tab: ChatTab, text: str, speak: bool = True) -> list:
    """Every update of the chat tab's Send as the page runs it (`on_page`), Speak answers on."""
    settings = ChatSettings(None, None, "default", None, "padded_resize", 64, 0.0, 0.75, 0, 1.0, speak_answers=speak)
    request = SimpleNamespace(session_hash="tab", username=None)

    async def run():
        return [update async for update in tab.on_page(tab.submit)(request, {"text": text, "files": []}, [], settings)]

    return asyncio.run(run())


def test_an_answer_is_spoken_sentence_by_sentence_the_first_before_it_ends(demo):
    """espeak-ng speaking the demo model's three-sentence answer: a clip per sentence, the first given while the
    answer still streams."""
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None), voice=voice_of(None, None))
    updates = spoken_updates(tab, "Who are you?")
    answer = answer_text(next(u.chat for u in reversed(updates) if isinstance(u.chat, list)))
    assert answer.startswith("I am the built-in demo model") and len(sentences_of(answer)) == 3
    spoken = [(i, u.speech) for i, u in enumerate(updates) if isinstance(u.speech, dict) and "round" in u.speech]
    assert [len(value["clips"]) for _, value in spoken] == [1, 2, 3]
    first_at = spoken[0][0]
    shown_then = answer_text(next(u.chat for u in reversed(updates[: first_at + 1]) if isinstance(u.chat, list)))
    assert len(shown_then) < len(answer)  # the answer still streamed when the first sentence was spoken
    assert all(v["clips"][0].startswith("data:audio/wav;base64,") for _, v in spoken)

    quiet = spoken_updates(tab, "Who are you?", speak=False)
    assert not any(isinstance(u.speech, dict) and "round" in u.speech for u in quiet)


def test_a_speaker_that_fails_is_one_warning_and_the_answer_is_untouched(demo, monkeypatch):
    class Failing:
        name = "broken"

        def speak(self, text, voice=None, speed=1.0):
            raise UserError("The voice broken failed (no sound card).")

    warned = []
    monkeypatch.setattr("gradio.Warning", lambda message, *args, **kwargs: warned.append(message))
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None), voice=Voice(None, Failing()))
    updates = spoken_updates(tab, "Who are you?")
    plain = spoken_updates(
        ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None)), "Who are you?"
    )
    last = [u.chat for u in updates if isinstance(u.chat, list)][-1]
    assert answer_text(last) == answer_text([u.chat for u in plain if isinstance(u.chat, list)][-1])
    assert warned == ["The voice broken failed (no sound card). The answer's text is as it was."]


# ----- /v1/audio -----


@pytest.fixture(scope="module")
def server(demo, transcriber):
    with serve(demo, voice=Voice(transcriber, Espeak())) as (url, counter):
        yield url


def test_v1_audio_speech_through_the_openai_client(server):
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="none")
    wav = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there. How are you?",
                                     response_format="wav").content  # fmt: skip
    whole = Espeak().speak("Hello there.").seconds + Espeak().speak("How are you?").seconds
    with wave.open(io.BytesIO(wav)) as file:
        assert file.getframerate() == 22_050
        assert len(file.readframes(2**31)) / 2 / 22_050 == pytest.approx(whole, abs=0.01)
    mp3 = client.audio.speech.create(model="tts-1", voice="nova", input="Hello there.").content  # mp3 by default
    assert read_clip(mp3, "speech.mp3", 20).seconds > 0.5
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="echo", input="One. Two. Three.", response_format="pcm"
    ) as response:
        pieces = list(response.iter_bytes())
    assert sum(map(len, pieces)) % 2 == 0 and sum(map(len, pieces)) > 24_000  # 24 kHz 16-bit, over half a second
    with pytest.raises(BadRequestError, match="`response_format` 'aac' is not offered"):
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", response_format="aac")
    with pytest.raises(BadRequestError, match="`speed` must be a number from 0.25 to 4.0"):
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", speed=9)
    with pytest.raises(BadRequestError, match="There is no voice 'no-such-voice'"):
        client.audio.speech.create(model="tts-1", voice="no-such-voice", input="Hi.")


def test_v1_audio_speech_as_server_sent_events(server):
    import base64
    import json

    import httpx

    body = {"model": "tts-1", "input": "One. Two.", "voice": "alloy", "response_format": "wav", "stream_format": "sse"}
    events = [json.loads(line[6:]) for line in httpx.post(server + "/v1/audio/speech", json=body).text.splitlines()
              if line.startswith("data: ")]  # fmt: skip
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.delta", "speech.audio.done"]
    assert read_clip(base64.b64decode(events[0]["audio"]), "one.wav", 20).seconds > 0.2


def test_v1_audio_transcriptions_through_the_openai_client(server, folders, transcriber):
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="none")
    expected = transcriber.transcribe(clip_of(folders.question))
    with folders.question.open("rb") as file:
        assert client.audio.transcriptions.create(model="whisper-1", file=file).text == expected
    with folders.question.open("rb") as file:
        assert (
            client.audio.transcriptions.create(model="whisper-1", file=file, response_format="text") == expected + "\n"
        )
    with folders.question.open("rb") as file:
        verbose = client.audio.transcriptions.create(model="whisper-1", file=file, response_format="verbose_json")
    assert verbose.text == expected and verbose.duration == pytest.approx(clip_of(folders.question).seconds, abs=0.01)
    with folders.question.open("rb") as file:
        srt = client.audio.transcriptions.create(model="whisper-1", file=file, response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:0") and expected in srt
    with pytest.raises(BadRequestError, match="cannot be read as sound"):
        client.audio.transcriptions.create(model="whisper-1", file=("notes.txt", b"not sound"))
    with folders.question.open("rb") as file:  # Whisper's translation into English
        english = client.audio.translations.create(model="whisper-1", file=file).text
    assert english == transcriber.transcribe(clip_of(folders.question), task="translate") != expected


def test_v1_audio_without_a_voice_says_so(demo):
    from openai import NotFoundError, OpenAI

    with serve(demo) as (url, _):
        client = OpenAI(base_url=url + "/v1", api_key="none")
        with pytest.raises(NotFoundError, match="start it with --stt_model DIR"):
            client.audio.transcriptions.create(model="whisper-1", file=("a.wav", b"RIFF"))
        with pytest.raises(NotFoundError, match="speaks no text"):
            client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.")


# ----- the page, in Chromium -----


@pytest.fixture(scope="module")
def browser(folders):
    from playwright.sync_api import sync_playwright
    from test_browser import ARTIFACTS, CHROMIUM

    ARTIFACTS.mkdir(exist_ok=True)
    fake_audio = [  # the microphone, fed from the spoken question; sound played without a click first
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={folders.question}",
        "--autoplay-policy=no-user-gesture-required",
    ]
    with sync_playwright() as p:
        executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox", *fake_audio])
        yield browser
        browser.close()


def speech_state(page) -> dict:
    return page.evaluate("() => ({...(document.querySelector('[data-speech]') || {dataset: {}}).dataset})")


def wait_for_speech(page, done, timeout=30.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if done(state := speech_state(page)):
            return state
        time.sleep(0.1)
    raise AssertionError(f"no such speech in {timeout} s: {speech_state(page)}")


def test_the_page_hears_a_recording_and_reads_answers_aloud(browser, demo, transcriber, folders):
    from test_browser import ARTIFACTS, READY, last_bot_text, send, wait_for_answer

    heard = []  # what the transcriber was given and gave

    class Recorded:
        name = transcriber.name

        def transcribe(self, clip, language=None, prompt=None):
            heard.append((clip, transcriber.transcribe(clip, language, prompt)))
            return heard[-1][1]

    with serve(demo, voice=Voice(Recorded(), Espeak()), delay=0.02) as (url, counter):
        page = browser.new_context(permissions=["microphone"]).new_page()
        page.goto(url)
        page.wait_for_selector(READY)
        page.get_by_label("Record audio").click()  # the microphone in the message box, fed from the WAV file
        page.get_by_label("Start recording").click()
        time.sleep(2.5)
        page.get_by_label("Stop recording").click()
        page.get_by_label("Attach audio").click()
        box = page.locator(".message textarea").first
        deadline = time.time() + 30
        while not box.input_value() and time.time() < deadline:
            time.sleep(0.1)
        ((clip, text),) = heard
        assert box.input_value() == text  # the transcript, in the box, to edit before Send
        assert 2 < clip.seconds < 4 and np.sqrt(np.mean(clip.samples**2)) > 0.01  # the recording, with its sound
        page.screenshot(path=str(ARTIFACTS / "voice-transcript.png"), full_page=True)
        assert page.locator(".message [data-testid='file-preview'], .message .thumbnail-item").count() == 0

        page.get_by_label("Speak answers").check()
        send(page, "Who are you?")
        wait_for_answer(page, lambda t: t.endswith("/path/to/checkpoint."))
        state = wait_for_speech(page, lambda s: s.get("played") == "3" and s.get("speech") == "idle")
        assert state["played"] == "3"  # a clip a sentence, one after the other, to the end
        page.screenshot(path=str(ARTIFACTS / "voice-spoken.png"), full_page=True)

        page.get_by_label("Speak answers").uncheck()
        send(page, QUESTION)
        assert wait_for_answer(page, lambda t: t.endswith("Paris.")) == "The capital of France is Paris."
        assert speech_state(page)["played"] == "3"  # not spoken: the switch is off
        page.get_by_label("Read aloud").last.click()
        wait_for_speech(page, lambda s: s.get("played") == "1" and s.get("speech") in ("playing", "idle"))
        assert last_bot_text(page) == "The capital of France is Paris."  # the button is not in the answer's text


def test_stop_silences_the_answer_being_spoken(browser, demo):
    from test_browser import READY, send, wait_for_answer

    with serve(demo, voice=Voice(None, Espeak()), delay=0.1) as (url, counter):
        page = browser.new_page()
        page.goto(url)
        page.wait_for_selector(READY)
        page.get_by_label("Speak answers").check()
        send(page, "Who are you?")
        wait_for_speech(page, lambda s: s.get("speech") == "playing")
        wait_for_answer(page, lambda t: len(t) > 40)
        page.get_by_role("button", name="Stop", exact=True).first.click()
        state = wait_for_speech(page, lambda s: s.get("speech") == "stopped", timeout=5)
        time.sleep(1.5)
        assert speech_state(page)["speech"] == "stopped" and state["played"] == "0"
