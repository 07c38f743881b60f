"""Errors: `UserError`, the one exception type for mistakes a user can make and fix, and `described`, how any
other error is told in a sentence. Imports nothing: every layer may raise and describe errors."""

__all__ = ["UserError", "described", "failure_sentence"]


NO_HEARING = (
    "This model cannot hear recordings; send the message without one, or load a model that hears (Qwen2-Audio, say)."
)
NO_EYES_HERE = (
    "This model's image processor needs torchvision, which does not load here, so it takes no images; send the "
    "message without the image, or install the torchvision release built for this torch (pytorch.org lists them)."
)


class UserError(ValueError):
    """A problem the user caused and can fix; its message is one sentence naming the problem and the fix.

    Launchers print it without a traceback and exit with code 1; the chat shows it as a message. It is a
    `ValueError`, so callers that caught the `ValueError`s of Accessory's API (an unknown template name) still do.
    """


def described(error: BaseException, limit: int = 200) -> str:
    """ "RuntimeError: the first line of its message", short enough for a sentence."""
    first = next(iter(str(error).strip().splitlines()), "")[:limit]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def failure_sentence(error: BaseException) -> str:
    """What the chat says when generation failed for a reason the user cannot fix (the terminal has the details)."""
    return (
        f"The model failed while answering ({described(error)}); send the message again, and if it keeps "
        "failing see the app's terminal for the details."
    )
