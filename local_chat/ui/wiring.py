"""How the page's handlers meet Gradio: which events run the model, which stay out of the API docs, handlers whose
results are named records turned into Gradio's {component: value}, and handlers that take the chat's settings as one
`ChatSettings`.

A handler returns (or yields) a `NamedTuple` whose fields are named as the page's components are (`ChatParts`' names,
and the sidebar's); `updating` gives Gradio its `fn` and `outputs` from the record's fields, so a handler and its
event cannot disagree on an order. A field `chat` is the chat's typed list (ui/turns.py): it also updates the Chatbot,
with its view. Handlers stay plain functions of plain values: the tests call them without a page.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping

from .chat_settings import ChatSettings
from .turns import view

# every event that runs the model: no Gradio limit, the engine queues them with the /v1 API's (engine/in_order.py)
GENERATION = dict(concurrency_id="generation", concurrency_limit=None)
UI_ONLY = "undocumented"  # the page's own events stay out of the API docs: /chat and /single_turn are the API
SETTINGS_COUNT = len(ChatSettings.__dataclass_fields__)


def updating(handler, record: type, components: Mapping) -> dict:
    """Gradio's `fn` and `outputs` for `handler`, whose results are `record`s (a NamedTuple, its fields named as
    `components`): each result becomes {component: value}, its `chat` the chat's list and the Chatbot's view of it."""
    names = record._fields
    outputs = [components[name] for name in names] + ([components["chatbot"]] if "chat" in names else [])

    def updates(result) -> dict:
        values = {components[name]: value for name, value in zip(names, result, strict=True)}
        if "chat" in names:
            chat = result[names.index("chat")]
            values[components["chatbot"]] = view(chat) if isinstance(chat, list) else chat  # else gr.skip()
        return values

    return dict(fn=_mapped(handler, lambda args: args, updates), outputs=outputs)


def taking_settings(handler):
    """`handler(..., settings: ChatSettings)` as the page calls it: with the values of `ChatParts.settings()` last,
    in `ChatSettings`' field order."""

    def settings_last(args: tuple) -> tuple:
        return (*args[:-SETTINGS_COUNT], ChatSettings(*args[-SETTINGS_COUNT:]))

    wrapped = _mapped(handler, settings_last, lambda result: result)
    leading = list(inspect.signature(handler).parameters.values())[:-1]  # the request, event data, page inputs
    values = inspect.Parameter("settings", inspect.Parameter.VAR_POSITIONAL)
    wrapped.__signature__ = inspect.Signature([*leading, values])
    wrapped.__annotations__.pop("settings", None)
    return wrapped


def _mapped(handler, arguments, results):
    """`handler` with its arguments and each result mapped; Gradio reads the same signature (its `gr.Request` and
    event data by their annotations), and a generator stays one."""
    if inspect.isasyncgenfunction(handler):

        async def streamed(*args):
            async for result in handler(*arguments(args)):
                yield results(result)

        wrapped = streamed
    elif inspect.iscoroutinefunction(handler):

        async def awaited(*args):
            return results(await handler(*arguments(args)))

        wrapped = awaited
    else:

        def returned(*args):
            return results(handler(*arguments(args)))

        wrapped = returned
    wrapped.__signature__ = inspect.signature(handler)
    wrapped.__annotations__ = _hints(handler)  # where Gradio finds its `gr.Request` and event data
    wrapped.__name__ = getattr(handler, "__name__", "handler")
    return wrapped


def _hints(handler) -> dict:
    """`handler`'s annotations as types (its module's names resolved there: this module has none of them)."""
    try:
        return dict(typing.get_type_hints(handler))
    except (NameError, TypeError):
        return dict(getattr(handler, "__annotations__", {}))
