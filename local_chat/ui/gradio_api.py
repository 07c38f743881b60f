"""The page's own API, beside the page: `/chat` (a message after a history, with an image) and `/single_turn` (one
instruction in a single-turn template), for gradio_client callers. Each streams the growing answer; a mistake ends
the call as one sentence. Both go through the engine the page uses (ChatEngine over the launcher's queue)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import gradio as gr

from local_chat.defaults import MAX_UPLOAD_MB
from local_chat.engine import ChatOptions, Engine, Request, Sampling
from local_chat.engine.chats import ChatEngine
from local_chat.engine.interface import CHAT_SAMPLING, session_key
from local_chat.errors import UserError
from local_chat.prompting import (
    EMPTY_MESSAGE,
    conversation_templates,
    history_pairs,
    open_upload,
    single_turn_prompt,
)
from local_chat.prompting.chat import history_system, question_parts
from local_chat.templates.single_turn import TEMPLATE_NAMES
from local_chat.voice.clips import read_clip_file

from .chat import Cancels, answer_updates


def page_sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty) -> Sampling:
    """The sampling the page's settings (`sampling_controls`, in that order), or the /chat API's, ask for."""
    return Sampling(int(max_gen_len), float(temperature), float(top_p), int(top_k), float(repetition_penalty))


def api_error(sentence: str) -> gr.Error:
    """The sentence for an API caller; a caller's mistake is not the server's, so no traceback in its terminal."""
    return gr.Error(sentence, print_exception=False)


async def api_answer(engine: Engine, request: Request) -> AsyncIterator[str]:
    """The growing answer for an API caller; an error ends the call as that one sentence."""
    async for update in answer_updates(engine, request):
        if update.error:
            raise api_error(update.error)
        if update.text or update.line:  # not the prompt's rendering alone, nor reasoning alone (not shown here)
            yield update.text.strip()


def api_messages(history: list, message: str, image, system: str | None, max_mb: float, clip=None) -> list[dict]:
    """The /chat API's arguments as chat messages: `system` (else the history's last system message), the history's
    turns (messages, or older clients' [question, answer] pairs), then `message`; `image` goes with the first
    question, the recording `clip` (a `Clip`, for a model that hears) with `message`."""
    if not (message or "").strip():
        raise UserError(EMPTY_MESSAGE)
    system = system if system is not None else history_system(history)
    messages = [{"role": "system", "content": system}] if system is not None else []
    for question, answer in history_pairs(history, max_mb):
        text, images = question_parts(question)
        messages += [user_message(text, images), {"role": "assistant", "content": answer}]
    spoken = [{"type": "audio", "audio": clip}] if clip is not None else []
    messages.append({"role": "user", "content": [*spoken, {"type": "text", "text": message}] if spoken else message})
    if image is not None:
        first = next(m for m in messages if m["role"] == "user")
        first["content"] = [{"type": "image", "image": image}, *parts_of(first["content"])]
    return messages


def user_message(text: str, images: list) -> dict:
    parts = [{"type": "image", "image": image} for image in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}] if parts else text}


def parts_of(content) -> list:
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def api_chat(
    engine: Engine,
    cancels: Cancels,
    launcher_template: str,
    image_transform: str,
    max_upload_mb: float = MAX_UPLOAD_MB,
):
    engine = ChatEngine.over(engine, launcher_template, max_upload_mb)

    async def chat(
        message: str,
        history: list[dict],
        image: gr.FileData | None = None,
        max_gen_len: int = CHAT_SAMPLING.max_new_tokens,
        temperature: float = CHAT_SAMPLING.temperature,
        top_p: float = CHAT_SAMPLING.top_p,
        top_k: int = CHAT_SAMPLING.top_k,
        repetition_penalty: float = CHAT_SAMPLING.repetition_penalty,
        system: str | None = None,
        template: str | None = None,
        audio: gr.FileData | None = None,
        request: gr.Request = None,
    ) -> AsyncIterator[str]:
        """Answer `message` after `history` ([{"role", "content"}, ...]); yields the growing answer. The oldest
        turns of a history longer than the context are left out. `system` (or a "system" message in `history`)
        replaces the template's system prompt; `template` (default: the launcher's) is a conversation template;
        `audio` (a WAV, FLAC, MP3 or Ogg file) is a recording that goes with `message`, for a model that hears."""
        key = session_key(request.session_hash, "api")
        cancel = cancels.fresh(key)
        try:
            if template in TEMPLATE_NAMES:
                raise UserError(
                    f"{template!r} is a single-turn template: call /single_turn with it, or pass /chat "
                    f"one of: {', '.join(conversation_templates(engine))}."
                )
            picture = open_upload(file_path(image), max_upload_mb)
            sound = file_path(audio)
            recording = read_clip_file(sound, max_upload_mb) if sound else None
            settings = page_sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty)
            messages = api_messages(history, message, picture, system, max_upload_mb, recording)
        except UserError as error:
            raise api_error(str(error))
        answer = Request(
            sampling=settings,
            image_transform=image_transform,
            session=key,
            cancel=cancel,
            messages=messages,
            chat=ChatOptions(template=template or launcher_template, answer_tokens=settings.max_new_tokens),
        )
        async for text in api_answer(engine, answer):
            yield text

    return chat


def file_path(file: gr.FileData | dict | None) -> str | None:
    """The path of a file a gradio_client caller sent (`handle_file`), or None."""
    return file["path"] if isinstance(file, dict) else getattr(file, "path", None)


def api_single_turn(engine: Engine, cancels: Cancels):
    async def single_turn(
        instruction: str,
        input: str = "",
        template: str = "alpaca",
        max_gen_len: int = CHAT_SAMPLING.max_new_tokens,
        temperature: float = CHAT_SAMPLING.temperature,
        top_p: float = CHAT_SAMPLING.top_p,
        top_k: int = CHAT_SAMPLING.top_k,
        repetition_penalty: float = CHAT_SAMPLING.repetition_penalty,
        request: gr.Request = None,
    ) -> AsyncIterator[str]:
        """Answer one instruction in a single-turn template (alpaca, shortqa, qg, caption, None)."""
        cancel = cancels.fresh(session_key(request.session_hash, "api-single"))
        try:
            settings = page_sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty)
            prompt = single_turn_prompt(instruction, input, template)
        except UserError as error:
            raise api_error(str(error))
        async for text in api_answer(engine, Request(prompt, settings, cancel=cancel)):
            yield text

    return single_turn
