"""The one exception type for mistakes a user can make and fix."""


class UserError(Exception):
    """A problem the user caused and can fix; its message is one sentence naming the problem and the fix.

    Launchers print it without a traceback and exit with code 1; the chat shows it as a message.
    """


def described(error: BaseException, limit: int = 200) -> str:
    """"RuntimeError: the first line of its message", short enough for a sentence."""
    first = next(iter(str(error).strip().splitlines()), "")[:limit]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
