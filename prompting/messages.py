"""Chat messages in OpenAI's shape to the prompt a model sees: through its chat template (tools, tool turns, earlier
reasoning, the template's own variables), or through an Accessory template (user and assistant turns only). The
oldest turns are left out when the conversation does not fit the context, cut only before a user message, so that a
tool call and its results always stay together.
"""

from __future__ import annotations

import functools

from conversation.multi_turn import CHAT_TEMPLATE
from engine.interface import ChatOptions, Engine
from launchers.flags import MAX_UPLOAD_MB
from user_error import UserError

from .chat import (
    IMAGE_PART_TYPES,
    ChatPrompt,
    chat_prompt,
    conversation,
    merged_roles,
    message_images,
    message_text,
)

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
    messages = normalized(messages)
    if not messages or messages[-1]["role"] not in ("user", "tool"):
        raise UserError('The last message must be the user\'s or a tool result (role "user" or "tool").')
    if template != CHAT_TEMPLATE or getattr(engine.chat_renderer, "applied_by_engine", False):
        return _turns_prompt(engine, template, messages, options, max_mb, shorten)
    conv = conversation(engine, CHAT_TEMPLATE)
    kwargs = template_variables(engine, options)

    @functools.cache
    def render(dropped: int) -> tuple[str, tuple]:
        parts, images = _with_images(kept_turns(messages, dropped), max_mb)
        return conv.render_messages(parts, options.tools, **kwargs), tuple(images)

    def length(dropped: int) -> int:
        text, images = render(dropped)
        return engine.prompt_length(text, list(images) or None)

    budget = engine.max_seq_len - min(options.answer_tokens, engine.max_seq_len // 2)
    turns = len(turn_starts(messages))
    dropped = 0
    if shorten and length(0) > budget:
        dropped = next((n for n in range(1, turns) if length(n) <= budget), max(turns - 1, 0))
    text, images = render(dropped)
    tokens = length(dropped)
    if shorten and tokens >= engine.max_seq_len:
        system = ", system prompt" if any(m["role"] == "system" for m in messages) else ""
        raise UserError(
            f"This message needs {tokens} tokens (with the template{system}{' and image' if images else ''}) but the "
            f"model's context holds {engine.max_seq_len}; shorten it or split it over several messages."
        )
    return ChatPrompt(text, list(conv.stop_symbols), dropped, list(images))


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


def template_variables(engine: Engine, options: ChatOptions) -> dict:
    """The chat template's own variables for this request: `chat_template_kwargs`, with `reasoning_effort` passed as
    is where the template reads it, else as `enable_thinking` (low, medium, high: on; none: off)."""
    kwargs = dict(options.template_kwargs)
    effort = kwargs.pop("reasoning_effort", None)
    if effort is None:
        return kwargs
    if "reasoning_effort" in template_reads(engine):
        return {"reasoning_effort": effort, **kwargs}
    return {"enable_thinking": effort != "none", **kwargs}


def template_reads(engine: Engine) -> set[str]:
    """The variables the model's chat template reads that callers may set (enable_thinking, reasoning_effort)."""
    import jinja2
    from jinja2 import meta

    source = getattr(engine.chat_renderer, "chat_template", None)
    if not isinstance(source, str):
        return set()
    try:
        return meta.find_undeclared_variables(jinja2.Environment().parse(source))
    except jinja2.TemplateError:
        return set()


def _with_images(messages: list[dict], max_mb: float) -> tuple[list[dict], list]:
    """The messages with each image part as {"type": "image"} (decoded with the upload checks), and the images in
    order."""
    out, images = [], []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:  # a model that cannot see says so
                images.extend(message_images([part], max_mb))
                parts.append({"type": "image"})
            else:
                parts.append({"type": "text", "text": message_text(part)})
        out.append({**message, "content": parts})
    return out, images


def _turns_prompt(
    engine: Engine, template: str, messages: list[dict], options: ChatOptions, max_mb: float, shorten: bool
) -> ChatPrompt:
    """The prompt of a template that takes user and assistant turns only: Accessory's (they know no tools), or the
    messages as JSON for an engine that applies its own (counted for /tokenize)."""
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
