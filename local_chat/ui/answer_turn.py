"""One answer's turn (`Turn`): what the chat tab's handlers of one answer share (its engine, settings, request,
cancel flag, conversation, the prompt it was sent), and its keeping where it does not end.

An answer that does not end (Stop, a new message, a closed or reloaded tab, a lost connection, a crash of the
server) is kept as far as it went: the chat tab's `respond` (ui/chat_tab.py) saves it as it begins, every
`SAVE_WHILE_STREAMING_S` while it streams, and when Gradio closes the handler, marked stopped as Stop's own save
marks it (ui/turns.py `marked_stopped`); the answer's end saves it whole."""

from __future__ import annotations

import logging
import threading
import time

import gradio as gr

from local_chat.engine.chats import ChatEngine
from local_chat.errors import UserError
from local_chat.history.kinds import Kind

from . import turns
from .chat_settings import ChatSettings
from .history import SavedChats
from .turns import kind_of

log = logging.getLogger(__name__)
SAVE_WHILE_STREAMING_S = 2.0  # how often a streaming answer is saved as far as it went (marked stopped)


class Turn:
    """One answer (with its tool rounds): the engine, settings, request and cancel flag its steps use, the
    conversation it is saved in, and where it does not end (Stop, a new message, a closed tab, a crash), the
    conversation saved as far as the answer went, marked stopped (ui/turns.py `marked_stopped`), as Stop's own save
    does."""

    def __init__(
        self,
        engine: ChatEngine,
        settings: ChatSettings,
        request: gr.Request,
        cancel: threading.Event,
        saved: SavedChats,
        owner: str | None,
        question_saved: bool,
    ):
        self.engine, self.settings, self.request, self.cancel = engine, settings, request, cancel
        self.saved, self.owner, self.conversation_id = saved, owner, settings.conversation_id
        self.question_saved = question_saved  # else (an edit, a regeneration): saved only once an answer came
        self.prompt, self.ended, self.begun, self.saved_at = gr.skip(), False, False, time.monotonic()
        self.stopped = False  # it ended cancelled: marked so under its figures
        self.documents = None  # what the answer read of the documents (documents/context.py's Context), shown under it
        self.findings = None  # the web search's pages, with the Search the web switch (web/context.py's WebFindings)
        self.web = None  # what the answer read of them (web/context.py's WebContext), shown under it

    def now_and_then(self, history: list[dict]) -> None:
        """Save the answer so far once it begins, then every `SAVE_WHILE_STREAMING_S`, so that a crash of the
        server keeps it."""
        if self.begun:
            if time.monotonic() - self.saved_at >= SAVE_WHILE_STREAMING_S:
                self._save(history)
        elif any(e["content"] for e in history[-2:] if kind_of(e) in (Kind.ANSWER, Kind.THINKING)):
            self.begun = True
            self._save(history)

    def save(self, history: list[dict]) -> None:
        """Once the answer is over: where it did not end, save it as far as it went."""
        if not self.ended:
            self._save(history)

    def _save(self, history: list[dict]) -> None:
        self.saved_at = time.monotonic()
        marked = turns.marked_stopped(history) or history
        answered = any(e["content"] for e in marked if kind_of(e) in (Kind.ANSWER, Kind.THINKING, Kind.ERROR))
        if self.owner is None or not (answered or self.question_saved):
            return
        try:  # the conversation only: the sidebar's list is the answer's end's to update
            self.saved.save(self.request.session_hash, self.owner, self.conversation_id, marked)
        except UserError as error:  # changed in another window meanwhile: that one's stays
            log.warning("The cut answer was not saved: %s", error)
