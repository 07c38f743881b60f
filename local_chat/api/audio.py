"""/v1/audio/speech, /v1/audio/transcriptions and /v1/audio/translations in OpenAI's shape, over the app's `Voice`
(voice/): the text spoken sentence by sentence (streamed as each is spoken for `pcm` and `wav`, or as
`speech.audio.delta` events with `stream_format: "sse"`), and a recording's text (`json`, `text`, `verbose_json`,
`srt`, `vtt`), or its text in English (Whisper's translation). Each endpoint answers one sentence where the app has
no speech engine or no --stt_model."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from local_chat.errors import UserError
from local_chat.voice import Voice, sentences_of
from local_chat.voice.clips import MEDIA_TYPES, PCM_RATE, Clip, encoded, joined, pcm16, read_clip, resampled
from local_chat.voice.speech import MAX_SPOKEN_CHARS

from .requests import APIError, bad, parse_json

SPEEDS = (0.25, 4.0)
TRANSCRIPT_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
NO_SPEAKER = "This server speaks no text: espeak-ng is not installed (the voice extra) and no --tts_model was given."
NO_TRANSCRIBER = "This server transcribes nothing: start it with --stt_model DIR (a Whisper folder)."


def _error(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def _timestamp(seconds: float, comma: bool) -> str:
    ms = round(seconds * 1000)
    text = f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"
    return text.replace(".", ",") if comma else text


def transcript_body(text: str, clip: Clip, response_format: str, language: str | None, task: str) -> Response:
    if response_format == "text":
        return PlainTextResponse(text + "\n")
    if response_format in ("srt", "vtt"):  # one cue over the recording
        span = f"{_timestamp(0, response_format == 'srt')} --> {_timestamp(clip.seconds, response_format == 'srt')}"
        cue = f"1\n{span}\n{text}\n" if response_format == "srt" else f"WEBVTT\n\n{span}\n{text}\n"
        return PlainTextResponse(cue)
    if response_format == "verbose_json":
        segment = {"id": 0, "seek": 0, "start": 0.0, "end": round(clip.seconds, 3), "text": text, "tokens": [],
                   "temperature": 0.0, "avg_logprob": 0.0, "compression_ratio": 0.0, "no_speech_prob": 0.0}  # fmt: skip
        return JSONResponse({"task": task, "language": language or ("english" if task == "translate" else ""),
                             "duration": round(clip.seconds, 3), "text": text, "segments": [segment]})  # fmt: skip
    return JSONResponse({"text": text, "usage": {"type": "duration", "seconds": round(clip.seconds)}})


def _wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header whose lengths say "to the end" (0xFFFFFFFF), for a WAV sent as it is spoken."""
    unknown = (0xFFFFFFFF).to_bytes(4, "little")
    fmt = (16).to_bytes(4, "little") + (1).to_bytes(2, "little") + (1).to_bytes(2, "little")
    fmt += rate.to_bytes(4, "little") + (rate * 2).to_bytes(4, "little") + (2).to_bytes(2, "little")
    return b"RIFF" + unknown + b"WAVEfmt " + fmt + (16).to_bytes(2, "little") + b"data" + unknown


