"""Prompt building, below every door: a conversation's messages to the text a model sees (its chat template or an
Accessory template), with its stop strings, the images its markers stand for, and the oldest turns left out when it
does not fit the context. The page, the /v1 API and the command line all build their prompts here."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

from PIL import Image

from local_chat.defaults import MAX_UPLOAD_MB
from local_chat.engine.interface import Engine
from local_chat.errors import UserError, described
from local_chat.templates.multi_turn import CHAT_TEMPLATE, get_conversation, template_names
from local_chat.templates.single_turn import TEMPLATE_NAMES, format_prompt

from .images import image_from_data_url

IMAGE_PART_TYPES = ("image_url", "image")  # message parts that carry an image
AUDIO_PART_TYPES = ("input_audio", "audio")  # message parts that carry a sound clip (OpenAI's, decoded)
EMPTY_MESSAGE = "The message is empty; type a question first."
ROLES = ("system", "user", "assistant")


def conversation_templates(engine: Engine) -> list[str]:
    return template_names(engine.chat_renderer)


def conversation(engine: Engine, template: str, system: str | None = None):
    """A fresh conversation in `template`; a chat template that cannot render is one sentence."""
    try:
        media = engine.sees_images or engine.summary().hears  # its template reads typed parts where it can
        return get_conversation(template, engine.chat_renderer, system, media)
    except UserError:
        raise
    except Exception as error:
        if template != CHAT_TEMPLATE:
            raise
        raise UserError(
            f"This model's chat template fails: {described(error)}; pass --template NAME (one of "
            f"{', '.join(n for n in conversation_templates(engine) if n != CHAT_TEMPLATE)})."
        )


def default_template(engine: Engine, asked: str | None = None) -> str:
    """--template if given (checked), else the model's own chat template, else Accessory's 'default'."""
    names = conversation_templates(engine)
    if asked is not None:
        return checked_template(asked, names)
    chosen = CHAT_TEMPLATE if CHAT_TEMPLATE in names else "default"
    if not renders_itself(engine, chosen):
        conversation(engine, chosen)  # a template that fails says so now, not at the first message
    return chosen


def checked_template(asked: str, names: list[str]) -> str:
    """--template `asked`, where it is one of `names`; else one sentence naming them."""
    if asked not in names:
        raise UserError(f"Unknown --template {asked!r}; choose one of: {', '.join(names)}.")
    return asked


def default_system(engine: Engine, template: str) -> str:
    """The system prompt `template` sends when none is given (the page's box shows it): an Accessory template's, or
    the one a chat template writes itself."""
    if renders_itself(engine, template):
        return ""
    conv = conversation(engine, template)
    return conv.template_system() if template == CHAT_TEMPLATE else conv.system


def renders_itself(engine: Engine, template: str) -> bool:
    """Whether `template` is the chat template of an engine that applies it itself (engine/remote.py)."""
    return template == CHAT_TEMPLATE and getattr(engine.chat_renderer, "applied_by_engine", False)


def message_text(content) -> str:
    """The text of a chat message, whichever shape Gradio gives it (a string, a part, a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        if content.get("type") in IMAGE_PART_TYPES + AUDIO_PART_TYPES:
            return ""
        return content.get("text") or content.get("content") or ""
    if isinstance(content, (list, tuple)):
        return "".join(message_text(part) for part in content)
    return "" if content is None else str(content)


def image_parts(message: dict, kinds: tuple[str, ...] = IMAGE_PART_TYPES) -> list[dict]:
    """The image parts (or parts of `kinds`) of a message's content (none where the content is a string)."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [p for p in content if isinstance(p, dict) and p.get("type") in kinds]


def audio_parts(message: dict) -> list[dict]:
    """The sound clips' parts of a message's content."""
    return image_parts(message, AUDIO_PART_TYPES)


def without_images(message: dict) -> dict:
    """A message for a model that does not see images: its images left out (its recordings kept)."""
    if not image_parts(message):
        return message
    if not audio_parts(message):
        return {**message, "content": message_text(message["content"])}
    return {**message, "content": [p for p in message["content"] if p.get("type") not in IMAGE_PART_TYPES]}


def message_images(content, max_mb: float = MAX_UPLOAD_MB) -> list[Image.Image]:
    """The images among a message's parts: OpenAI-style `{"type": "image_url", "image_url": {"url": "data:..."}}`
    (or `{"type": "image", "url": ...}`), decoded with the upload checks. Outside addresses are never fetched."""
    if not isinstance(content, (list, tuple)):
        return []
    images = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("image"), Image.Image):  # decoded already (ui/history.py)
            images.append(part["image"])
        elif isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
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
    tokens: int = 0  # the prompt's length in tokens


def chat_prompt(
    engine: Engine,
    template: str,
    system: str | None,
    history: list[dict],
    message: str,
    answer_tokens: int = 0,
    image=None,
    attached: list | tuple = (),
    shorten: bool = True,
) -> ChatPrompt:
    """The prompt for `message` (with the images `attached` to it) after `history`, with the template's stop symbols.
    `system` (else a system message in `history`, else the template's own) is the system prompt; `image` is the
    conversation's, one for the whole conversation, shown with the first question kept.

    When the prompt and `answer_tokens` (counted up to half the context) do not fit in the model's context, the
    oldest turns are left out, whole: the rest is rendered again by the template, so the system prompt (and the
    image, which goes with the first question kept) stay and no template marker is ever cut. A message that cannot
    fit even alone raises `UserError`, and so does an empty one. `shorten=False` keeps every turn, whatever its length
    (to count it).
    """
    if not (message or "").strip():
        raise UserError(EMPTY_MESSAGE)
    pairs = history_pairs(history)
    conv = conversation(engine, template, system if system is not None else history_system(history))

    @functools.cache
    def render(start: int) -> tuple[str, tuple]:
        """The prompt from turn `start` on, and its images in order: the conversation's `image` goes with the first
        question kept, each image of the history with its own."""
        turns = [[question_parts(q), a] for q, a in pairs[start:]] + [[(message, list(attached)), None]]
        turns[0][0] = (turns[0][0][0], ([image] if image is not None else []) + turns[0][0][1])
        conv.load_qas(turns)
        return conv.get_prompt(), tuple(i for (_, images), _ in turns for i in images)

    @functools.cache
    def length(start: int) -> int:
        prompt, images = render(start)
        return engine.prompt_length(prompt, list(images) or None)

    budget = engine.max_seq_len - min(answer_tokens, engine.max_seq_len // 2)
    start = (
        0
        if not shorten or length(0) <= budget
        else next((s for s in history_cuts(engine, pairs) if length(s) <= budget), len(pairs))
    )
    (prompt, images), tokens = render(start), length(start)
    if shorten and tokens >= engine.max_seq_len:
        raise UserError(
            f"This message needs {tokens} tokens (with the template{', system prompt' if conv.system else ''}"
            f"{' and image' if image is not None or attached else ''}) but the model's context holds "
            f"{engine.max_seq_len}; "
            "shorten it or split it over several messages."
        )
    return ChatPrompt(prompt, list(conv.stop_symbols), start, list(images), tokens)


def question_parts(question) -> tuple[str, list]:
    """(text, images) of a question of `history_pairs`."""
    return question if isinstance(question, tuple) else (question, [])


def history_cuts(engine: Engine, pairs: list[list]) -> Iterator[int]:
    """Where the history may start when it must be shortened (see `block_cuts`)."""
    encode = engine.tokenizer.encode
    lengths = [len(encode(question_parts(q)[0] + a, bos=False, eos=False)) for q, a in pairs]
    return block_cuts(lengths, engine.max_seq_len)


def block_cuts(lengths: list[int], context: int) -> Iterator[int]:
    """How many of the oldest turns (of these token `lengths`) may be left out when a conversation must be shortened,
    fewest first: the turns up to the first that ends past each eighth of the `context`, and last all of them.

    The cuts of a conversation stay where they are as it grows, so one at its limit loses a block of turns now
    and then rather than one turn every time: between cuts its prompts share their start, and the session's KV
    cache keeps serving them.
    """
    step = max(1, context // 8)
    total, mark = 0, step
    for index, length in enumerate(lengths):
        total += length
        if total >= mark and index + 1 < len(lengths):
            yield index + 1
            mark = (total // step + 1) * step
    yield len(lengths)


def single_turn_prompt(instruction: str, input_text: str, template: str) -> str:
    if not (instruction or "").strip():
        raise UserError("The instruction is empty; type one first.")
    return format_prompt({"instruction": instruction, "input": input_text}, sys_name=template)


def merged_roles(messages: list[dict]) -> list[dict]:
    """OpenAI-style messages with consecutive messages of one role merged into one, their parts in order (Gradio's
    `load_chat` sends an image and its question as two user messages in a row); each role checked."""
    merged: list[dict] = []
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise UserError(f"A message has role {role!r}; the roles are {', '.join(ROLES)}.")
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": message_text(content)}]
        if merged and merged[-1]["role"] == role:
            merged[-1]["content"].extend(parts)
        else:
            merged.append({"role": role, "content": list(parts)})
    return merged


def resolve_template(engine: Engine, asked: str | None) -> str:
    """The command line's --template, checked; by default the model's chat template where it has one, else the raw
    prompt ("None")."""
    conversations = conversation_templates(engine)
    if asked is None:
        return CHAT_TEMPLATE if CHAT_TEMPLATE in conversations else "None"
    if asked not in (*TEMPLATE_NAMES, *conversations):
        raise UserError(f"Unknown --template {asked!r}; choose one of: {', '.join([*TEMPLATE_NAMES, *conversations])}.")
    return asked


def check_system(template: str, system: str | None) -> None:
    if system is not None and template in TEMPLATE_NAMES:
        raise UserError(
            f"--system needs a conversation template, and {template!r} is a single-turn one; pass "
            "--template default (or chat_template, ...) with it, or leave --system out."
        )
