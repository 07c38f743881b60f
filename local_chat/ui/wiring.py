"""How the page's handlers meet Gradio: which events run the model, which stay out of the API docs, and handlers
that return the chat's typed list (ui/turns.py) with the Chatbot's view of it."""

from __future__ import annotations

import functools
import inspect

from .turns import view

# every event that runs the model: no Gradio limit, the engine queues them with the /v1 API's (engine/in_order.py)
GENERATION = dict(concurrency_id="generation", concurrency_limit=None)
UI_ONLY = "undocumented"  # the page's own events stay out of the API docs: /chat and /single_turn are the API


def with_view(handler, at: int = 0):
    """`handler`, whose output `at` is the chat's typed list (ui/turns.py), with the Chatbot's view of it before it:
    wired to outputs [..., chatbot, entries, ...]."""

    def split(out):
        out = list(out)
        entries = out[at]
        shown = view(entries) if isinstance(entries, list) else entries  # else gr.skip(): both skipped
        return (*out[:at], shown, *out[at:])

    if inspect.isasyncgenfunction(handler):

        @functools.wraps(handler)
        async def streamed(*args, **kwargs):
            async for out in handler(*args, **kwargs):
                yield split(out)

        return streamed

    @functools.wraps(handler)
    def returned(*args, **kwargs):
        return split(handler(*args, **kwargs))

    return returned
