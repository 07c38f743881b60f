"""Branches on the page (history/tree.py keeps them), pins and search: built and wired by the sidebar
(ui/conversations.py). With saved conversations only: without them nothing keeps a tree.

Under each message of the branch on screen that has siblings (the earlier answers of a regenerated question, the
earlier versions of an edited one), "‹ 2/3 ›" shows another, down to its newest message; Fork (a new conversation
of the branch down to that message) and Remove (the message and everything under it) show on hover. Gradio's Chatbot
shows a message's own buttons under the last message only, so these are drawn by the page's script: `NAV_JS`, run by
a `gr.HTML` whose value holds the branch's points (`nav_value`), puts a bar after each message that has one, and a
click sends ("go", "fork" or "delete", the node) back to Python as that component's "branch" event.

The sidebar's search finds this owner's conversations by the words of their titles and messages as the user types
(history/store.py), and a result opens its conversation on the branch of the message that matched.
"""

from __future__ import annotations

from typing import NamedTuple

import gradio as gr

from local_chat.errors import UserError

from . import turns
from .layout import static_text
from .wiring import UI_ONLY, updating

FORK_NOTE = "Forked from “{}”: this conversation holds its messages down to the one it was forked at."
NO_RESULT = "No conversation of yours holds these words."
STILL_LOADING = "Your saved conversations are still loading; the search runs once they have."
ACTIONS = ("go", "fork", "delete")
NAV_JS = static_text("branch_nav.js")  # run by the nav component (`build_nav`)


def nav_value(found) -> dict:
    """What the page's script draws under the messages: each node of the branch on screen (a `SavedConversation`)
    with its siblings, at its last message's index."""
    points = [{"index": p.index, "node": p.node, "siblings": list(p.siblings)} for p in found.points]
    return {"conversation": found.id, "points": points}


def split_choice(choice: str) -> tuple[str, str | None]:
    """A search result's (conversation id, node id or None): conversation ids hold no "/" (history/ui ids)."""
    conversation_id, _, node = choice.partition("/")
    return conversation_id, node or None


class Reopened(NamedTuple):
    """A conversation opened again (on another branch, forked, a search's result), and a note."""

    chat: list | object
    conversation_id: str | object
    listed: object
    title: str | object
    prompt: str | object
    nav: dict | object
    note: str


class Found(NamedTuple):
    """The search's results, and the conversations' list (one shown at a time)."""

    found: dict
    listed: dict


class Noted(NamedTuple):
    """The conversations' list, and a note under the sidebar."""

    listed: object
    note: str


