"""Errors: `UserError` (defined in the dependency-free `user_error` module) and how other errors are described."""

from user_error import UserError

__all__ = ["UserError", "described"]


def described(error: BaseException, limit: int = 200) -> str:
    """ "RuntimeError: the first line of its message", short enough for a sentence."""
    first = next(iter(str(error).strip().splitlines()), "")[:limit]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