class AudioAPI:
    """The two audio endpoints over `voice`; `authorize`: the /v1 API's key check; `max_upload_mb`: the cap on a
    recording."""

    def __init__(self, voice: Voice, authorize: Callable, max_upload_mb: float):
        self.voice, self.authorize, self.max_upload_mb = voice, authorize, max_upload_mb

    def routes(self) -> list[Route]:
        return [
            Route("/v1/audio/speech", self.speech, methods=["POST"]),
            Route("/v1/audio/transcriptions", self.transcriptions, methods=["POST"]),
            Route("/v1/audio/translations", self.translations, methods=["POST"]),
        ]

    # ----- speech -----

    async def speech(self, http: HTTPRequest) -> Response:
        try:
            self.authorize(http)
            body = parse_json(await http.body())
            text, voice, speed, kind, stream_format = self._speech_request(body)
            sentences = sentences_of(text)
            if not sentences:
                raise bad("`input` has nothing to say; send some text.", "input")
            first = await run_in_threadpool(self._speak, sentences[0], voice, speed)  # a bad voice is a 400
        except APIError as error:
            return _error(error)
        pieces = self._spoken(first, sentences[1:], voice, speed)
        if stream_format == "sse":
            return StreamingResponse(self._events(pieces, kind), media_type="text/event-stream")
        if kind in ("pcm", "wav"):
            return StreamingResponse(self._raw(pieces, kind), media_type=MEDIA_TYPES[kind])
        try:
            clips = [clip async for clip in pieces]
        except UserError as error:
            return _error(bad(str(error), "input"))
        return Response(await run_in_threadpool(encoded, joined(clips), kind), media_type=MEDIA_TYPES[kind])

    def _speech_request(self, body: dict) -> tuple[str, str | None, float, str, str]:
        if not self.voice.speaks:
            raise APIError(404, NO_SPEAKER)
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise bad("`input` must be the text to speak.", "input")
        if len(text) > MAX_SPOKEN_CHARS:
            raise bad(f"`input` is {len(text)} characters, over {MAX_SPOKEN_CHARS}; send shorter text.", "input")
        voice = body.get("voice")
        if voice is not None and not isinstance(voice, str):
            raise bad("`voice` must be a voice's name.", "voice")
        speed = body.get("speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not SPEEDS[0] <= speed <= SPEEDS[1]:
            raise bad(f"`speed` must be a number from {SPEEDS[0]} to {SPEEDS[1]}.", "speed")
        kind = body.get("response_format") or "mp3"
        if kind not in MEDIA_TYPES:
            raise bad(
                f"`response_format` {kind!r} is not offered; send one of {', '.join(MEDIA_TYPES)}.", "response_format"
            )
        stream_format = body.get("stream_format") or "audio"
        if stream_format not in ("audio", "sse"):
            raise bad("`stream_format` must be audio or sse.", "stream_format")
        return text, voice, float(speed), kind, stream_format

    def _speak(self, sentence: str, voice: str | None, speed: float) -> Clip:
        try:
            return self.voice.speaker.speak(sentence, voice, speed)
        except UserError as error:
            raise bad(str(error), "voice") from None

    async def _spoken(self, first: Clip, rest: list[str], voice, speed) -> AsyncIterator[Clip]:
        yield first
        for sentence in rest:
            yield await run_in_threadpool(self.voice.speaker.speak, sentence, voice, speed)

    async def _raw(self, pieces: AsyncIterator[Clip], kind: str) -> AsyncIterator[bytes]:
        """pcm: each clip at OpenAI's 24 kHz; wav: a header at the speaker's rate, then each clip as it is."""
        async for clip in pieces:
            if kind == "pcm":
                yield pcm16(resampled(clip, PCM_RATE))
                continue
            header, kind = _wav_header(clip.rate) if kind == "wav" else b"", "wav data"
            yield header + pcm16(clip)

    async def _events(self, pieces: AsyncIterator[Clip], kind: str) -> AsyncIterator[str]:
        async for clip in pieces:
            audio = await run_in_threadpool(encoded, clip, kind)
            yield f"data: {json.dumps({'type': 'speech.audio.delta', 'audio': base64.b64encode(audio).decode()})}\n\n"
        yield f"data: {json.dumps({'type': 'speech.audio.done', 'usage': None})}\n\n"

    # ----- transcriptions -----

    async def transcriptions(self, http: HTTPRequest) -> Response:
        return await self._heard(http, "transcribe")

    async def translations(self, http: HTTPRequest) -> Response:
        """The recording's text in English (Whisper's own translation; OpenAI's endpoint takes no `language`)."""
        return await self._heard(http, "translate")

    async def _heard(self, http: HTTPRequest, task: str) -> Response:
        try:
            self.authorize(http)
            if not self.voice.hears:
                raise APIError(404, NO_TRANSCRIBER)
            form = await self._form(http)
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise bad("Send the recording as the multipart field `file`.", "file")
            response_format = form.get("response_format") or "json"
            if response_format not in TRANSCRIPT_FORMATS:
                raise bad(f"`response_format` must be one of {', '.join(TRANSCRIPT_FORMATS)}.", "response_format")
            language = (form.get("language") or None) if task == "transcribe" else None
            prompt, data = form.get("prompt") or None, await upload.read()
            clip = await run_in_threadpool(read_clip, data, upload.filename or "file", self.max_upload_mb)
            text = await run_in_threadpool(self.voice.transcriber.transcribe, clip, language, prompt, task)
        except UserError as error:
            return _error(bad(str(error), "file"))
        except APIError as error:
            return _error(error)
        if str(form.get("stream", "")).lower() == "true":  # the whole text as one delta, then done
            events = [{"type": "transcript.text.delta", "delta": text}, {"type": "transcript.text.done", "text": text}]
            return Response("".join(f"data: {json.dumps(e)}\n\n" for e in events), media_type="text/event-stream")
        return transcript_body(text, clip, response_format, language, task)

    async def _form(self, http: HTTPRequest):
        if not http.headers.get("content-type", "").startswith("multipart/form-data"):
            raise bad("Send the recording as multipart/form-data, with the file in the field `file`.", "file")
        try:
            return await http.form(max_part_size=int(self.max_upload_mb * 1e6) + 1)
        except Exception as error:  # starlette's MultiPartException: a part over the cap, a broken body
            raise bad(f"The form cannot be read ({error}); send the recording as the field `file`.", "file") from None
