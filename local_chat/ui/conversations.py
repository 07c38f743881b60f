"""The chat tab's saved conversations (ui/history.py, history/store.py): the sidebar (New chat, this owner's
conversations newest first, rename, delete, export, import), its handlers and their wiring. `ChatTab` (ui/chat_tab.py)
is built on it: these methods use its `saved`, `_owner`, `stop`, `switch`, `tools_of`, `picker` and the components its
`build` made."""

from __future__ import annotations

import gradio as gr

from local_chat.errors import UserError

from .thinking import EFFORTS, ENGINE_THINKING, thinking_choices
from .turns import view
from .wiring import UI_ONLY, with_view

FIRST_PAINT = 16  # the entries a reopened conversation shows at once, before the page has opened it


class SavedConversations:
    def first_load(self, browser_id, was_open, request: gr.Request):
        """The page's first load: the browser's id (made now if it has none), its conversations, and the one that
        was open on its page before (a reload), reopened: (id, list, chat, conversation, title, its last prompt)."""
        browser_id = self.saved.browser_id(browser_id)
        owner = self._owner(browser_id, request)
        shown, conversation_id, title, prompt = [], None, "", ""
        was_open = was_open.get("conversation") if isinstance(was_open, dict) else None
        if isinstance(was_open, str):
            try:
                found = self.saved.opened(request.session_hash, owner, was_open)
                shown, conversation_id, title = self.saved.shown(owner, found.id, found.messages), found.id, found.title
                prompt = found.options.get("prompt", "")
            except UserError:  # deleted meanwhile (in another tab), or another login's: an empty chat
                pass
        listed = self.saved.listed(owner, conversation_id)
        return browser_id, listed, shown, conversation_id, title, prompt

    def peek(self, chosen, browser_id, request: gr.Request):
        """The chosen conversation's last entries (`FIRST_PAINT`), shown at once while `open` (queued) opens it, and
        the answer that streams stopped: the Chatbot's value."""
        self.stop(request)
        try:
            owner = self._owner(browser_id, request)
            found = self.saved.store.get(owner, chosen)
        except UserError:
            return gr.skip()
        return view(self.saved.shown(owner, found.id, found.messages[-FIRST_PAINT:]))

    def open(self, chosen, browser_id, request: gr.Request):
        """Reopen one of this owner's conversations: (chat, conversation, title, note, its last prompt)."""
        if not chosen:
            return gr.skip(), gr.skip(), gr.skip(), "", gr.skip()
        try:
            owner = self._owner(browser_id, request)
            found = self.saved.opened(request.session_hash, owner, chosen)
        except UserError as error:
            return gr.skip(), gr.skip(), gr.skip(), str(error), gr.skip()
        prompt = found.options.get("prompt", "")
        return self.saved.shown(owner, found.id, found.messages), found.id, found.title, "", prompt

    def offer_of(self, conversation_id, browser_id, current, request: gr.Request):
        """With a model picker: the open conversation's model offered, where it is another than the session's."""
        model = None
        if conversation_id:
            try:
                model = self.saved.store.get(self._owner(browser_id, request), conversation_id).model
            except UserError:  # deleted meanwhile: nothing to offer
                pass
        return self.picker.offer_model(model, current)

    def thinking_of(self, conversation_id, browser_id, model, request: gr.Request):
        """The thinking switch as the open conversation left it (else as the template starts it); with a picker,
        as the session's model's template allows."""
        variable, first = self.switch
        if self.single_turn or (variable is None and self.picker is None):
            return gr.skip()
        try:
            owner = self._owner(browser_id, request)
            kept = self.saved.store.get(owner, conversation_id).options.get("thinking") if conversation_id else None
        except UserError:
            kept = None
        if self.picker is not None:
            _, choices, first = thinking_choices(self.engine_of(model))
            return kept if kept in choices else first
        fits = isinstance(kept, bool) if isinstance(first, bool) else kept in (EFFORTS + ENGINE_THINKING)
        return kept if fits else first

    def switches_of(self, conversation_id, browser_id, model, request: gr.Request):
        """The open conversation's thinking switch and Tools control, as it left them, and the controls under its
        messages (ui/branches.py)."""
        thinking, tools = (
            self.thinking_of(conversation_id, browser_id, model, request),
            self.tools_of(conversation_id, browser_id, request),
        )
        return thinking, tools, self.points_of(conversation_id, browser_id, request)

    @staticmethod
    def new_chat():
        return [], None, gr.update(value=None), "", "", None, ""

    @staticmethod
    def conversation_actions(conversation_id):
        """What depends on which conversation is open: the browser's memory of it (a reload reopens it), the actions
        that need one (enabled only then), and a delete confirmation, which belonged to the one before."""
        needs_one = gr.update(interactive=conversation_id is not None)
        # in a dict: the browser keeps no empty value, and a reload after New chat must find "none open"
        return {"conversation": conversation_id}, *[needs_one] * 6, gr.update(visible=False), None

    def rename(self, conversation_id, title, browser_id, request: gr.Request):
        try:
            owner = self._owner(browser_id, request)
            if conversation_id is None:
                raise UserError("Send a message first: a new chat gets its title from it.")
            self.saved.store.rename(owner, conversation_id, title)
        except UserError as error:
            return gr.skip(), str(error)
        return self.saved.listed(owner, conversation_id), "Renamed."

    def delete(self, asked_for, conversation_id, browser_id, request: gr.Request):
        """Delete the conversation the confirmation was asked for (`asked_for`), only while it is the one open."""
        if asked_for is None or asked_for != conversation_id:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), "Nothing was deleted: open the conversation to delete."
        try:
            owner = self._owner(browser_id, request)
            self.saved.store.delete(owner, conversation_id)
        except UserError as error:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), str(error)
        return [], None, self.saved.listed(owner, None), "", "Deleted."

    def export(self, kind: str):
        def export(conversation_id, browser_id, request: gr.Request):
            try:
                if conversation_id is None:
                    raise UserError("There is nothing to export yet: send a message first.")
                path = self.saved.export(self._owner(browser_id, request), conversation_id, kind)
            except UserError as error:
                return gr.update(visible=False), str(error)
            return gr.update(value=path, visible=True), ""

        return export

    def import_file(self, file, browser_id, request: gr.Request):
        path = file if isinstance(file, str) else getattr(file, "name", None)
        try:
            owner = self._owner(browser_id, request)
            conversation_id = self.saved.import_file(owner, path)
            found = self.saved.opened(request.session_hash, owner, conversation_id)
        except UserError as error:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), str(error)
        shown = self.saved.shown(owner, conversation_id, found.messages)
        listed = self.saved.listed(owner, conversation_id)
        return shown, conversation_id, listed, found.title, "Imported."

    # ----- the sidebar -----

    def build_sidebar(self) -> None:
        """New chat and this owner's conversations, newest first (reopen, rename, delete, export, import)."""
        with gr.Sidebar(label="Conversations", open=True, elem_classes="conversations"):
            self.new_button = gr.Button("New chat", variant="primary", size="sm")
            self.build_search()  # ui/branches.py
            self.sidebar_list = gr.Radio([], value=None, show_label=False, container=False, elem_classes="chat-list")
            with gr.Accordion("This conversation", open=False):
                none_open = dict(interactive=False)  # until a conversation is open (`conversation_actions`)
                self.title = gr.Textbox(label="Title", max_lines=1, **none_open)
                self.rename_button = gr.Button("Rename", size="sm", **none_open)
                self.pinned = gr.Checkbox(False, label="Pinned to the top of the list", **none_open)
                with gr.Row():
                    self.export_json = gr.Button("Export JSON", size="sm", **none_open)
                    self.export_markdown = gr.Button("Export Markdown", size="sm", **none_open)
                self.download = gr.File(label="Export", visible=False, interactive=False)
                self.delete_button = gr.Button("Delete", variant="stop", size="sm", **none_open)
                with gr.Row(visible=False) as self.confirm_row:
                    self.confirm_delete = gr.Button("Yes, delete it", variant="stop", size="sm")
                    self.keep = gr.Button("Keep it", size="sm")
            self.import_button = gr.UploadButton("Import", file_types=[".json", ".md"], size="sm")
            self.note = gr.Markdown(elem_classes="stats")
            self.build_nav()

    def wire_sidebar(self, browser_id, app: gr.Blocks) -> None:
        quiet = dict(api_visibility=UI_ONLY)
        chatbot, entries, conversation_id, chats = self.chatbot, self.entries, self.conversation_id, self.sidebar_list
        chat = [chatbot, entries]
        was_open = self.saved.browser_state("open")  # the conversation open on this browser's page
        asked_to_delete = gr.State(None)  # the conversation a delete confirmation is shown for
        restore = dict(
            fn=self.switches_of,
            inputs=[conversation_id, browser_id, self.model_state],
            outputs=[self.thinking, self.tools_box, self.nav],
            **quiet,
        )
        loaded = app.load(
            with_view(self.first_load, at=2),
            [browser_id, was_open],
            [browser_id, chats, *chat, conversation_id, self.title, self.prompt_view],
            **quiet,
        )
        takes_text = dict(fn=lambda: gr.update(interactive=True), inputs=None, outputs=self.message, **quiet)
        restored = loaded.success(**takes_text).then(**restore)
        # what was typed in the search before the page had its id, searched now (ui/branches.py)
        restored.then(self.search, [self.search_box, browser_id], [self.found_list, chats], **quiet)
        if self.always_box is not None:  # this login's always-allowed tools
            restored.then(self.always_of, browser_id, self.always_box, **quiet)
        loaded.failure(**takes_text)  # the message box takes text even so: a message then says what is wrong
        actions = [self.title, self.rename_button, self.pinned, self.export_json, self.export_markdown]
        actions.append(self.delete_button)
        conversation_id.change(
            self.conversation_actions, conversation_id, [was_open, *actions, self.confirm_row, asked_to_delete], **quiet
        )
        if self.picker is not None:  # reopening a conversation offers the model of its latest answer
            offer = [self.picker.status, self.picker.offer, self.picker.offered]
            conversation_id.change(self.offer_of, [conversation_id, browser_id, self.model_state], offer, **quiet)
        stop = dict(fn=self.stop, inputs=None, outputs=None, cancels=self.runs, queue=False, **quiet)
        # New chat, and Gradio's own clear of the chat (hidden by CSS), leave the saved conversation as it is
        for trigger in (self.new_button.click, chatbot.clear):
            trigger(**stop).then(
                with_view(self.new_chat), None,
                [*chat, conversation_id, chats, self.title, self.note, self.download, self.prompt_view],
                **quiet,
            ).then(**restore)  # fmt: skip
        # at once (no queue): the answer that streams stops, the conversation's end shows; then the page opens it
        # (always_last: a click while the one before is still opening is not dropped)
        at_once = dict(cancels=self.runs, queue=False, show_progress="hidden", trigger_mode="always_last", **quiet)
        chats.input(self.peek, [chats, browser_id], chatbot, **at_once).then(
            with_view(self.open),
            [chats, browser_id],
            [*chat, conversation_id, self.title, self.note, self.prompt_view],
            show_progress="hidden",
            **quiet,
        ).then(**restore)
        self.rename_button.click(self.rename, [conversation_id, self.title, browser_id], [chats, self.note], **quiet)
        for button, kind in ((self.export_json, "json"), (self.export_markdown, "md")):
            button.click(self.export(kind), [conversation_id, browser_id], [self.download, self.note], **quiet)
        shown, hidden = gr.update(visible=True), gr.update(visible=False)
        self.delete_button.click(lambda c: (shown, c), conversation_id, [self.confirm_row, asked_to_delete], **quiet)
        self.keep.click(lambda: (hidden, None), None, [self.confirm_row, asked_to_delete], **quiet)
        self.confirm_delete.click(**stop).then(
            with_view(self.delete),
            [asked_to_delete, conversation_id, browser_id],
            [*chat, conversation_id, chats, self.title, self.note],
            **quiet,
        ).then(lambda: (hidden, None), None, [self.confirm_row, asked_to_delete], **quiet).then(**restore)
        self.wire_branches(browser_id, restore)
        self.import_button.upload(
            with_view(self.import_file),
            [self.import_button, browser_id],
            [*chat, conversation_id, chats, self.title, self.note],
            **quiet,
        ).then(**restore)
