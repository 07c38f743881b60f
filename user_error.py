"""The one exception type for mistakes a user can make and fix. It imports nothing, so that `templates/` and
`conversation/` can raise it and still import nothing else of the project."""


class UserError(ValueError):
    """A problem the user caused and can fix; its message is one sentence naming the problem and the fix.

    Launchers print it without a traceback and exit with code 1; the chat shows it as a message. It is a
    `ValueError`, so callers that caught the `ValueError`s of Accessory's API (an unknown template name) still do.
    """
