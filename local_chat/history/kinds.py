"""What a chat entry is (`Kind`) and where a tool call the page runs stands (`Approval`): the page writes them
(ui/turns.py, ui/tool_rounds.py), the store keeps and reads them (history/). Each is a StrEnum whose value is what
the saved conversations hold, so a stored entry reads as before."""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    """An entry's kind, under its "kind" key; a question and an answer are stored without one (their role says)."""

    QUESTION = "question"
    ANSWER = "answer"
    THINKING = "thinking"  # a reasoning model's thought, folded above its answer
    ERROR = "error"  # the sentence of an answer that failed
    NOTICE = "notice"  # a note in the chat (older turns left out)
    STATS = "stats"  # an answer's figures
    STOPPED = "stopped"  # the note of an answer Stop cut short
    SOURCES = "sources"  # the documents an answer read
    TOOL_CALL = "tool_call"  # a call the model made (with its `Approval` where the page runs it)
    TOOL_RESULT = "tool_result"


class Approval(StrEnum):
    """Where a tool call the page runs stands."""

    ASK = "ask"  # open, waiting for the user
    ALLOWED = "allowed"  # to run, this once
    ALWAYS = "always"  # to run, and the tool allowed from now on
    RUNNING = "running"
    DENIED = "denied"
    DONE = "done"
    STOPPED = "stopped"  # Stop came while it ran
    NOT_RUN = "not_run"  # the conversation went on without it


NOT_FOR_THE_MODEL = (Kind.NOTICE, Kind.STATS, Kind.STOPPED, Kind.SOURCES)  # entries the model is never sent
