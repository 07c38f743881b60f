"""What a chat does, apart from Gradio: prompts from messages, streamed answers, cancellation, uploads, errors."""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import logging
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from conversation import get_conversation, template_names
from conversation.multi_turn import CHAT_TEMPLATE
from launchers.flags import MAX_UPLOAD_MB
from model import MetaModel, UserError
from model.errors import described
from model.prefix_cache import in_session
from single_turn_templates import format_prompt

IMAGE_PART_TYPES = ("image_url", "image")  # message parts that carry an image
MAX_UPLOAD_PIXELS = 40_000_000
EMPTY_MESSAGE = "The message is empty; type a question first."
log = logging.getLogger(__name__)


@dataclass
class Sampling:
    max_gen_len: int = 256
    temperature: float = 0.1
    top_p: float = 0.75
    top_k: int = 0
    repetition_penalty: float = 1.0


def conversation_templates(model: MetaModel) -> list[str]:
    return template_names(model.chat_renderer)


def conversation(model: MetaModel, template: str, system: str | None = None):
    """A fresh conversation in `template`; a chat template that cannot render is one sentence."""
    try:
        return get_conversation(template, model.chat_renderer, system, model.sees_images)
    except UserError:
        raise
    except Exception as error:
        if template != CHAT_TEMPLATE:
            raise
        raise UserError(
            f"This model's chat template fails: {described(error)}; pass --template NAME (one of "
            f"{', '.join(n for n in conversation_templates(model) if n != CHAT_TEMPLATE)})."
        )


def default_template(model: MetaModel, asked: str | None = None) -> str:
    """--template if given (checked), else the model's own chat template, else Accessory's 'default'."""
    names = conversation_templates(model)
    if asked is not None:
        if asked not in names:
            raise UserError(f"Unknown --template {asked!r}; choose one of: {', '.join(names)}.")
        return asked
    chosen = CHAT_TEMPLATE if CHAT_TEMPLATE in names else "default"
    conversation(model, chosen)  # a template that fails says so now, not at the first message
    return chosen


def default_system(model: MetaModel, template: str) -> str:
    return conversation(model, template).system


def message_text(content) -> str:
    """The text of a chat message, whichever shape Gradio gives it (a string, a part, a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        if content.get("type") in IMAGE_PART_TYPES:
            return ""
        return content.get("text") or content.get("content") or ""
    if isinstance(content, (list, tuple)):
        return "".join(message_text(part) for part in content)
    return "" if content is None else str(content)


def message_images(content, max_mb: float = MAX_UPLOAD_MB) -> list[Image.Image]:
    """The images among a message's parts: OpenAI-style `{"type": "image_url", "image_url": {"url": "data:..."}}`
    (or `{"type": "image", "url": ...}`), decoded with the upload checks. Outside addresses are never fetched."""
    if not isinstance(content, (list, tuple)):
        return []
    images = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
            url = part.get("image_url", part.get("url"))
            url = url.get("url") if isinstance(url, dict) else url
            images.append(image_from_data_url(url, max_mb))
    return images


def history_pairs(history: list[dict], max_mb: float = MAX_UPLOAD_MB) -> list[list]:
    """[[question, answer], ...] from {"role", "content"} messages (an unanswered question gets ""); a question
    with images among its parts is `(text, images)`. Older clients' [question, answer] pairs pass through."""
    pairs: list[list] = []
    for message in history or []:
        if isinstance(message, (list, tuple)) and len(message) == 2:
            pairs.append([message_text(message[0]), message_text(message[1])])
            continue
        if not isinstance(message, dict):
            raise UserError(
                f"The history holds {str(message)[:40]!r}, which is not a message; pass a list of "
                '{"role": "user" or "assistant", "content": text} dictionaries.'
            )
        role, text = message.get("role"), message_text(message.get("content"))
        if role == "user":
            images = message_images(message.get("content"), max_mb)
            pairs.append([(text, images) if images else text, ""])
        elif role == "assistant" and pairs:
            pairs[-1][1] += text
        elif role not in ("assistant", "system"):
            raise UserError(
                f"The history holds a message with role {role!r}; the roles are user, assistant and system."
            )
    return pairs


