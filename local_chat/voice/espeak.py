"""`Espeak`: the speaker that needs no weights, espeak-ng's C library called in this process through ctypes: the
library and its data from the espeakng-loader wheel (the voice extra: no system package needed), else the system's
(Debian's `apt-get install -y espeak-ng`). One lock: the library holds one voice and one output at a time."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

import numpy as np

from local_chat.errors import UserError

from .clips import Clip

ESPEAK = "espeak-ng"
ESPEAK_WPM = 175  # espeak-ng's own default speed, OpenAI's `speed` 1.0
# OpenAI's voice names, each one of espeak-ng's English voices (any espeak-ng voice name is taken as it is)
OPENAI_VOICES = {
    "alloy": "en-us", "ash": "en-us+m3", "ballad": "en-gb+m4", "coral": "en-us+f2", "echo": "en-us+m2",
    "fable": "en-gb", "nova": "en-us+f3", "onyx": "en-us+m7", "sage": "en-us+f4", "shimmer": "en-us+f5",
    "verse": "en-us+m5", "marin": "en-us+f1", "cedar": "en-us+m1",
}  # fmt: skip
_SYNCHRONOUS, _RATE, _CHARS_UTF8, _POS_CHARACTER = 2, 1, 1, 1  # speak_lib.h's values
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class _Voice(ctypes.Structure):  # speak_lib.h's espeak_VOICE
    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_void_p), ("identifier", ctypes.c_char_p),
                ("gender", ctypes.c_ubyte), ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte),
                ("xx1", ctypes.c_ubyte), ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]  # fmt: skip


def _languages(voice: _Voice) -> list[str]:
    """A voice's languages: (priority byte, name, NUL) after one another, ending with a NUL."""
    raw, found, at = ctypes.string_at(voice.languages, 256), [], 0
    while at < len(raw) and raw[at] != 0:
        end = raw.index(b"\0", at + 1)
        found.append(raw[at + 1 : end].decode(errors="replace").lower())
        at = end + 1
    return found


NO_ESPEAK = (
    f'{ESPEAK} is not installed; install the voice extra (pip install -e ".[voice]") or Debian\'s package '
    f"(apt-get install -y {ESPEAK}), or give --tts_model DIR."
)


def _library() -> tuple[ctypes.CDLL, bytes | None]:
    """espeak-ng's library and the folder of its data (None: the library's own default)."""
    try:
        import espeakng_loader

        return ctypes.CDLL(espeakng_loader.get_library_path()), espeakng_loader.get_data_path().encode()
    except (ImportError, OSError):
        found = ctypes.util.find_library("espeak-ng")
        if found is None:
            raise UserError(NO_ESPEAK) from None
        return ctypes.CDLL(found), None


class Espeak:
    """espeak-ng: any of its voices (`espeak-ng --voices`: de, en-us, ...; a variant after "+", en-us+f3), or OpenAI's
    names for a few English ones."""

    name = ESPEAK
    _lock = threading.Lock()  # one library per process: every `Espeak` shares it

    def __init__(self):
        self.lib, data = _library()
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.rate = self.lib.espeak_Initialize(_SYNCHRONOUS, 0, data, 0)
        if self.rate <= 0:
            raise UserError(f"{ESPEAK} could not start (its data is missing); reinstall it or give --tts_model DIR.")
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                          ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
        self.named = self._voices()
        self._pieces: list[np.ndarray] = []
        self._callback = _CALLBACK(self._heard)  # kept: the library calls it for as long as it lives (`speak` sets it)

    def _heard(self, wav, count, events) -> int:
        if count > 0:
            self._pieces.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        return 0  # go on

    def _voices(self) -> dict[str, bytes]:
        """Each voice's identifier ("gmw/en") by what names it, lower case: its languages ("en-gb", "en"), its name
        ("english_(great_britain)"), its file ("en") and its identifier; a language goes to its first voice."""
        self.lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        self.lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
        listed, voices, at = self.lib.espeak_ListVoices(None), [], 0
        while listed[at]:
            voices.append(listed[at].contents)
            at += 1
        named = {}
        for voice in voices:  # a voice's own names first: "en" is the voice en's, not the first voice of language en
            identifier, name = voice.identifier, voice.name.decode(errors="replace").lower()
            for key in (identifier.decode().lower(), identifier.decode().rsplit("/", 1)[-1].lower(), name,
                        name.replace(" ", "_")):  # fmt: skip
                named.setdefault(key, identifier)
        for voice in voices:
            for language in _languages(voice):
                named.setdefault(language, voice.identifier)
        return named

    def speak(self, text: str, voice: str | None = None, speed: float = 1.0) -> Clip:
        voice = OPENAI_VOICES.get(voice or "alloy", voice)
        base, plus, variant = voice.partition("+")
        identifier = self.named.get(base.lower())
        data = text.encode("utf-8") + b"\0"
        with Espeak._lock:
            self.lib.espeak_SetSynthCallback(self._callback)
            if identifier is None or self.lib.espeak_SetVoiceByName(identifier + (plus + variant).encode()) != 0:
                raise UserError(
                    f"There is no voice {voice!r}; give one of {', '.join(OPENAI_VOICES)} or one of {ESPEAK}'s voices "
                    "(espeak-ng --voices), a variant after + (en-us+f3)."
                )
            self.lib.espeak_SetParameter(_RATE, round(ESPEAK_WPM * speed), 0)
            self._pieces = []
            if self.lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None) != 0:
                raise UserError(f"{ESPEAK} failed to speak this text; send it again, or give --tts_model DIR.")
            samples = np.concatenate(self._pieces) if self._pieces else np.zeros(0, np.int16)
        return Clip(samples.astype(np.float32) / 32768, self.rate)
