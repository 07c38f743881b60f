"""Voice on the page (voice/ does the work): the message box's microphone, whose recording becomes text in the box
(--stt_model; the user edits it before Send), the Speak answers switch (each answer spoken sentence by sentence while
it streams), and a read-aloud button under each answer.

The clips reach the browser as the value of one `gr.HTML` (`SPEECH_JS`): {"round", "clips"}, the clips as WAV data
addresses, in order. The script plays a round's clips one after the other, drops them when a new round comes, stops
with Stop or Escape, and draws the read-aloud buttons, whose click sends the answer's text back ("read" event).
"""

from __future__ import annotations

import asyncio
import base64
import secrets

import gradio as gr

from local_chat.errors import UserError
from local_chat.history.kinds import Kind
from local_chat.voice import SpokenAnswer, Voice
from local_chat.voice.clips import Clip, is_sound_file, read_clip_file, wav_bytes

from .chat_settings import message_parts, taken_out
from .layout import static_text
from .turns import kind_of
from .wiring import UI_ONLY

SPEECH_JS = static_text("speech.js")
SILENT = {"round": None, "clips": []}
MAX_READ_CHARS = 20_000  # what one read-aloud click speaks


def clip_address(clip: Clip) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav_bytes(clip)).decode()


def answer_text(entries: list[dict]) -> str:
    """The text of the answers after the last question (an answer's parts around its tool calls, one after the
    other): what Speak answers reads."""
    texts: list[str] = []
    for entry in entries:
        kind = kind_of(entry)
        if kind == Kind.QUESTION:
            texts = []
        elif kind == Kind.ANSWER and isinstance(entry.get("content"), str):
            texts.append(entry["content"])
    return "\n\n".join(texts)


class AnswerSpeech:
    """One answer spoken as it streams: `heard(entries)` with the chat as shown gives the speech component's next
    value (or `gr.skip()` while no new sentence was spoken), `rest(entries)` the values until the last sentence is
    spoken; a speaker's failure is one warning, the text untouched."""

    def __init__(self, speaker):
        self.spoken = SpokenAnswer(speaker)
        self.round, self.given, self.warned = secrets.token_hex(6), 0, False
        self.addresses: list[str] = []

    def _value(self):
        clips = self.spoken.ready()
        if self.spoken.failure and not self.warned:
            self.warned = True
            gr.Warning(self.spoken.failure + " The answer's text is as it was.")
        if len(clips) == self.given:
            return gr.skip()
        self.addresses += [clip_address(clip) for clip in clips[self.given :]]  # each clip encoded once
        self.given = len(clips)
        return {"round": self.round, "clips": list(self.addresses)}  # Gradio sends the page the clips added

    def heard(self, entries: list[dict]):
        self.spoken.hear(answer_text(entries))
        return self._value()

    async def rest(self, entries: list[dict]):
        """Each value once the sentence after the last given is spoken (the answer has ended)."""
        self.spoken.end(answer_text(entries))
        while self.given < len(self.spoken.pending) and not self.spoken.failure:
            await asyncio.wait([asyncio.wrap_future(self.spoken.pending[self.given])])
            value = self._value()
            if "round" in value:
                yield value

    def close(self) -> None:
        self.spoken.close()


class PageVoice:
    """The chat tab's voice controls over `voice` (the app's `Voice`); `max_upload_mb`: a recording's cap."""

    def __init__(self, voice: Voice, max_upload_mb: float):
        self.voice, self.max_upload_mb = voice, max_upload_mb
        self.model_hears = lambda model: False  # once wired: whether the chosen model takes recordings itself

    def build(self):
        """(the speech component, the Speak answers switch): placeholders where the app speaks nothing."""
        if not self.voice.speaks:
            return gr.State(None), gr.State(False)
        speech = gr.HTML(SILENT, html_template="", js_on_load=SPEECH_JS, visible="hidden", elem_classes="speech")
        switch = gr.Checkbox(False, label="Speak answers", elem_classes="speak-switch")
        return speech, switch

    def answer_speech(self, speak: bool) -> AnswerSpeech | None:
        return AnswerSpeech(self.voice.speaker) if speak and self.voice.speaks else None

    def wire(self, box, speech, model, model_hears) -> None:
        """`model`: the page's model picker (a placeholder without one); `model_hears(name)`: whether that model takes
        recordings itself (they stay attached, to go to it as sound, rather than become text)."""
        self.model_hears = model_hears
        if self.voice.hears:  # a recording, or an audio file attached: its text in the box
            box.change(self.transcribed, [box, model], box, show_progress="hidden", api_visibility=UI_ONLY)
        if self.voice.speaks:
            speech.read(self.read_aloud, speech, speech, show_progress="hidden", api_visibility=UI_ONLY)

    async def transcribed(self, message, model=None):
        """The message box with its recordings' text after what was typed, the recordings taken out (one that cannot
        be heard: taken out too, with a warning that says why; the text stays); for a model that hears, as it was."""
        typed, files = message_parts(message)
        recordings = [path for path in files if is_sound_file(path)]
        if not recordings or self.model_hears(model):
            return gr.skip()
        heard, failed = [], []
        for path in recordings:
            try:
                heard.append(await asyncio.to_thread(self._heard, path))
            except UserError as error:
                failed.append(str(error))
        if failed:
            gr.Warning(taken_out(failed))
        text = " ".join(part for part in [typed.rstrip(), *heard] if part)
        return {"text": text, "files": [path for path in files if path not in recordings]}

    def _heard(self, path: str) -> str:
        """The recording's text: read, checked and transcribed (on a thread: it takes a while)."""
        clip = read_clip_file(path, self.max_upload_mb)
        return self.voice.transcriber.transcribe(clip)

    async def read_aloud(self, value):
        """The text the read-aloud button sent, spoken sentence by sentence: a value for each clip."""
        text = ((value or {}).get("read") or "")[:MAX_READ_CHARS]
        speech = AnswerSpeech(self.voice.speaker)
        try:
            async for shown in speech.rest([{"role": "assistant", "content": text}]):
                yield shown
        finally:
            speech.close()