def history_system(history: list[dict]) -> str | None:
    """The text of the last {"role": "system"} message of `history` (as OpenAI-style clients send it), if any."""
    texts = [message_text(m.get("content")) for m in history or [] if isinstance(m, dict) and m.get("role") == "system"]
    return texts[-1] if texts else None


@dataclass
class ChatPrompt:
    text: str
    stop_symbols: list[str]
    dropped_turns: int = 0  # the oldest question-answer pairs left out so that the prompt fits the context
    images: list = field(default_factory=list)  # the images the prompt shows, in the order of their markers


def chat_prompt(
    model: MetaModel,
    template: str,
    system: str | None,
    history: list[dict],
    message: str,
    answer_tokens: int = 0,
    image=None,
) -> ChatPrompt:
    """The prompt for `message` after `history`, with the template's stop symbols. `system` (else a system message
    in `history`, else the template's own) is the system prompt.

    When the prompt and `answer_tokens` (counted up to half the context) do not fit in the model's context, the
    oldest turns are left out, whole: the rest is rendered again by the template, so the system prompt (and the
    image, which goes with the first question kept) stay and no template marker is ever cut. A message that cannot
    fit even alone raises `UserError`, and so does an empty one.
    """
    if not (message or "").strip():
        raise UserError(EMPTY_MESSAGE)
    pairs = history_pairs(history)
    conv = conversation(model, template, system if system is not None else history_system(history))

    @functools.cache
    def render(start: int) -> tuple[str, tuple]:
        """The prompt from turn `start` on, and its images in order: the conversation's `image` goes with the first
        question kept, each image of the history with its own."""
        turns = [[question_parts(q), a] for q, a in pairs[start:]] + [[(message, []), None]]
        turns[0][0] = (turns[0][0][0], ([image] if image is not None else []) + turns[0][0][1])
        conv.load_qas(turns)
        return conv.get_prompt(), tuple(i for (_, images), _ in turns for i in images)

    @functools.cache
    def length(start: int) -> int:
        prompt, images = render(start)
        return model.prompt_length(prompt, list(images) or None)

    budget = model.max_seq_len - min(answer_tokens, model.max_seq_len // 2)
    start = (
        0 if length(0) <= budget else next((s for s in history_cuts(model, pairs) if length(s) <= budget), len(pairs))
    )
    (prompt, images), tokens = render(start), length(start)
    if tokens >= model.max_seq_len:
        raise UserError(
            f"This message needs {tokens} tokens (with the template{', system prompt' if conv.system else ''}"
            f"{' and image' if image is not None else ''}) but the model's context holds {model.max_seq_len}; "
            "shorten it or split it over several messages."
        )
    return ChatPrompt(prompt, list(conv.stop_symbols), start, list(images))


def question_parts(question) -> tuple[str, list]:
    """(text, images) of a question of `history_pairs`."""
    return question if isinstance(question, tuple) else (question, [])


def history_cuts(model: MetaModel, pairs: list[list]) -> Iterator[int]:
    """Where the history may start when it must be shortened, earliest first: after the first turn that ends
    past each eighth of the context (counting the turns' own tokens), and last after every turn.

    The cuts of a conversation stay where they are as it grows, so one at its limit loses a block of turns now
    and then rather than one turn every time: between cuts its prompts share their start, and the session's KV
    cache keeps serving them.
    """
    step = max(1, model.max_seq_len // 8)
    total, mark = 0, step
    for index, (question, answer) in enumerate(pairs):
        total += len(model.tokenizer.encode(question_parts(question)[0] + answer, bos=False, eos=False))
        if total >= mark and index + 1 < len(pairs):
            yield index + 1
            mark = (total // step + 1) * step
    yield len(pairs)


def single_turn_prompt(instruction: str, input_text: str, template: str) -> str:
    if not (instruction or "").strip():
        raise UserError("The instruction is empty; type one first.")
    return format_prompt({"instruction": instruction, "input": input_text}, sys_name=template)


def stream_answer(
    model: MetaModel,
    prompt: str,
    stop_symbols: list[str],
    sampling: Sampling,
    image=None,
    image_transform: str | None = None,
    cancel: threading.Event | None = None,
    session: str | None = None,
) -> Iterator[dict]:
    """The model's pieces (see `MetaModel.stream_generate`; `session` keeps the conversation's KV cache between
    turns); a failure a user can act on becomes one last piece with "error": a sentence to show in the chat."""
    try:
        yield from model.stream_generate(
            prompt,
            image=image,
            max_gen_len=int(sampling.max_gen_len),
            temperature=float(sampling.temperature),
            top_p=float(sampling.top_p),
            top_k=int(sampling.top_k),
            repetition_penalty=float(sampling.repetition_penalty),
            additional_stop_symbols=stop_symbols,
            cancel=cancel,
            image_transform=image_transform,
            session=session,
        )
    except UserError as error:
        yield {"text": "", "end_of_content": True, "error": str(error)}
    except torch.OutOfMemoryError:
        yield {
            "text": "",
            "end_of_content": True,
            "error": "The GPU ran out of memory for this answer; ask for a shorter answer, clear the "
            "conversation, or load the model with --quant 4.",
        }
    except Exception as error:  # a bug or a broken model: the chat says so, the terminal has the traceback
        if not getattr(error, "traceback_printed", False):  # by the model's process (ui/processes.py)
            log.exception("The answer failed")
        yield {"text": "", "end_of_content": True, "error": model.failure or failure_sentence(error)}


def failure_sentence(error: Exception) -> str:
    return (
        f"The model failed while answering ({described(error)}); send the message again, and if it keeps "
        "failing see the app's terminal for the details."
    )


_END = object()
UPDATE_INTERVAL = 1 / 30  # seconds between two updates of an answer on the page or over the API, at the least


async def in_own_thread(
    pieces: Iterator[dict],
    failure: Callable[[], str | None] = lambda: None,
    check_every: float = 0.5,
    update_interval: float = UPDATE_INTERVAL,
) -> AsyncIterator[dict]:
    """Hand the pieces of a model stream to an async consumer (a Gradio handler) as the model makes them.

    Gradio runs a plain generator by sending each `next()` to a worker thread and back, and the model waits
    idle during both hops and while Gradio sends the piece: on the demo model that halved the pieces/s a client
    saw. Here one thread runs the stream from start to end, so the model works while the piece before is being
    sent. Each piece carries the whole answer so far, so the consumer gets the newest one at most every
    `update_interval` seconds (the first at once): pieces made in between are merged into it, not lost. Sending
    one update per token cost Gradio's event loop a quarter of the process's time (the GIL), which the model
    then lacked. When the consumer stops (Stop, a closed tab, an error), the thread closes the stream after its
    current step: the model does at most one more forward pass (a cancel flag set by Stop ends it sooner).
    While it waits, `failure()` is asked every `check_every` seconds: a sentence (a model worker died, and the
    stream may never move again) ends the answer with that error.
    """
    loop = asyncio.get_running_loop()
    arrived = asyncio.Event()
    lock = threading.Lock()
    box: list = []  # what the thread made since the consumer last looked: pieces, then _END or an error
    consumer_gone = threading.Event()

    def put(item) -> None:
        with lock:
            box.append(item)
            if len(box) == 1:  # wake the consumer once per batch, not once per token
                loop.call_soon_threadsafe(arrived.set)

    def produce() -> None:
        try:
            for piece in pieces:
                put(piece)
                if consumer_gone.is_set():
                    break
        except BaseException as error:  # handed to the consumer, which raises it where Gradio can show it
            put(error)
        finally:
            pieces.close()
            put(_END)

    threading.Thread(target=produce, name="answer", daemon=True).start()
    try:
        while True:
            try:
                await asyncio.wait_for(arrived.wait(), timeout=check_every)
            except asyncio.TimeoutError:
                if (message := failure()) is not None:
                    yield {"text": "", "end_of_content": True, "error": message}
                    return
                continue
            with lock:
                items = box[:]
                box.clear()
                arrived.clear()
            newest = next((item for item in reversed(items) if isinstance(item, dict)), None)
            if newest is not None:
                sent = loop.time()
                yield newest
            error = next((item for item in items if isinstance(item, BaseException)), None)
            if error is not None:
                raise error
            if items and items[-1] is _END:  # the thread's last word
                return
            if newest is not None:
                await asyncio.sleep(max(0.0, sent + update_interval - loop.time()))
    finally:
        consumer_gone.set()


def stats_line(piece: dict) -> str:
    if "completion_tokens" not in piece:
        return ""
    first = piece.get("time_to_first_token")
    first_text = f" · first token {first:.2f} s" if first is not None else ""
    stopped = " · stopped" if piece.get("finish_reason") == "cancelled" else ""
    cut = " · cut at the length limit" if piece.get("finish_reason") == "length" else ""
    return (
        f"{piece['completion_tokens']} tokens{first_text} · {piece.get('tokens_per_second', 0):.1f} tokens/s"
        f"{stopped}{cut}"
    )


class Cancels:
    """One cancel flag per tab of a browser session ("session/tab"): Stop or a new message stops that tab's answer
    only, a closed page stops every answer of its session."""

    def __init__(self):
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def fresh(self, key: str) -> threading.Event:
        """Cancel what this tab of a session is generating, and hand out the flag for its next answer."""
        with self._lock:
            old = self._events.get(key)
            if old is not None:
                old.set()
            self._events[key] = event = threading.Event()
            return event

    def cancel(self, key: str) -> None:
        with self._lock:
            event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def cancel_session(self, session: str) -> None:
        with self._lock:
            keys = [k for k in self._events if in_session(k, session)]
        for key in keys:
            self.cancel(key)


def open_upload(path: str | Path | None, max_mb: float = MAX_UPLOAD_MB, max_side: int = 1024) -> Image.Image | None:
    """An uploaded image, checked before it is decoded (file size, then pixel count from the header), as RGB and
    at most `max_side` pixels on its longer side."""
    if not path:
        return None
    path = Path(path)
    return checked_image(path, path.stat().st_size, path.name, max_mb, max_side)


def image_from_data_url(url, max_mb: float = MAX_UPLOAD_MB, max_side: int = 1024) -> Image.Image:
    """An image sent as a `data:image/...;base64,...` URL, with the upload checks. The app never fetches an outside
    address (an http(s) URL) for a client."""
    if not isinstance(url, str) or not url.startswith("data:"):
        shown = url[:40] if isinstance(url, str) else type(url).__name__
        raise UserError(
            f"An image part holds {shown!r}; send images as data: URLs (data:image/png;base64,...): "
            "this app never fetches outside addresses."
        )
    header, _, payload = url.partition(",")
    if ";base64" not in header or len(payload) * 3 / 4 > max_mb * 1e6:
        size = f"{len(payload) * 3 / 4e6:.1f} MB" if ";base64" in header else "not base64"
        raise UserError(f"An image data: URL is {size}; send a base64 one under {max_mb:g} MB.")
    try:
        data = base64.b64decode(payload, validate=True)
    except ValueError:
        raise UserError("An image data: URL holds broken base64; encode the image file with base64.")
    return checked_image(io.BytesIO(data), len(data), "The image in a data: URL", max_mb, max_side)


def checked_image(source, size: int, name: str, max_mb: float, max_side: int) -> Image.Image:
    """The image in `source` (a path or a file object of `size` bytes), checked before it is decoded."""
    if size > max_mb * 1e6:
        raise UserError(
            f"The image file is {size / 1e6:.1f} MB; upload one under {max_mb:g} MB (the app's --max_upload_mb)."
        )
    try:
        with Image.open(source) as header:
            width, height = header.size
            if width * height > MAX_UPLOAD_PIXELS:
                raise UserError(
                    f"The image is {width}x{height} pixels; upload one under {MAX_UPLOAD_PIXELS / 1e6:.0f} megapixels."
                )
            image = header.convert("RGB")
    except UserError:
        raise
    except Image.DecompressionBombError:  # Pillow refuses to even read the header of a huge image
        raise UserError(
            f"The image has over {Image.MAX_IMAGE_PIXELS * 2 / 1e6:.0f} million pixels; upload one under "
            f"{MAX_UPLOAD_PIXELS / 1e6:.0f} megapixels."
        )
    except (OSError, ValueError, SyntaxError):  # Pillow raises SyntaxError for a broken file
        raise UserError(
            f"{name} is not an image this app can read (not an image, or a damaged one); upload a "
            "PNG, JPEG, WebP or GIF file."
        )
    if max(image.size) > max_side:
        image.thumbnail((max_side, max_side))
    return image


def save_preview(image: Image.Image) -> str:
    """A PNG copy of a checked upload, for Gradio to show (it never decodes the user's original file)."""
    handle = tempfile.NamedTemporaryFile(suffix=".png", delete=False, prefix="upload-")
    image.save(handle, format="PNG")
    handle.close()
    return handle.name
