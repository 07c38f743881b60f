"""The one exception type for mistakes a user can make and fix."""


class UserError(Exception):
    """A problem the user caused and can fix; its message is one sentence naming the problem and the fix.

    Launchers print it without a traceback and exit with code 1; the chat shows it as a message.
    """
