"""Voice: the time from an answer's first sentence to its first audio on the page (the chat tab's Send as the page runs
it, Speak answers on, espeak-ng, the demo model: from the update whose answer first holds a whole sentence to the
update that carries its clip), beside espeak-ng speaking that sentence alone; and transcription's real-time factor
(seconds to transcribe over the recording's seconds) for a random Whisper of openai/whisper-tiny's shape (30 s
window, fixtures/voice_models.py), ours beside transformers' own pipeline on the same clip, both greedy (and the
pipeline's default, five beams), medians of interleaved repeats.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

QUESTION = "Who are you?"  # the demo model's answer: three sentences


def run(settings, demo) -> dict[str, float]:
    repeats = max(3, settings.api_repeats)
    results = _first_sentence_to_audio(demo, repeats)
    results.update(_transcription(repeats, settings.voice_whisper_tiny))
    return results


def _first_sentence_to_audio(demo, repeats: int) -> dict[str, float]:
    from local_chat.ui.chat import Cancels
    from local_chat.ui.chat_settings import ChatSettings
    from local_chat.ui.chat_tab import ChatTab
    from local_chat.ui.history import SavedChats
    from local_chat.ui.voice import answer_text
    from local_chat.voice import sentences_of, voice_of
    from local_chat.voice.speech import Sentences

    voice = voice_of(None, None)
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None), voice=voice)
    settings = ChatSettings(None, None, "default", None, "padded_resize", 64, 0.0, 0.75, 0, 1.0, speak_answers=True)
    sessions = iter(range(10**6))

    async def one() -> tuple[float, str]:
        request = SimpleNamespace(session_hash=f"v{next(sessions)}", username=None)
        sentence_at = first = None
        async for update in tab.on_page(tab.submit)(request, {"text": QUESTION, "files": []}, [], settings):
            now = time.perf_counter()
            if sentence_at is None and isinstance(update.chat, list):
                if found := Sentences().more(answer_text(update.chat)):
                    sentence_at, first = now, found[0]
            if isinstance(update.speech, dict) and update.speech.get("clips"):
                return now - sentence_at, first
        raise AssertionError("the answer was not spoken")

    waits, alone = [], []
    for round_ in range(repeats + 1):
        wait, sentence = asyncio.run(one())
        started = time.perf_counter()
        voice.speaker.speak(sentence)
        if round_:  # the first round warms up
            waits.append(wait)
            alone.append(time.perf_counter() - started)
    assert len(sentences_of(sentence)) == 1
    return {
        "voice_first_sentence_to_audio_ms": statistics.median(waits) * 1000,
        "voice_espeak_sentence_ms": statistics.median(alone) * 1000,
    }


def _transcription(repeats: int, tiny_shape: bool) -> dict[str, float]:
    from transformers import pipeline

    from fixtures.voice_models import WHISPER_TINY, build_whisper, spoken_wav
    from local_chat.voice.clips import read_clip, resampled
    from local_chat.voice.transcribe import Transcriber

    with tempfile.TemporaryDirectory() as folder:
        whisper = build_whisper(Path(folder, "whisper"), window_s=30, **(WHISPER_TINY if tiny_shape else {}))
        wav = spoken_wav("What is the capital of France? Tell me about its history, please.", Path(folder, "q.wav"))
        clip = read_clip(wav.read_bytes(), wav.name, 20)
        ours = Transcriber(str(whisper))
        theirs = pipeline("automatic-speech-recognition", model=str(whisper), device="cpu")
        raw = {"raw": resampled(clip, 16_000).samples, "sampling_rate": 16_000}
        runs = {
            "ours": lambda: ours.transcribe(clip),
            "pipeline": lambda: theirs(dict(raw), generate_kwargs={"num_beams": 1, "task": "transcribe"})["text"],
            "pipeline_default": lambda: theirs(dict(raw))["text"],
        }
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for round_ in range(repeats + 1):
            for name in list(runs)[round_ % 2 :] + list(runs)[: round_ % 2]:
                started = time.perf_counter()
                runs[name]()
                if round_:
                    seconds[name].append(time.perf_counter() - started)
        assert ours.transcribe(clip) == runs["pipeline"]().strip()  # the same work: the same text
    took = {name: statistics.median(times) for name, times in seconds.items()}
    return {
        "voice_whisper_tiny_rtf": took["ours"] / clip.seconds,
        "voice_pipeline_whisper_tiny_rtf": took["pipeline"] / clip.seconds,
        "voice_transcribe_over_pipeline": took["pipeline"] / took["ours"],
        "voice_transcribe_over_pipeline_default": took["pipeline_default"] / took["ours"],
    }
