"""Chat messages in OpenAI's shape to the prompt a model sees: through its chat template (tools, tool turns, earlier
reasoning, the template's own variables), or through an Accessory template (user and assistant turns only). The
oldest turns are left out when the conversation does not fit the context, cut only before a user message, so that a
tool call and its results always stay together.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Iterator

from local_chat.defaults import MAX_UPLOAD_MB
from local_chat.engine.interface import ChatOptions, Engine
from local_chat.errors import NO_HEARING, UserError
from local_chat.templates.multi_turn import CHAT_TEMPLATE
from local_chat.voice.clips import Clip, read_clip, wav_bytes

from .chat import (
    AUDIO_PART_TYPES,
    IMAGE_PART_TYPES,
    ChatPrompt,
    audio_parts,
    block_cuts,
    chat_prompt,
    conversation,
    image_parts,
    merged_roles,
    message_images,
    message_text,
)
from .families import ENABLE_THINKING, REASONING_EFFORT, ThinkingSwitch, chat_format, variables_read
from .images import png_bytes, png_data_url

# the answer's fields an earlier assistant message may carry back, under either name clients use
REASONING_FIELDS = ("reasoning_content", "reasoning")
TOOL_TURNS = "tool messages, tool calls and tools"


def messages_prompt(
    engine: Engine,
    template: str,
    messages: list[dict],
    options: ChatOptions,
    max_mb: float = MAX_UPLOAD_MB,
    shorten: bool = True,
) -> ChatPrompt:
    """The prompt answering `messages` (checked, normalized) in `template`, shortened to leave room for
    `options.answer_tokens`; a conversation that cannot fit, or turns the template cannot render, raise `UserError`.
    `shorten=False` keeps every turn, whatever its length (to count it)."""
    messages = answerable(messages)
    if template != CHAT_TEMPLATE:
        return _turns_prompt(engine, template, latest_images_only(messages), options, max_mb, shorten)
    conv = conversation(engine, CHAT_TEMPLATE)
    if not conv.typed_parts:
        messages = latest_images_only(messages)
    family = chat_format(engine.chat_renderer, engine.summary().model_type)
    if family.written_calls and any(m.get("tool_calls") for m in messages) and not conv.renders_calls():
        messages = calls_in_text(messages, family.written_calls)
    kwargs, effort = template_variables(engine, options)
    switch = thinking_switch_of(engine)
    if effort is not None and switch is not None:
        messages = switch.flagged(messages, effort)  # a switch written in the system prompt (Nemotron's /no_think)

    if any(audio_parts(m) for m in messages) and not engine.summary().hears:
        raise UserError(NO_HEARING)

    @functools.cache
    def render(dropped: int) -> tuple[str, tuple]:
        parts, images = with_images(kept_turns(messages, dropped), max_mb)
        return conv.render_messages(parts, options.tools, **kwargs), tuple(images)

    @functools.cache
    def length(dropped: int) -> int:
        text, images = render(dropped)
        return engine.prompt_length(text, list(images) or None)

    dropped, tokens = fitted(engine, messages, options.answer_tokens, length) if shorten else (0, length(0))
    text, images = render(dropped)
    return ChatPrompt(text, list(conv.stop_symbols), dropped, list(images), tokens)


def calls_in_text(messages: list[dict], written) -> list[dict]:
    """The messages with each assistant's tool calls written into its text as the family writes them (`written`), for
    a template that renders an assistant's content only: the model sees the calls its tool results answer."""
    return [
        {**{k: v for k, v in m.items() if k != "tool_calls"}, "content": message_text(m["content"]) + written(calls)}
        if m["role"] == "assistant" and (calls := m.get("tool_calls"))
        else m
        for m in messages
    ]


def latest_images_only(messages: list[dict]) -> list[dict]:
    """The messages for a template with no place for images in their turns (an Accessory template, a chat template
    that reads text only): the images go in front of the whole prompt (model/vision_inputs.py), as these models
    learned them, so only those of the latest message that has any are kept, and the answer is about them; an
    earlier message's images are left out (its text stays)."""
    holding = [i for i, m in enumerate(messages) if image_parts(m)]
    if len(holding) < 2:
        return messages
    return [{**m, "content": message_text(m["content"])} if i in holding[:-1] else m for i, m in enumerate(messages)]


def answerable(messages: list[dict]) -> list[dict]:
    """The messages `normalized`, checked to end with what a model answers: a user message or a tool result."""
    messages = normalized(messages)
    if not messages or messages[-1]["role"] not in ("user", "tool"):
        raise UserError('The last message must be the user\'s or a tool result (role "user" or "tool").')
    return messages


