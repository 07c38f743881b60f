"""Voice: speech in (`--stt_model`, transcribe.py), speech out (`--tts_model`, espeak-ng by default, speech.py), and
the sound clips both read and write (clips.py). The page and /v1/audio use one `Voice`."""

from __future__ import annotations

from dataclasses import dataclass

from .espeak import ESPEAK
from .speech import SpokenAnswer, sentences_of

__all__ = ["ESPEAK", "SpokenAnswer", "Voice", "sentences_of", "voice_of"]


@dataclass(frozen=True)
class Voice:
    """What the app hears and speaks with: a `Transcriber` (or None: no speech in) and a speaker (`Espeak`,
    `TransformersSpeaker`, or None: no speech out); `note`, where speech out is off though it was not asked off."""

    transcriber: object | None = None
    speaker: object | None = None
    note: str | None = None

    @property
    def hears(self) -> bool:
        return self.transcriber is not None

    @property
    def speaks(self) -> bool:
        return self.speaker is not None


def voice_of(stt_model: str | None, tts_model: str | None) -> Voice:
    """--stt_model's and --tts_model's voice, loaded: a folder that does not load is a `UserError`; espeak-ng, the
    default speaker, missing leaves speech out off with a `note`."""
    from local_chat.errors import UserError

    from .speech import speaker_of

    transcriber = None
    if stt_model:
        from .transcribe import Transcriber

        transcriber = Transcriber(stt_model)
    try:
        speaker = speaker_of(tts_model)
    except UserError as error:
        if tts_model is not None:  # asked for by name
            raise
        return Voice(transcriber, None, f"Speech out is off: {error}")
    return Voice(transcriber, speaker)
