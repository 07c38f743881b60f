"""The engine interface (engine/interface.py) and the engines' plumbing: the model's own process and its pipe
(engine/process.py), one queue in arrival order for every door (engine/in_order.py), and a stream read on a thread of
its own for an async door (engine/threaded.py)."""

from .interface import (
    ACCESSORY_SAMPLING,
    Answer,
    ChatOptions,
    Delta,
    End,
    Engine,
    Event,
    Queued,
    Reasoning,
    Rendered,
    Request,
    Sampling,
    TokenLogprob,
    ToolCallDelta,
    checkpoint_name,
    collect,
)

__all__ = [
    "ACCESSORY_SAMPLING",
    "Answer",
    "ChatOptions",
    "Delta",
    "End",
    "Engine",
    "Event",
    "Queued",
    "Reasoning",
    "Rendered",
    "Request",
    "Sampling",
    "TokenLogprob",
    "ToolCallDelta",
    "checkpoint_name",
    "collect",
]
