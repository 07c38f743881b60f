"""Speech out: text spoken by a `Speaker`, an answer sentence by sentence as it streams.

- `Espeak` (voice/espeak.py): espeak-ng, which needs no weights, the default.
- `TransformersSpeaker`: `--tts_model DIR`, a transformers text-to-speech folder (VITS, as Meta's MMS-TTS voices),
  run on the CPU of the web server's process.
- `KokoroSpeaker` (voice/kokoro.py): `--tts_model DIR`, a Kokoro folder, through the kokoro package.
- `Sentences` cuts a text that grows piece by piece (an answer streaming) into sentences as each one ends, with the
  markdown that is not spoken taken out; `SpokenAnswer` speaks them on a thread of its own while the answer goes on.

A speaker that fails raises a `UserError` (one sentence); the text it was given is never touched.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from local_chat.errors import UserError, described

from .clips import Clip
from .espeak import ESPEAK, Espeak
from .kokoro import KokoroSpeaker, is_kokoro_folder

MAX_SPOKEN_CHARS = 4096  # OpenAI's limit on /v1/audio/speech's input
_SENTENCE_END = re.compile(r"(?<=[.!?…。！？])[\"'”’)\]]*\s+|\n+")
_NOT_AN_END = re.compile(r"(?:^|\s)(?:[A-Za-z]|\d+|e\.g|i\.e|etc|vs|Mr|Mrs|Ms|Dr|St|No)\.$")
_CODE_BLOCK = re.compile(r"```.*?```", re.S)
_UNSPOKEN = [
    (re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),  # links and images: their text
    (re.compile(r"(\*\*|__|[*`~])"), ""),  # emphasis, code
    (re.compile(r"[#>|]+"), " "),  # headings, quotes, tables
    (re.compile(r"^\s*[-+]\s+", re.M), ""),  # list bullets
    (re.compile(r"\s+"), " "),
]


def spoken(text: str) -> str:
    """`text` as it is read aloud: markdown's marks and code blocks left out."""
    for pattern, replacement in _UNSPOKEN:
        text = pattern.sub(replacement, text)
    return text.strip()


class Sentences:
    """The sentences of a text given whole each time, growing (an answer as it streams): `more(text)` gives the
    sentences that ended since the last call, `rest(text)` the last one once the text is complete."""

    def __init__(self):
        self.done = 0  # characters of the text already given as sentences

    def more(self, text: str) -> list[str]:
        text, found = _readable(text), []
        for end in _SENTENCE_END.finditer(text, self.done):
            piece = text[self.done : end.start()]
            if piece.strip() and _NOT_AN_END.search(piece.strip()) and "\n" not in end.group():
                continue  # "e.g. ", "1. ", "Dr. ": the sentence goes on
            self.done = end.end()
            if sentence := spoken(piece):
                found.append(sentence)
        return found

    def rest(self, text: str) -> list[str]:
        found, text = self.more(text), _readable(text)
        last, self.done = spoken(text[self.done :]), len(text)
        return found + ([last] if last else [])


def _readable(text: str) -> str:
    """`text` with its code blocks blanked out (their length kept, so places in it stay), up to a block still open."""
    text = _CODE_BLOCK.sub(lambda block: "\n" + " " * (len(block.group()) - 1), text)
    return text.split("```", 1)[0]


def sentences_of(text: str) -> list[str]:
    return Sentences().rest(text)


class TransformersSpeaker:
    """A transformers text-to-waveform folder (`--tts_model DIR`: VITS, such as facebook/mms-tts-eng): one voice."""

    def __init__(self, folder: str):
        if not Path(folder, "config.json").is_file():
            raise UserError(
                f"--tts_model {folder} has no config.json; give a transformers text-to-speech folder (VITS)."
            )
        from transformers import AutoModelForTextToWaveform, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder)
            self.model = AutoModelForTextToWaveform.from_pretrained(folder).eval()
        except (OSError, ValueError, KeyError) as error:
            raise UserError(
                f"--tts_model {folder} cannot be loaded ({described(error)}); give a VITS folder."
            ) from None
        self.name = Path(folder).name
        self._lock = threading.Lock()

    def speak(self, text: str, voice: str | None = None, speed: float = 1.0) -> Clip:
        import torch

        inputs = self.tokenizer(text, return_tensors="pt")
        if inputs["input_ids"].shape[-1] == 0:
            raise UserError(f"The voice {self.name} has no sounds for this text; give text in its language.")
        with self._lock, torch.inference_mode():
            before, self.model.speaking_rate = getattr(self.model, "speaking_rate", 1.0), speed
            try:
                waveform = self.model(**inputs).waveform[0]
            except RuntimeError as error:
                raise UserError(f"The voice {self.name} failed ({described(error)}).") from None
            finally:
                self.model.speaking_rate = before
        return Clip(waveform.float().numpy(), self.model.config.sampling_rate)


def speaker_of(tts_model: str | None):
    """--tts_model's speaker: a folder, espeak-ng (the default), or none ("off")."""
    if tts_model in (None, ESPEAK):
        return Espeak()
    if tts_model == "off":
        return None
    if is_kokoro_folder(tts_model):
        return KokoroSpeaker(tts_model)
    return TransformersSpeaker(tts_model)


class SpokenAnswer:
    """An answer spoken as it streams: `hear(text)` with the answer so far (its sentences that ended go to the
    speaker, one at a time, on a thread of its own), `ready()` the clips spoken so far, in order; `end(text)` with
    the whole answer speaks its last sentence. `close()` drops what is left (Stop)."""

    def __init__(self, speaker, voice: str | None = None, speed: float = 1.0):
        self.speaker, self.voice, self.speed = speaker, voice, speed
        self.sentences = Sentences()
        self.pending: list[Future] = []
        self.failure: str | None = None
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speech")

    def _say(self, sentences: list[str]) -> None:
        for sentence in sentences:
            self.pending.append(self.worker.submit(self.speaker.speak, sentence, self.voice, self.speed))

    def hear(self, text: str) -> None:
        self._say(self.sentences.more(text))

    def end(self, text: str) -> None:
        self._say(self.sentences.rest(text))

    def ready(self) -> list[Clip]:
        """The clips of the sentences spoken so far, in order, up to the first not yet spoken or failed (then
        `failure` holds its sentence)."""
        clips = []
        for future in self.pending:
            if not future.done():
                break
            if (error := future.exception()) is not None:
                self.failure = str(error) if isinstance(error, UserError) else f"Speech failed ({described(error)})."
                break
            clips.append(future.result())
        return clips

    def close(self) -> None:
        for future in self.pending:
            future.cancel()
        self.worker.shutdown(wait=False)
