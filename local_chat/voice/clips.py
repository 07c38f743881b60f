"""Sound clips: a recording or an upload read into samples and checked (its size, length and format, one sentence
each, as images are), resampled, and speech written out in the formats of OpenAI's /v1/audio/speech. soundfile
(libsndfile) reads and writes WAV, FLAC, Ogg (Vorbis, Opus) and MP3; soxr resamples. Both are the `voice` extra."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from local_chat.errors import UserError

MAX_CLIP_SECONDS = 600.0  # a recording or an upload to transcribe, or to give a model that hears
READ_FORMATS = "WAV, FLAC, MP3 or Ogg"
SOUND_SUFFIXES = (".wav", ".mp3", ".flac", ".ogg", ".oga", ".opus")  # a file the message box takes as a recording
PCM_RATE = 24_000  # OpenAI's `pcm`: 24 kHz, 16-bit signed little-endian, mono, no header
# /v1/audio/speech's `response_format`s, with their media types (OpenAI's aac is not offered: libsndfile has no AAC)
MEDIA_TYPES = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
    "opus": "audio/ogg",
    "pcm": "audio/pcm",
}
_WRITTEN = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
            "opus": ("OGG", "OPUS")}  # fmt: skip
_OPUS_RATES = (8_000, 12_000, 16_000, 24_000, 48_000)


@dataclass(frozen=True)
class Clip:
    """Mono samples in [-1, 1] (float32) and their rate."""

    samples: np.ndarray
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate if self.rate else 0.0


def is_sound_file(path: str) -> bool:
    """Whether a file attached to a message is a recording, by its name."""
    return str(path).lower().endswith(SOUND_SUFFIXES)


def _soundfile():
    try:
        import soundfile
    except ImportError:
        raise UserError('Sound needs the voice extra; install it (pip install -e ".[voice]").') from None
    return soundfile


def read_clip(data: bytes, name: str, max_mb: float, max_seconds: float = MAX_CLIP_SECONDS) -> Clip:
    """The clip a file holds, mono: a `UserError` naming the file where it is too big, too long, empty or not
    sound this reads."""
    if len(data) > max_mb * 1e6:
        raise UserError(
            f"The recording {name} is {len(data) / 1e6:.1f} MB, over the {max_mb:g} MB limit; send a shorter one."
        )
    soundfile = _soundfile()
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as sound:
            seconds = sound.frames / sound.samplerate
            if seconds > max_seconds:
                raise UserError(
                    f"The recording {name} lasts {seconds:.0f} s, over the {max_seconds:g} s limit; send a shorter one."
                )
            samples = sound.read(dtype="float32", always_2d=True)
            rate = sound.samplerate
    except soundfile.LibsndfileError as error:  # "Error opening <_io.BytesIO ...>: Format not recognised."
        why = str(error).rsplit(": ", 1)[-1].strip().rstrip(".")
        raise UserError(f"The file {name} cannot be read as sound ({why}); send {READ_FORMATS}.") from None
    if not len(samples):
        raise UserError(f"The recording {name} is empty; record again.")
    return Clip(samples.mean(axis=1), rate)


def read_clip_file(path, max_mb: float) -> Clip:
    """`read_clip` of an attached file, named by its file name."""
    return read_clip(Path(path).read_bytes(), Path(path).name, max_mb)


def resampled(clip: Clip, rate: int) -> Clip:
    if clip.rate == rate:
        return clip
    import soxr

    return Clip(soxr.resample(clip.samples, clip.rate, rate).astype(np.float32), rate)


def joined(clips: list[Clip]) -> Clip:
    """One clip of `clips` one after the other, at the first's rate."""
    rate = clips[0].rate
    return Clip(np.concatenate([resampled(clip, rate).samples for clip in clips]), rate)


def pcm16(clip: Clip) -> bytes:
    """16-bit samples, scaled as soundfile reads them (x 32768), so that a clip read from a 16-bit file is written
    back to the same bytes."""
    return np.clip(np.round(clip.samples * 32768), -32768, 32767).astype("<i2").tobytes()


def wav_bytes(clip: Clip) -> bytes:
    """`clip` as a 16-bit WAV file (the standard library's writer: no extra needed)."""
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(clip.rate)
        file.writeframes(pcm16(clip))
    return out.getvalue()


def encoded(clip: Clip, response_format: str) -> bytes:
    """`clip` in one of `MEDIA_TYPES`' formats."""
    if response_format == "wav":
        return wav_bytes(clip)
    if response_format == "pcm":
        return pcm16(resampled(clip, PCM_RATE))
    if response_format == "opus" and clip.rate not in _OPUS_RATES:
        clip = resampled(clip, 48_000)
    kind, subtype = _WRITTEN[response_format]
    out = io.BytesIO()
    _soundfile().write(out, clip.samples, clip.rate, format=kind, subtype=subtype)
    return out.getvalue()
