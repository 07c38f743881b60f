"""Kokoro (`--tts_model DIR`, a folder of hexgrad/Kokoro-82M: config.json, its .pth weights and voices/*.pt) spoken
through the kokoro package: its `KModel` and, per language, its `KPipeline` (misaki's phonemes), on the CPU of the web
server's process. A voice's first letter is its language (af_heart: American English, ef_dora: Spanish); English
needs spaCy's en_core_web_sm, which is named rather than fetched behind the user's back."""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path

import numpy as np

from local_chat.errors import UserError, described

from .clips import Clip
from .espeak import OPENAI_VOICES

KOKORO_RATE = 24_000
DEFAULT_VOICE = "af_heart"  # Kokoro's own first choice
ENGLISH = "ab"  # the language letters misaki's English G2P serves (American, British)
SPACY_ENGLISH = "en_core_web_sm"


def is_kokoro_folder(folder: str) -> bool:
    """Whether `folder` is a Kokoro checkpoint: its config.json has the iSTFTNet decoder's settings."""
    try:
        return "istftnet" in json.loads(Path(folder, "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


class KokoroSpeaker:
    """A Kokoro folder's voices (each voices/NAME.pt), the default (the page's) af_heart where the folder has it, else
    its first."""

    def __init__(self, folder: str):
        try:
            from kokoro import KModel
        except ImportError:
            raise UserError(
                f"--tts_model {folder} is a Kokoro folder, and the kokoro package is not installed; install the "
                "kokoro extra (pip install -e '.[kokoro]')."
            ) from None
        weights = sorted(Path(folder).glob("*.pth"))
        self.voices = {path.stem: path for path in sorted(Path(folder, "voices").glob("*.pt"))}
        if not weights or not self.voices:
            raise UserError(
                f"--tts_model {folder} has no {'.pth weights' if not weights else 'voices/*.pt'}; give the whole "
                "Kokoro folder (hexgrad/Kokoro-82M: config.json, kokoro-v1_0.pth, voices/)."
            )
        try:
            with warnings.catch_warnings():  # torch's about the package's own modules (weight_norm, one LSTM layer)
                warnings.simplefilter("ignore", (UserWarning, FutureWarning))
                self.model = KModel(repo_id="hexgrad/Kokoro-82M", config=str(Path(folder, "config.json")),
                                    model=str(weights[0])).eval()  # fmt: skip
        except (OSError, ValueError, KeyError, RuntimeError) as error:
            raise UserError(f"--tts_model {folder} cannot be loaded as Kokoro ({described(error)}).") from None
        self.name = Path(folder).name
        self.default = DEFAULT_VOICE if DEFAULT_VOICE in self.voices else next(iter(self.voices))
        self._pipelines, self._lock = {}, threading.Lock()
        self._pipeline(self.default[0])  # the page's voice: what it lacks is said at start-up, not at each answer

    def voice_named(self, voice: str | None) -> str:
        """The folder's voice for `voice`: its own name, an OpenAI name a voice of the folder ends with (alloy:
        af_alloy), else (None or another OpenAI name) the default."""
        if voice is None or voice in self.voices:
            return voice or self.default
        ending = next((name for name in self.voices if name.endswith("_" + voice)), None)
        if ending is not None:
            return ending
        if voice in OPENAI_VOICES:
            return self.default
        raise UserError(f"There is no voice {voice!r}; give one of {', '.join(self.voices)} (the folder's voices/).")

    def _pipeline(self, language: str):
        """The kokoro package's pipeline of one language (made once; English's needs spaCy's English model)."""
        if language not in self._pipelines:
            import spacy.util
            from kokoro import KPipeline

            if language in ENGLISH and not spacy.util.is_package(SPACY_ENGLISH):
                raise UserError(
                    f"Kokoro's English voices need spaCy's {SPACY_ENGLISH}; run `python -m spacy download "
                    f"{SPACY_ENGLISH}` once, or ask for a voice of another language ({self._other_voices()})."
                )
            self._pipelines[language] = KPipeline(lang_code=language, repo_id="hexgrad/Kokoro-82M", model=self.model)
        return self._pipelines[language]

    def _other_voices(self) -> str:
        return ", ".join(name for name in self.voices if name[0] not in ENGLISH) or "none in this folder"

    def speak(self, text: str, voice: str | None = None, speed: float = 1.0) -> Clip:
        import torch

        name = self.voice_named(voice)
        with self._lock, torch.inference_mode():
            pipeline = self._pipeline(name[0])
            try:
                pieces = [r.audio for r in pipeline(text, voice=str(self.voices[name]), speed=speed)]
            except (RuntimeError, ValueError, IndexError) as error:
                raise UserError(f"The voice {name} failed ({described(error)}).") from None
        pieces = [piece.float().numpy() for piece in pieces if piece is not None]
        if not pieces:
            raise UserError(f"The voice {name} has no sounds for this text; give text in its language.")
        return Clip(np.concatenate(pieces), KOKORO_RATE)
