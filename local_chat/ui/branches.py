"""Branches on the page (history/tree.py keeps them), pins and search: a mixin of `ChatTab` (ui/chat_tab.py), built
and wired with the sidebar (ui/conversations.py). With saved conversations only: without them nothing keeps a tree.

Under each message of the branch on screen that has siblings (the earlier answers of a regenerated question, the
earlier versions of an edited one), "‹ 2/3 ›" shows another, down to its newest message; Fork (a new conversation
of the branch down to that message) and Remove (the message and everything under it) show on hover. Gradio's Chatbot
shows a message's own buttons under the last message only, so these are drawn by the page's script: `NAV_JS`, run by
a `gr.HTML` whose value holds the branch's points (`nav_value`), puts a bar after each message that has one, and a
click sends ("go", "fork" or "delete", the node) back to Python as that component's "branch" event.

The sidebar's search finds this owner's conversations by the words of their titles and messages as the user types
(history/branches.py), and a result opens its conversation on the branch of the message that matched.
"""

from __future__ import annotations

import gradio as gr

from local_chat.errors import UserError

from . import turns
from .layout import static_text
from .wiring import UI_ONLY, with_view

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


class Branching:
    # ----- the controls under the messages -----

    def points_of(self, conversation_id, browser_id, request: gr.Request) -> dict:
        if not (self.saving and conversation_id):
            return {"conversation": None, "points": []}
        try:
            return nav_value(self.saved.store.get(self._owner(browser_id, request), conversation_id))
        except UserError:  # deleted meanwhile
            return {"conversation": None, "points": []}

    def on_branch(self, value, conversation_id, browser_id, request: gr.Request):
        """A click under a message: show a sibling ("go"), fork there, or delete it; (chat, conversation, list,
        title, prompt, nav, note)."""
        action = (value or {}).get("action") or {}
        what, node = action.get("do"), action.get("node")
        try:
            owner = self._owner(browser_id, request)
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
            return *[gr.skip()] * 6, str(error)
        note = {"fork": "Forked: this is the new conversation.", "delete": "Removed."}.get(what, "")
        return *self._reopened(owner, conversation_id, request), note

    def _reopened(self, owner, conversation_id, request: gr.Request) -> tuple:
        """(chat, conversation, list, title, prompt, nav) of a conversation opened again, and the page's read
        revision of it."""
        found = self.saved.opened(request.session_hash, owner, conversation_id)
        listed = self.saved.listed(owner, found.id)
        shown = self.saved.shown(owner, found.id, found.messages)
        return shown, found.id, listed, found.title, found.options.get("prompt", ""), nav_value(found)

    # ----- search and pins -----

    def search(self, text, browser_id, request: gr.Request):
        """The sidebar's search as the user types: (the results, the conversations' list), one shown at a time."""
        if not (text or "").strip():
            return gr.update(choices=[], value=None, visible=False), gr.update(visible=True)
        if not getattr(request, "username", None) and not self.saved.has_browser_id(browser_id):
            # typed before the page's first load gave it its id: searched again once it has (ui/conversations.py)
            return gr.update(choices=[], info=STILL_LOADING, visible=True), gr.update(visible=False)
        try:
            found = self.saved.store.search(self._owner(browser_id, request), text)
        except UserError as error:
            return gr.update(choices=[], info=str(error), visible=True), gr.update(visible=False)
        choices = [(f"{f.title} — {f.snippet}" if f.node else f.snippet, f"{f.conversation}/{f.node or ''}")
                   for f in found]  # fmt: skip
        return gr.update(choices=choices, value=None, info=None if choices else NO_RESULT, visible=True), gr.update(
            visible=False
        )

    def open_found(self, choice, browser_id, request: gr.Request):
        """A search result opened on the branch of the message that matched: (chat, conversation, list, title,
        prompt, nav, note)."""
        if not choice:
            return *[gr.skip()] * 6, ""
        conversation_id, node = split_choice(choice)
        try:
            owner = self._owner(browser_id, request)
            if node is not None:
                self.saved.store.switch(owner, conversation_id, node)
            return *self._reopened(owner, conversation_id, request), ""
        except UserError as error:
            return *[gr.skip()] * 6, str(error)

    def pin(self, pinned, conversation_id, browser_id, request: gr.Request):
        """Pin the open conversation to the top of the list, or unpin it: (list, note)."""
        try:
            owner = self._owner(browser_id, request)
            self.saved.store.pin(owner, conversation_id, bool(pinned))
        except UserError as error:
            return gr.skip(), str(error)
        return self.saved.listed(owner, conversation_id), ""

    def pinned_of(self, conversation_id, browser_id, request: gr.Request) -> bool:
        if not conversation_id:
            return False
        return self.saved.store.pinned(self._owner(browser_id, request), conversation_id)

    # ----- layout and wiring -----

    def build_search(self) -> None:
        self.search_box = gr.Textbox(
            placeholder="Search conversations", show_label=False, container=False, max_lines=1, elem_classes="search"
        )
        self.found_list = gr.Radio([], value=None, show_label=False, visible=False, elem_classes="chat-list found")

    def build_nav(self) -> None:
        self.nav = gr.HTML(
            {"conversation": None, "points": []},
            html_template="",
            js_on_load=NAV_JS,
            visible="hidden",
            elem_classes="branch-nav",
        )

    def wire_branches(self, browser_id, restore: dict) -> None:
        """The events of the controls under the messages, the search and the pin; `restore`: the step that sets the
        open conversation's switches and draws the controls again."""
        quiet = dict(api_visibility=UI_ONLY)
        conversation_id, chats = self.conversation_id, self.sidebar_list
        stop = dict(fn=self.stop, inputs=None, outputs=None, cancels=self.runs, queue=False, **quiet)
        opened = [self.chatbot, self.entries, conversation_id, chats, self.title, self.prompt_view, self.nav]
        self.nav.branch(**stop).then(
            with_view(self.on_branch), [self.nav, conversation_id, browser_id], [*opened, self.note], **quiet
        ).then(**restore)
        self.search_box.change(  # as typed, a cleared box too; what was typed meanwhile, once the last ends
            self.search, [self.search_box, browser_id], [self.found_list, chats], trigger_mode="always_last",
            show_progress="hidden", **quiet,
        )  # fmt: skip
        self.found_list.input(**stop).then(
            with_view(self.open_found), [self.found_list, browser_id], [*opened, self.note], **quiet
        ).then(**restore)
        self.pinned.input(self.pin, [self.pinned, conversation_id, browser_id], [chats, self.note], **quiet)
        conversation_id.change(self.pinned_of, [conversation_id, browser_id], self.pinned, **quiet)