class Branches:
    """The controls under the messages, the search and the pin, over `saved` (which keeps conversations); `stop`:
    the chat's Stop, which opening another branch presses."""

    def __init__(self, saved, stop):
        self.saved, self.stop = saved, stop
        self.search_box = self.found = self.nav = None  # once built (`build_search`, `build_nav`)

    def named(self) -> dict:
        return {"search": self.search_box, "found": self.found, "nav": self.nav}

    # ----- the controls under the messages -----

    def points_of(self, conversation_id, browser_id, request: gr.Request) -> dict:
        if not conversation_id:
            return {"conversation": None, "points": []}
        try:
            return nav_value(self.saved.store.get(self.saved.owner(browser_id, request), conversation_id))
        except UserError:  # deleted meanwhile
            return {"conversation": None, "points": []}

    def on_branch(self, value, conversation_id, browser_id, request: gr.Request) -> Reopened:
        """A click under a message: show a sibling ("go"), fork there, or delete it."""
        action = (value or {}).get("action") or {}
        what, node = action.get("do"), action.get("node")
        try:
            owner = self.saved.owner(browser_id, request)
            if not conversation_id or what not in ACTIONS or not isinstance(node, str):
                raise UserError("That control belongs to a conversation no longer open; reopen it.")
            store = self.saved.store
            if what == "go":
                store.switch(owner, conversation_id, node)
            elif what == "delete":
                store.delete_branch(owner, conversation_id, node)
            else:
                note = turns.notice("Forked", FORK_NOTE.format(store.get(owner, conversation_id).title))
                conversation_id = store.fork(owner, conversation_id, node, note)
        except UserError as error:
            return Reopened(*[gr.skip()] * 6, str(error))
        note = {"fork": "Forked: this is the new conversation.", "delete": "Removed."}.get(what, "")
        return self._reopened(owner, conversation_id, request, note)

    def _reopened(self, owner, conversation_id, request: gr.Request, note: str) -> Reopened:
        """A conversation opened again (the page's read revision of it kept), with `note`."""
        found = self.saved.opened(request.session_hash, owner, conversation_id)
        listed = self.saved.listed(owner, found.id)
        shown = self.saved.shown(owner, found.id, found.messages)
        return Reopened(shown, found.id, listed, found.title, found.options.get("prompt", ""), nav_value(found), note)

    # ----- search and pins -----

    def search(self, text, browser_id, request: gr.Request) -> Found:
        """The sidebar's search as the user types: (the results, the conversations' list), one shown at a time."""
        if not (text or "").strip():
            return Found(gr.update(choices=[], value=None, visible=False), gr.update(visible=True))
        if not getattr(request, "username", None) and not self.saved.has_browser_id(browser_id):
            # typed before the page's first load gave it its id: searched again once it has (`search_again`)
            return Found(gr.update(choices=[], info=STILL_LOADING, visible=True), gr.update(visible=False))
        try:
            found = self.saved.store.search(self.saved.owner(browser_id, request), text)
        except UserError as error:
            return Found(gr.update(choices=[], info=str(error), visible=True), gr.update(visible=False))
        choices = [(f"{f.title} — {f.snippet}" if f.node else f.snippet, f"{f.conversation}/{f.node or ''}")
                   for f in found]  # fmt: skip
        shown = gr.update(choices=choices, value=None, info=None if choices else NO_RESULT, visible=True)
        return Found(shown, gr.update(visible=False))

    def open_found(self, choice, browser_id, request: gr.Request) -> Reopened:
        """A search result opened on the branch of the message that matched."""
        if not choice:
            return Reopened(*[gr.skip()] * 6, "")
        conversation_id, node = split_choice(choice)
        try:
            owner = self.saved.owner(browser_id, request)
            if node is not None:
                self.saved.store.switch(owner, conversation_id, node)
            return self._reopened(owner, conversation_id, request, "")
        except UserError as error:
            return Reopened(*[gr.skip()] * 6, str(error))

    def pin(self, pinned, conversation_id, browser_id, request: gr.Request) -> Noted:
        """Pin the open conversation to the top of the list, or unpin it."""
        try:
            owner = self.saved.owner(browser_id, request)
            self.saved.store.pin(owner, conversation_id, bool(pinned))
        except UserError as error:
            return Noted(gr.skip(), str(error))
        return Noted(self.saved.listed(owner, conversation_id), "")

    def pinned_of(self, conversation_id, browser_id, request: gr.Request) -> bool:
        if not conversation_id:
            return False
        return self.saved.store.pinned(self.saved.owner(browser_id, request), conversation_id)

    # ----- layout and wiring -----

    def build_search(self) -> None:
        self.search_box = gr.Textbox(
            placeholder="Search conversations", show_label=False, container=False, max_lines=1, elem_classes="search"
        )
        self.found = gr.Radio([], value=None, show_label=False, visible=False, elem_classes="chat-list found")

    def build_nav(self) -> None:
        self.nav = gr.HTML(
            {"conversation": None, "points": []},
            html_template="",
            js_on_load=NAV_JS,
            visible="hidden",
            elem_classes="branch-nav",
        )

    def search_again(self, event, browser_id, named: dict) -> None:
        """After `event` (the page's first load), what was typed in the search before the page had its id."""
        event.then(**updating(self.search, Found, named), inputs=[self.search_box, browser_id], api_visibility=UI_ONLY)

    def wire(self, named: dict, stop: dict, restore: dict) -> None:
        """The events of the controls under the messages, the search and the pin; `named`: the page's components by
        name; `stop`: the chat's Stop step; `restore`: the step that sets the open conversation's switches and draws
        the controls again."""
        quiet = dict(api_visibility=UI_ONLY)
        conversation_id, browser_id = named["conversation_id"], named["browser_id"]
        self.nav.branch(**stop).then(
            **updating(self.on_branch, Reopened, named), inputs=[self.nav, conversation_id, browser_id], **quiet
        ).then(**restore)
        self.search_box.change(  # as typed, a cleared box too; what was typed meanwhile, once the last ends
            **updating(self.search, Found, named), inputs=[self.search_box, browser_id], trigger_mode="always_last",
            show_progress="hidden", **quiet,
        )  # fmt: skip
        self.found.input(**stop).then(
            **updating(self.open_found, Reopened, named), inputs=[self.found, browser_id], **quiet
        ).then(**restore)
        pinned = named["pinned"]
        pinned.input(**updating(self.pin, Noted, named), inputs=[pinned, conversation_id, browser_id], **quiet)
        conversation_id.change(self.pinned_of, [conversation_id, browser_id], pinned, **quiet)