def fitted(engine: Engine, messages: list[dict], answer_tokens: int, length) -> tuple[int, int]:
    """(how many of the oldest turns of `messages` to leave out, the prompt's tokens then) so that the prompt
    (`length(dropped)` tokens) leaves room for `answer_tokens` (at most half the context), cut where `block_cuts`
    says; a last turn that cannot fit alone is one sentence."""
    context = engine.max_seq_len
    budget = context - min(answer_tokens, context // 2)
    dropped = 0
    if length(0) > budget:
        cuts = list(turn_cuts(engine, messages))
        dropped = next((n for n in cuts if length(n) <= budget), cuts[-1])
    tokens = length(dropped)
    if tokens >= context:
        system = ", system prompt" if any(m["role"] == "system" for m in messages) else ""
        images = " and image" if any(image_parts(m) for m in kept_turns(messages, dropped)) else ""
        raise UserError(
            f"This message needs {tokens} tokens (with the template{system}{images}) but the model's context holds "
            f"{context}; shorten it or split it over several messages."
        )
    return dropped, tokens


def turn_cuts(engine: Engine, messages: list[dict]) -> Iterator[int]:
    """How many of the oldest turns may be left out, fewest first (prompting/chat.py's `block_cuts`, counting the
    turns' own text); the last turn always stays."""
    starts = turn_starts(messages)
    bounds = [next((i for i, m in enumerate(messages) if m["role"] != "system"), 0), *starts[1:]]
    encode = engine.tokenizer.encode
    lengths = [len(encode(turn_text(messages[a:b]), bos=False, eos=False)) for a, b in zip(bounds, bounds[1:])]
    return block_cuts(lengths, engine.max_seq_len)


def turn_text(messages: list[dict]) -> str:
    """The text of a turn's messages (their content, reasoning and calls), to count its tokens."""
    texts = []
    for message in messages:
        if message["role"] == "system":
            continue
        texts.append(message_text(message.get("content")) + str(message.get("reasoning_content") or ""))
        texts.extend(json.dumps(call, ensure_ascii=False) for call in message.get("tool_calls") or [])
    return "\n".join(texts)


def turn_starts(messages: list[dict]) -> list[int]:
    """Where each turn starts: at a user message that follows another role's (a tool call and its results stay
    inside one turn)."""
    return [i for i, m in enumerate(messages) if m["role"] == "user" and (i == 0 or messages[i - 1]["role"] != "user")]


def kept_turns(messages: list[dict], dropped: int) -> list[dict]:
    """The system messages, then the conversation without its `dropped` oldest turns (the last turn always stays)."""
    starts = turn_starts(messages)
    if dropped <= 0 or not starts:
        start = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    else:
        start = starts[min(dropped, len(starts) - 1)]
    return [m for m in messages if m["role"] == "system"] + [m for m in messages[start:] if m["role"] != "system"]


def normalized(messages: list[dict]) -> list[dict]:
    """The messages as templates read them: `developer` as `system`, reasoning under `reasoning_content`, an
    assistant's missing content as "", tool calls' arguments as given; a tool result that answers no call is
    refused."""
    calls: set[str] = set()
    out = []
    for message in messages:
        message = dict(message)
        role = message.get("role")
        if role == "developer":
            role = message["role"] = "system"
        if role == "assistant":
            reasoning = next((message.pop(k) for k in REASONING_FIELDS if message.get(k) is not None), None)
            message.pop("reasoning", None)
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            if message.get("content") is None:
                message["content"] = ""
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and call.get("id"):
                    calls.add(call["id"])
        elif role == "tool":
            answered = message.get("tool_call_id")
            if answered is not None and answered not in calls:
                raise UserError(
                    f"A tool message answers tool_call_id {answered!r}, which no earlier assistant message called; "
                    "send the assistant message with its tool_calls before the tool results."
                )
            message["content"] = message_text(message.get("content"))
        elif role not in ("system", "user"):
            raise UserError(f"A message has role {role!r}; the roles are system, developer, user, assistant and tool.")
        out.append(message)
    return out


def template_variables(engine: Engine, options: ChatOptions) -> tuple[dict, str | None]:
    """(the chat template's own variables for this request, the reasoning effort asked for): `chat_template_kwargs`,
    with `reasoning_effort` (or the page's `enable_thinking`, where the template reads no such variable) set through
    the template's own thinking switch (`thinking_switch_of`: "none" is off, any other effort on); a template with
    no known switch gets `enable_thinking`."""
    kwargs = dict(options.template_kwargs)
    effort = kwargs.pop("reasoning_effort", None)
    switch = thinking_switch_of(engine)
    if effort is None and isinstance(kwargs.get("enable_thinking"), bool) and switch is not None:
        if "enable_thinking" not in template_reads(engine):
            effort = "medium" if kwargs.pop("enable_thinking") else "none"
    if effort is None:
        return kwargs, None
    own = switch.variables(effort) if switch is not None else {"enable_thinking": effort != "none"}
    return {**own, **kwargs}, effort


def thinking_switch_of(engine: Engine) -> ThinkingSwitch | None:
    """How the model's chat template turns reasoning on and off: its family's switch (prompting/families.py), else
    the variable it reads (`reasoning_effort`, else `enable_thinking`), else None."""
    family = chat_format(engine.chat_renderer, engine.summary().model_type)
    if family.switch is not None:
        return family.switch
    reads = template_reads(engine)
    return REASONING_EFFORT if "reasoning_effort" in reads else ENABLE_THINKING if "enable_thinking" in reads else None


def template_reads(engine: Engine) -> frozenset[str]:
    """The variables the model's chat template reads that callers may set (prompting/families.py's
    `variables_read`)."""
    source = getattr(engine.chat_renderer, "chat_template", None)
    return variables_read(source) if isinstance(source, str) else frozenset()


def with_images(messages: list[dict], max_mb: float) -> tuple[list[dict], list]:
    """The messages with each image part decoded (with the upload checks) as {"type": "image", "image": PIL image},
    each sound clip's (`input_audio`) as {"type": "audio", "audio": Clip}, its text parts as {"type": "text",
    "text"}, and the images and clips in order."""
    out, media = [], []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                image = message_images([part], max_mb)[0]
                media.append(image)
                parts.append({"type": "image", "image": image})
            elif isinstance(part, dict) and part.get("type") in AUDIO_PART_TYPES:
                clip = part_clip(part, len([m for m in media if isinstance(m, Clip)]) + 1, max_mb)
                media.append(clip)
                parts.append({"type": "audio", "audio": clip})
            else:
                parts.append({"type": "text", "text": message_text(part)})
        out.append({**message, "content": parts})
    return out, media


def part_clip(part: dict, number: int, max_mb: float) -> Clip:
    """The sound clip of an audio part: decoded already, or OpenAI's `{"type": "input_audio", "input_audio":
    {"data": BASE64, "format": "wav"}}`, read with the upload checks (the `number`th recording of the
    conversation, as its sentence names it)."""
    if isinstance(part.get("audio"), Clip):
        return part["audio"]
    audio = part.get("input_audio") if isinstance(part.get("input_audio"), dict) else {}
    name = f"recording {number} ({audio.get('format') or 'sound'})"
    try:
        data = base64.b64decode(audio.get("data") or "", validate=True)
    except ValueError:
        raise UserError(f"The {name} is not base64 data; send the file's bytes as base64 in input_audio.data.")
    return read_clip(data, name, max_mb)


def with_data_urls(messages: list[dict], max_mb: float) -> list[dict]:
    """The messages as an engine that renders them itself is sent them: each image decoded with the upload checks
    (`with_images`), then sent as a PNG `data:` URL part, and each sound clip as a WAV `input_audio` part, encoded
    once."""
    decoded, _ = with_images(messages, max_mb)
    return [
        {**m, "content": [_data_url_part(p) for p in m["content"]]} if image_parts(m) or audio_parts(m) else m
        for m in decoded
    ]


def _data_url_part(part: dict) -> dict:
    if part.get("type") == "audio":
        data = base64.b64encode(wav_bytes(part["audio"])).decode()
        return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    if part.get("type") != "image":
        return part
    return {"type": "image_url", "image_url": {"url": png_data_url(png_bytes(part["image"]))}}


def _turns_prompt(
    engine: Engine, template: str, messages: list[dict], options: ChatOptions, max_mb: float, shorten: bool
) -> ChatPrompt:
    """The prompt of a template that takes user and assistant turns only: Accessory's (they know no tools)."""
    tool_turns = any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    if options.tools or tool_turns:
        raise UserError(
            f"The {template!r} template has no {TOOL_TURNS}; start the app with the model's own chat template "
            "(--template chat_template) to use tools."
        )
    merged = merged_roles(messages)
    systems = [message_text(m["content"]) for m in merged if m["role"] == "system"]
    turns = [m for m in merged if m["role"] != "system"]
    if turns[-1]["role"] != "user":
        raise UserError('The last message must be the user\'s (role "user"): it is the one answered.')
    last = turns[-1]["content"]
    return chat_prompt(
        engine,
        template,
        "\n\n".join(systems) if systems else None,
        turns[:-1],
        message_text(last),
        options.answer_tokens,
        None,
        message_images(last, max_mb),
        shorten,
    )
