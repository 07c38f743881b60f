"""The saved conversations' sidebar (ui/history.py, history/store.py): New chat, this owner's conversations newest
first, rename, pin, delete, export, import, and the search and branch controls (ui/branches.py); its handlers and
their wiring to the chat tab that keeps saved conversations (ui/chat_tab.py), whose `ChatParts` it updates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import gradio as gr

from local_chat.errors import UserError

from .branches import Branches, Noted
from .turns import view
from .wiring import UI_ONLY, updating

FIRST_PAINT = 16  # the entries a reopened conversation shows at once, before the page has opened it


@dataclass(frozen=True)
class SidebarParts:
    """The sidebar's own components (`Sidebar.build`), named as its handlers' records name them."""

    new: gr.Button
    listed: gr.Radio  # this owner's conversations
    title: gr.Textbox
    rename: gr.Button
    pinned: gr.Checkbox
    export_json: gr.Button
    export_markdown: gr.Button
    download: gr.File
    delete: gr.Button
    confirm_row: gr.Row
    confirm_delete: gr.Button
    keep: gr.Button
    import_button: gr.UploadButton
    note: gr.Markdown
    was_open: gr.BrowserState  # the conversation open on this browser's page (a reload reopens it)
    asked_to_delete: gr.State  # the conversation a delete confirmation is shown for

    def named(self) -> dict:
        return dict(vars(self))  # the components themselves, not copies


class FirstLoad(NamedTuple):
    browser_id: str
    listed: object
    chat: list
    conversation_id: str | None
    title: str
    prompt: str


class Opened(NamedTuple):
    chat: list | object
    conversation_id: str | None | object
    title: str | object
    note: str
    prompt: str | object


class Emptied(NamedTuple):
    """New chat: the chat empty, no conversation open."""

    chat: list
    conversation_id: None
    listed: object
    title: str
    note: str
    download: object
    prompt: str


class Actions(NamedTuple):
    """What depends on which conversation is open."""

    was_open: dict
    title: object
    rename: object
    pinned: object
    export_json: object
    export_markdown: object
    delete: object
    confirm_row: object
    asked_to_delete: None


class Replaced(NamedTuple):
    """A conversation deleted (the chat empty) or imported (the chat its)."""

    chat: list | object
    conversation_id: str | None | object
    listed: object
    title: str | object
    note: str


class Exported(NamedTuple):
    download: object
    note: str


class Sidebar:
    """The sidebar over `saved` (which keeps conversations: this exists only then); `stop`: the chat's Stop, which
    opening another conversation presses; `picker`: the model picker, where the page has one (a reopened
    conversation offers its model)."""

    def __init__(self, saved, stop, picker=None):
        self.saved, self.stop, self.picker = saved, stop, picker
        self.branches = Branches(saved, stop)
        self.parts: SidebarParts | None = None  # once built

    @property
    def listed(self):
        return self.parts.listed

    def first_load(self, browser_id, was_open, request: gr.Request):
        """The page's first load: the browser's id (made now if it has none), its conversations, and the one that
        was open on its page before (a reload), reopened: (id, list, chat, conversation, title, its last prompt)."""
        browser_id = self.saved.browser_id(browser_id)
        owner = self.saved.owner(browser_id, request)
        shown, conversation_id, title, prompt = [], None, "", ""
        was_open = was_open.get("conversation") if isinstance(was_open, dict) else None
        if isinstance(was_open, str):
            try:
                found = self.saved.opened(request.session_hash, owner, was_open)
                shown, conversation_id, title = self.saved.shown(owner, found.id, found.messages), found.id, found.title
                prompt = found.options.get("prompt", "")
            except UserError:  # deleted meanwhile (in another tab), or another login's: an empty chat
                pass
        return FirstLoad(browser_id, self.saved.listed(owner, conversation_id), shown, conversation_id, title, prompt)

    def peek(self, chosen, browser_id, request: gr.Request):
        """The chosen conversation's last entries (`FIRST_PAINT`), shown at once while `open` (queued) opens it, and
        the answer that streams stopped: the Chatbot's value."""
        self.stop(request)
        try:
            owner = self.saved.owner(browser_id, request)
            found = self.saved.store.get(owner, chosen)
        except UserError:
            return gr.skip()
        return view(self.saved.shown(owner, found.id, found.messages[-FIRST_PAINT:]))

    def open(self, chosen, browser_id, request: gr.Request):
        """Reopen one of this owner's conversations: (chat, conversation, title, note, its last prompt)."""
        if not chosen:
            return Opened(gr.skip(), gr.skip(), gr.skip(), "", gr.skip())
        try:
            owner = self.saved.owner(browser_id, request)
            found = self.saved.opened(request.session_hash, owner, chosen)
        except UserError as error:
            return Opened(gr.skip(), gr.skip(), gr.skip(), str(error), gr.skip())
        prompt = found.options.get("prompt", "")
        return Opened(self.saved.shown(owner, found.id, found.messages), found.id, found.title, "", prompt)

    def offer_of(self, conversation_id, browser_id, current, request: gr.Request):
        """With a model picker: the open conversation's model offered, where it is another than the session's."""
        model = None
        if conversation_id:
            try:
                model = self.saved.store.get(self.saved.owner(browser_id, request), conversation_id).model
            except UserError:  # deleted meanwhile: nothing to offer
                pass
        return self.picker.offer_model(model, current)

    @staticmethod
    def new_chat() -> Emptied:
        return Emptied([], None, gr.update(value=None), "", "", None, "")

    @staticmethod
    def conversation_actions(conversation_id) -> Actions:
        """What depends on which conversation is open: the browser's memory of it (a reload reopens it), the actions
        that need one (enabled only then), and a delete confirmation, which belonged to the one before."""
        needs_one = gr.update(interactive=conversation_id is not None)
        # in a dict: the browser keeps no empty value, and a reload after New chat must find "none open"
        return Actions({"conversation": conversation_id}, *[needs_one] * 6, gr.update(visible=False), None)

    def rename(self, conversation_id, title, browser_id, request: gr.Request) -> Noted:
        try:
            owner = self.saved.owner(browser_id, request)
            if conversation_id is None:
                raise UserError("Send a message first: a new chat gets its title from it.")
            self.saved.store.rename(owner, conversation_id, title)
        except UserError as error:
            return Noted(gr.skip(), str(error))
        return Noted(self.saved.listed(owner, conversation_id), "Renamed.")

    def delete(self, asked_for, conversation_id, browser_id, request: gr.Request) -> Replaced:
        """Delete the conversation the confirmation was asked for (`asked_for`), only while it is the one open."""
        if asked_for is None or asked_for != conversation_id:
            return Replaced(*[gr.skip()] * 4, "Nothing was deleted: open the conversation to delete.")
        try:
            owner = self.saved.owner(browser_id, request)
            self.saved.store.delete(owner, conversation_id)
        except UserError as error:
            return Replaced(*[gr.skip()] * 4, str(error))
        return Replaced([], None, self.saved.listed(owner, None), "", "Deleted.")

    def export(self, kind: str):
        def export(conversation_id, browser_id, request: gr.Request) -> Exported:
            try:
                if conversation_id is None:
                    raise UserError("There is nothing to export yet: send a message first.")
                path = self.saved.exports.export(self.saved.owner(browser_id, request), conversation_id, kind)
            except UserError as error:
                return Exported(gr.update(visible=False), str(error))
            return Exported(gr.update(value=path, visible=True), "")

        return export

    def import_file(self, file, browser_id, request: gr.Request) -> Replaced:
        path = file if isinstance(file, str) else getattr(file, "name", None)
        try:
            owner = self.saved.owner(browser_id, request)
            conversation_id = self.saved.exports.import_file(owner, path)
            found = self.saved.opened(request.session_hash, owner, conversation_id)
        except UserError as error:
            return Replaced(*[gr.skip()] * 4, str(error))
        shown = self.saved.shown(owner, conversation_id, found.messages)
        return Replaced(shown, conversation_id, self.saved.listed(owner, conversation_id), found.title, "Imported.")

    # ----- the sidebar -----

    def build(self) -> SidebarParts:
        """New chat and this owner's conversations, newest first (reopen, rename, delete, export, import)."""
        with gr.Sidebar(label="Conversations", open=True, elem_classes="conversations"):
            new = gr.Button("New chat", variant="primary", size="sm")
            self.branches.build_search()
            listed = gr.Radio([], value=None, show_label=False, container=False, elem_classes="chat-list")
            with gr.Accordion("This conversation", open=False):
                none_open = dict(interactive=False)  # until a conversation is open (`conversation_actions`)
                title = gr.Textbox(label="Title", max_lines=1, **none_open)
                rename = gr.Button("Rename", size="sm", **none_open)
                pinned = gr.Checkbox(False, label="Pinned to the top of the list", **none_open)
                with gr.Row():
                    export_json = gr.Button("Export JSON", size="sm", **none_open)
                    export_markdown = gr.Button("Export Markdown", size="sm", **none_open)
                download = gr.File(label="Export", visible=False, interactive=False)
                delete = gr.Button("Delete", variant="stop", size="sm", **none_open)
                with gr.Row(visible=False) as confirm_row:
                    confirm_delete = gr.Button("Yes, delete it", variant="stop", size="sm")
                    keep = gr.Button("Keep it", size="sm")
            import_button = gr.UploadButton("Import", file_types=[".json", ".md"], size="sm")
            note = gr.Markdown(elem_classes="stats")
            self.branches.build_nav()
        self.parts = SidebarParts(
            new, listed, title, rename, pinned, export_json, export_markdown, download, delete, confirm_row,
            confirm_delete, keep, import_button, note, self.saved.browser_state("open"), gr.State(None),
        )  # fmt: skip
        return self.parts

    def wire(self, app: gr.Blocks, chat) -> None:
        """The sidebar's events over `chat` (the `ChatTab` that keeps saved conversations, built): its `parts`,
        the events that answer (`runs`, which opening another conversation cancels), and its `restore_step`."""
        parts, mine = chat.parts, self.parts
        named = parts.named() | mine.named() | self.branches.named()
        quiet = dict(api_visibility=UI_ONLY)
        conversation_id, browser_id = parts.conversation_id, parts.browser_id
        restore = chat.restore_step()
        loaded = app.load(**updating(self.first_load, FirstLoad, named), inputs=[browser_id, mine.was_open], **quiet)
        takes_text = dict(fn=lambda: gr.update(interactive=True), inputs=None, outputs=parts.box, **quiet)
        restored = loaded.success(**takes_text).then(**restore)
        # what was typed in the search before the page had its id, searched now (ui/branches.py)
        self.branches.search_again(restored, browser_id, named)
        if chat.tools.servers is not None:  # this login's always-allowed tools
            restored.then(chat.tools.always_of, browser_id, parts.always, **quiet)
        loaded.failure(**takes_text)  # the message box takes text even so: a message then says what is wrong
        conversation_id.change(**updating(self.conversation_actions, Actions, named), inputs=conversation_id, **quiet)
        if self.picker is not None:  # reopening a conversation offers the model of its latest answer
            offer = [self.picker.status, self.picker.offer, self.picker.offered]
            conversation_id.change(self.offer_of, [conversation_id, browser_id, parts.model], offer, **quiet)
        stop = dict(fn=self.stop, inputs=None, outputs=None, cancels=chat.runs, queue=False, **quiet)
        # New chat, and Gradio's own clear of the chat (hidden by CSS), leave the saved conversation as it is
        for trigger in (mine.new.click, parts.chatbot.clear):
            trigger(**stop).then(**updating(self.new_chat, Emptied, named), **quiet).then(**restore)
        # at once (no queue): the answer that streams stops, the conversation's end shows; then the page opens it
        # (always_last: a click while the one before is still opening is not dropped)
        at_once = dict(cancels=chat.runs, queue=False, show_progress="hidden", trigger_mode="always_last", **quiet)
        mine.listed.input(self.peek, [mine.listed, browser_id], parts.chatbot, **at_once).then(
            **updating(self.open, Opened, named), inputs=[mine.listed, browser_id], show_progress="hidden", **quiet
        ).then(**restore)
        mine.rename.click(
            **updating(self.rename, Noted, named), inputs=[conversation_id, mine.title, browser_id], **quiet
        )
        for button, kind in ((mine.export_json, "json"), (mine.export_markdown, "md")):
            button.click(**updating(self.export(kind), Exported, named), inputs=[conversation_id, browser_id], **quiet)
        shown, hidden = gr.update(visible=True), gr.update(visible=False)
        confirm = [mine.confirm_row, mine.asked_to_delete]
        mine.delete.click(lambda c: (shown, c), conversation_id, confirm, **quiet)
        mine.keep.click(lambda: (hidden, None), None, confirm, **quiet)
        mine.confirm_delete.click(**stop).then(
            **updating(self.delete, Replaced, named),
            inputs=[mine.asked_to_delete, conversation_id, browser_id],
            **quiet,
        ).then(lambda: (hidden, None), None, confirm, **quiet).then(**restore)
        self.branches.wire(named, stop, restore)
        mine.import_button.upload(
            **updating(self.import_file, Replaced, named), inputs=[mine.import_button, browser_id], **quiet
        ).then(**restore)
