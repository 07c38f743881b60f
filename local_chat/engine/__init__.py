"""The engine interface (engine/interface.py, re-exported here; importing this package imports nothing else) and
what stands on it: chat messages over an engine that takes prompts (engine/chats.py), the model's own process and
its pipe (engine/process.py), another server's model (engine/remote.py), one queue in arrival order for every door
(engine/in_order.py), and a stream read on a thread of its own for an async door (engine/threaded.py)."""

from .interface import (
    ACCESSORY_SAMPLING,
    CHAT_SAMPLING,
    Answer,
    AnswerFormat,
    ChatOptions,
    Delta,
    End,
    Engine,
    EngineSummary,
    Event,
    FinishReason,
    Loading,
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
    "CHAT_SAMPLING",
    "Answer",
    "AnswerFormat",
    "ChatOptions",
    "Delta",
    "End",
    "Engine",
    "EngineSummary",
    "Event",
    "FinishReason",
    "Loading",
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
