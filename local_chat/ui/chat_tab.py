"""The chat tab: its handlers (Send, Regenerate, Edit, Stop, Undo) and its layout, over one engine.

The chat sends chat messages (with the chosen template) to the engine, which renders them (engine/chats.py: the
prompt comes back first, as `Rendered`, and the answer parsed, its reasoning apart), and reads its events on a thread
of its own (`ui.chat.answer_updates`), so the model computes while Gradio sends the update before. A per-session
cancel flag is read before each forward pass, and a handler that Gradio closes stops its stream after the current
step, so Stop, a new message or a closed tab end the answer on the server within a decode step or two. Each handler
takes the `gr.Request` (and an edit its `gr.EditData`) first, where Gradio puts them, then the page's inputs.
"""

from __future__ import annotations

import asyncio
import functools

import gradio as gr

from local_chat.defaults import IMAGE_TRANSFORMS, MAX_TOOL_ROUNDS, MAX_UPLOAD_MB
from local_chat.documents import put_in_prompt
from local_chat.engine import ChatOptions, Engine, Request
from local_chat.engine.chats import ChatEngine
from local_chat.engine.interface import session_key
from local_chat.errors import UserError
from local_chat.history.kinds import Kind
from local_chat.history.tree import answered_again, with_ids
from local_chat.prompting import EMPTY_MESSAGE, conversation_templates, default_system, message_text

from . import turns
from .branches import Branching
from .chat import Cancels, answer_updates
from .chat_settings import ChatSettings, attached_images, edited_question, message_parts
from .conversations import SavedConversations
from .cut_answers import CutAnswer
from .documents import PAGE_PICTURES, as_pictures, read_documents, sources_entry, split_files, with_documents
from .history import SavedChats, new_conversation_id
from .layout import (
    EXAMPLES,
    IMAGE_EXAMPLES,
    busy_box,
    chat_box,
    idle_box,
    prompt_panel,
    sampling_controls,
    shown_prompt,
)
from .thinking import thinking_control, thinking_kwargs, thinking_switch
from .tool_rounds import NOT_ANSWERED, Approvals, ToolRounds
from .turns import kind_of, model_view, unanswered_calls, up_to_last_question, with_calls_closed
from .wiring import GENERATION, UI_ONLY, with_view


class ChatTab(SavedConversations, Branching, ToolRounds):
    """The chat: text and images in one conversation, each image going to the model with the message it was
    attached to; saved as it goes where saved conversations are on (`saved`); or single questions (`single_turn`),
    each answered alone. `history` is Gradio's list of {"role", "content"} messages."""

    def __init__(
        self,
        engine: Engine,
        cancels: Cancels,
        template: str,
        image_transform: str,
        saved: SavedChats,
        single_turn: bool = False,
        max_upload_mb: float = MAX_UPLOAD_MB,
        picker=None,
        tool_servers=None,
        max_tool_rounds: int = MAX_TOOL_ROUNDS,
    ):
        self.engine = ChatEngine.over(engine, template, max_upload_mb)  # chat messages rendered, answers parsed
        self.picker = picker  # --models_dir: each session's model (ui/model_picker.py)
        self.cancels, self.saved, self.single_turn = cancels, saved, single_turn
        self.template, self.image_transform, self.max_upload_mb = template, image_transform, max_upload_mb
        self.name = "chat_single" if single_turn else "chat"  # this tab's Stop
        self.saving = saved.on and not single_turn
        self.tool_servers = tool_servers if not single_turn else None  # --mcp_config (ui/tool_rounds.py)
        self.max_tool_rounds, self.approvals = max_tool_rounds, Approvals(saved.store if saved.on else None)

    def _owner(self, browser_id, request) -> str | None:
        return self.saved.owner(browser_id, request) if self.saving else None

    def engine_of(self, model: str | None, request: gr.Request | None = None) -> ChatEngine:
        """The engine of this session's model (with a picker; `request`: refused where its login may not load it
        and it is not loaded), else the page's."""
        return self.engine if self.picker is None else self.picker.engine_of(model, request)

    # ----- the handlers -----

    async def respond(self, history, settings: ChatSettings, request: gr.Request, question_first: bool = True):
        """Answer the last question of `history` (the typed list, ui/turns.py), or go on after its decided tool calls;
        yields (history, prompt, conversation, its list's update), the conversation saved when the answer ends. A
        reasoning model's thought streams into a Thinking entry above the answer, folded once the answer begins.
        `question_first`: the question is saved before it is answered (a new message); an edit or a regeneration is
        saved only with its answer, so the conversation keeps its earlier turns until one comes. An answer cut by
        Stop, a new message, a closed tab or a crash is saved as far as it went, marked stopped (ui/cut_answers.py)."""
        history = [dict(m) for m in history or []]
        conversation_id, browser_id, thinking = settings.conversation_id, settings.browser_id, settings.thinking
        cancel = self.cancels.fresh(session_key(request.session_hash, self.name))
        listed, first, sources = gr.skip(), None, None
        try:
            engine = self.engine_of(settings.model, request)
            owner = self._owner(browser_id, request)
            if question_first:  # the question is kept
                conversation_id, listed = self._commit(request, owner, conversation_id, history)
            elif owner is not None and conversation_id is None:
                conversation_id = new_conversation_id()
            if not unanswered_calls(history):  # else the calls run first (ToolRounds.decide)
                first, sources = await asyncio.to_thread(  # off the loop: images, documents
                    self._request, engine, history, settings, request, conversation_id, cancel)  # fmt: skip
        except UserError as error:
            yield history + [turns.error(str(error))], "", conversation_id, listed
            return
        cut = CutAnswer(self.saved, request, owner, conversation_id, question_first)
        cut.documents = sources
        try:
            yield history, gr.skip(), conversation_id, listed
            async for shown in self._rounds(engine, first, history, settings, request, cut, cancel):
                yield shown
        finally:
            cut.save(history)  # where the answer did not end: as far as it went, marked stopped
        tools_off = self.tools_off(settings.tools)
        shown, *saved = self._commit_shown(request, owner, conversation_id, history, thinking, cut.prompt, tools_off)
        yield shown, cut.prompt, *saved

    def _request(self, engine, history, settings: ChatSettings, request, conversation_id, cancel) -> tuple:
        """The request that answers `history` as it stands, and the sources of the documents it holds (`UserError`
        where it cannot be sent)."""
        messages = self.saved.for_the_model(model_view(history))
        if self.single_turn:  # each question alone
            messages = messages[-1:]
        if messages[-1]["role"] == "user" and not message_text(messages[-1]["content"]).strip():
            raise UserError(EMPTY_MESSAGE)
        if not engine.sees_images and any(isinstance(m["content"], list) for m in messages):
            messages = [{**m, "content": message_text(m["content"])} for m in messages]
            turns.with_images_left_out(history, settings.model or "This model")
        messages, sources = put_in_prompt(engine, messages, settings.sampling.max_new_tokens, self.saved.shelf)
        system = [{"role": "system", "content": settings.system}] if settings.system is not None else []
        door = f"{self.name}/{conversation_id}" if conversation_id else self.name
        return Request(
            sampling=settings.sampling,
            image_transform=settings.transform,
            session=session_key(request.session_hash, door),
            cancel=cancel,
            messages=system + messages,
            chat=ChatOptions(
                template=settings.template,
                answer_tokens=settings.sampling.max_new_tokens,
                template_kwargs=thinking_kwargs(settings.thinking),
                tools=self.tools_for(engine, settings),
            ),
        ), sources

    async def _answer(self, engine, answer: Request, history: list, asked: int, settings: ChatSettings, cut):
        """`answer`'s updates streamed into `history` from entry `asked` on (a thought, the answer, or its error),
        then its figures; yields (the chat as shown, prompt, conversation, list update) as it grows."""
        line, failed, update = "", False, None
        model = settings.model if self.picker is not None else None  # which model gave the answer, saved with it
        by = f" · {model}" if model else ""
        async for update in answer_updates(engine, answer):
            if update.rendered is not None:
                cut.prompt = shown_prompt(engine, update.rendered.text, update.rendered.images)
                turns.with_dropped_turns(history, update.rendered.dropped_turns, engine.max_seq_len)
                asked = len(history) - 1
            line, failed = update.line + (by if update.ended else ""), update.error is not None
            thought = update.reasoning and turns.thinking(
                update.reasoning, update.thinking_done, update.thought_seconds
            )
            shown = turns.error(update.error) if failed else turns.answer(update.text.strip(), model)
            history[asked:] = [entry for entry in (thought, shown) if entry and entry["content"]]
            if not history[asked:]:
                history.append(turns.answer(""))
            if update.stopped and (marked := turns.marked_stopped(history)):
                history[:] = marked[:-1]  # its thought marked stopped; the mark goes last, as Stop's (`mark_stopped`)
                cut.stopped = True
            # the figures (or the place in the queue) under the answer
            yield (
                history + ([turns.stats(line)] if line and not failed else []),
                cut.prompt,
                cut.conversation_id,
                gr.skip(),
            )
            cut.now_and_then(history)
        if (sources := sources_entry(cut.documents)) and not failed:
            history.append(sources)  # under the answer, folded
        if line and not failed:
            history.append(turns.stats(line))
        if cut.stopped:
            history.append(turns.stopped())
        elif (
            update is not None and update.tool_calls and not failed
        ):  # under the figures: the last entry, where Gradio shows the buttons
            if kind_of(history[asked]) == Kind.ANSWER and not history[asked]["content"]:
                del history[asked]
            history.extend(self.call_cards(update.tool_calls))
        cut.ended = True

    def _commit(self, request: gr.Request, owner, conversation_id, history, thinking=None, prompt=None, tools_off=None):
        """(conversation id, the list's update) once `history` is saved (with the thinking switch's value, where
        the page has one, and the prompt its last answer was sent, which the prompt panel shows again once it is
        reopened); `UserError` where it cannot be (changed in another window since this page read it)."""
        if owner is None:
            return conversation_id, gr.skip()
        given = {"thinking": thinking, "prompt": prompt if isinstance(prompt, str) else None, "tools_off": tools_off}
        options = {key: value for key, value in given.items() if value is not None} or None
        conversation_id = self.saved.save(request.session_hash, owner, conversation_id, history, options)
        return conversation_id, self.saved.listed(owner, conversation_id)

    def _commit_shown(self, request: gr.Request, owner, conversation_id, history, *options) -> tuple:
        """(the chat as shown, conversation id, the list's update) once `history` is saved (with `_commit`'s
        `options`); where it cannot be (changed in another window since this page read it), the chat with the
        sentence under it, nothing saved."""
        try:
            return history, *self._commit(request, owner, conversation_id, history, *options)
        except UserError as error:
            return history + [turns.error(str(error))], gr.skip(), gr.skip()

    @functools.cached_property
    def switch(self) -> tuple[str | None, object]:
        return thinking_switch(self.engine) if not self.single_turn else (None, None)

    async def submit(self, request: gr.Request, message, history, *settings):
        """Send the message box's text and images; yields (history, box, prompt, conversation, list)."""
        settings = ChatSettings(*settings)
        conversation_id = settings.conversation_id
        text, files = message_parts(message)
        typed = {"text": text, "files": files}  # what the box gives back on an error: nothing typed is lost
        if not text.strip():
            gr.Warning(EMPTY_MESSAGE)
            yield history, message, gr.skip(), gr.skip(), gr.skip()
            return
        image_files, document_files = split_files(files)
        if settings.pdf_pictures and self.engine_of(settings.model).sees_images:  # its pages, as images
            image_files, document_files = await as_pictures(image_files, document_files)
        images, refused = attached_images(image_files, self.engine_of(settings.model), self.max_upload_mb)
        documents, unread = await read_documents(document_files, self.max_upload_mb, self.saved.shelf)
        if refused or unread:  # the files taken out of the box, the text left in it: the next Send works
            gr.Warning(" ".join(filter(None, [refused, unread])))
            kept = [path for path, _ in images] + [path for path, _ in documents]
            yield gr.skip(), {"text": text, "files": kept}, gr.skip(), gr.skip(), gr.skip()
            return
        try:
            owner = self._owner(settings.browser_id, request)
            if owner is not None and conversation_id is None:
                conversation_id = settings.conversation_id = new_conversation_id()
            question = self.saved.user_message(owner, conversation_id, text, images)
            question = with_documents(question, [document for _, document in documents])
            question = with_ids(question) if self.saving else question  # its place in the saved tree
        except UserError as error:
            failed = list(history or []) + [{"role": "user", "content": text}, turns.error(str(error))]
            yield failed, typed, "", conversation_id, gr.skip()
            return
        history = with_calls_closed(list(history or []), NOT_ANSWERED) + [question]  # calls left waiting: not run
        box = None  # empty the message box once; later pieces leave it alone, so the next message can be typed
        async for history, prompt, conversation_id, listed in self.respond(history, settings, request):
            if kind_of(history[-1]) == Kind.ERROR:
                box = typed
            yield history, box, prompt, conversation_id, listed
            box = gr.skip()

    async def regenerate(self, request: gr.Request, history, *settings):
        """Answer the last question again: the new answer is a sibling of the one before (history/tree.py)."""
        settings, history = ChatSettings(*settings), up_to_last_question(history)
        if not history:
            yield history, "", settings.conversation_id, gr.skip()
            return
        history[-1] = answered_again(history[-1]) if self.saving else history[-1]
        async for update in self.respond(history, settings, request, question_first=False):
            yield update

    async def edit(self, request: gr.Request, edited: gr.EditData, history, *settings):
        """A past user message was edited: answer the edited one (its images stay), a sibling of the question before
        (history/tree.py), which keeps what followed it."""
        history = list(history or [])[: edited.index + 1]
        edited = edited_question(history[-1], message_text(edited.value))
        history[-1] = with_ids(edited) if self.saving else edited
        async for update in self.respond(history, ChatSettings(*settings), request, question_first=False):
            yield update

    def finished(self, conversation_id, browser_id, request: gr.Request):
        """Once an answer, Stop or Undo is over: the message box's Send, and the controls under the messages."""
        return idle_box(), self.points_of(conversation_id, browser_id, request)

    def stop(self, request: gr.Request):
        self.cancels.cancel(session_key(request.session_hash, self.name))

    def mark_stopped(self, history, conversation_id, browser_id, request: gr.Request):
        """After Stop: the answer as it was shown, marked as stopped, and saved so."""
        history = turns.marked_stopped(history)
        if history is None:
            return gr.skip(), gr.skip(), gr.skip()
        return self._commit_shown(request, self._owner(browser_id, request), conversation_id, history)

    def undo(self, history, conversation_id, browser_id, request: gr.Request):
        """Take the last question back into the message box: it and its answers are deleted."""
        history = up_to_last_question(history)
        last = history.pop() if history else None
        text = (last.get("text") or message_text(last["content"])) if last else ""
        if conversation_id is None:  # nothing saved yet, nothing to save
            return history, {"text": text, "files": []}, conversation_id, gr.skip()
        owner = self._owner(browser_id, request)
        self.saved.take_back(request.session_hash, owner, conversation_id, last)
        shown, *saved = self._commit_shown(request, owner, conversation_id, history)
        return shown, {"text": text, "files": []}, *saved  # the question back in the box, saved or not

    # ----- the model, where the page has a picker -----

    def model_outputs(self) -> list:
        """What follows the model chosen on the page (ui/model_picker.py's `chat_updates`): the template, system
        prompt, message box, thinking switch and sampling."""
        return [self.template_box, self.system_box, self.message, self.thinking, *self.sampling]

    # ----- the layout -----

    def build(self, browser_id, model=None) -> None:
        """The tab's layout and wiring; `model`: the picker's state (this session's model), where there is one."""
        engine = self.engine
        conversation_id = gr.State(None)
        chatbot, message = chat_box(engine, interactive=not self.saving)
        tools = self.build_tools(engine)  # --mcp_config: the tools switched on for this conversation
        thinking = gr.State(None) if self.single_turn else thinking_control(engine, self.picker is not None)
        examples = gr.Examples(  # a click sends the example, as Enter does
            IMAGE_EXAMPLES if self.single_turn else EXAMPLES, inputs=message, label="Examples (a click sends one)"
        )
        names = conversation_templates(engine)
        with gr.Accordion("Template and system prompt", open=False):
            template = gr.Dropdown(names, value=self.template, label="Template")
            given = default_system(engine, self.template) if self.picker is None else self.picker.system_of(None)
            system = gr.Textbox(given, label="System prompt", lines=2)
        transform, pictures = gr.State(self.image_transform), gr.State(False)
        if engine.sees_images:
            with gr.Accordion("Images", open=False):
                transform = gr.Radio(
                    IMAGE_TRANSFORMS, value=self.image_transform, label="Image transform (auto: the model's own)"
                )
                pictures = gr.Checkbox(False, label=f"Send a PDF's pages as pictures (the first {PAGE_PICTURES})")
        sampling = sampling_controls(self.picker.sampling_of(None) if self.picker is not None else None)
        prompt_view = prompt_panel()

        entries = gr.State([])  # the chat as the page keeps it (ui/turns.py); the Chatbot shows its view
        model = model if model is not None else gr.State(None)
        settings = [conversation_id, browser_id, template, system, transform, *sampling, thinking, model, tools]
        settings.append(pictures)
        chats = self.sidebar_list if self.saving else gr.State(None)
        outputs = [chatbot, entries, prompt_view, conversation_id, chats]
        common = dict(**GENERATION, show_progress="hidden", api_visibility=UI_ONLY)
        quiet = dict(api_visibility=UI_ONLY)
        toggle = dict(queue=False, show_progress="hidden", **quiet)

        def sent_after(event):
            """The message box sent after `event` (Enter, an example's click). A message sent while an answer
            streams is not dropped: it first stops that answer, then is answered."""
            return event(self.stop, None, None, trigger_mode="multiple", **toggle).then(
                with_view(self.submit),
                [message, entries, *settings],
                [chatbot, entries, message, prompt_view, conversation_id, chats],
                trigger_mode="multiple",
                **common,
            )

        example_clicked = examples.load_input_event.then  # once the example is in the message box
        # while an answer streams, Send becomes Stop (and Escape presses it: PAGE_JS); wired before the answers:
        # the page sends a trigger's events in order, and waits for a queued one before the next
        for trigger in (message.submit, example_clicked, chatbot.retry, chatbot.edit, chatbot.option_select):
            trigger(busy_box, None, message, **toggle)
        runs = [
            sent_after(message.submit),
            sent_after(example_clicked),
            chatbot.retry(with_view(self.regenerate), [entries, *settings], outputs, **common),
            chatbot.edit(with_view(self.edit), [entries, *settings], outputs, **common),
            chatbot.option_select(with_view(self.decide), [entries, *settings], outputs, **common),  # a tool call's
        ]
        # the box back to Send, and the controls under the messages drawn again (ui/branches.py)
        nav = self.nav if self.saving else gr.State(None)
        finished = dict(fn=self.finished, inputs=[conversation_id, browser_id], outputs=[message, nav], **toggle)
        for run in runs:
            run.then(**finished)
        message.stop(self.stop, None, None, cancels=runs, **toggle).then(
            with_view(self.mark_stopped),
            [entries, conversation_id, browser_id],
            [chatbot, entries, conversation_id, chats],
            **quiet,
        ).then(**finished)
        chatbot.undo(self.stop, None, None, cancels=runs, queue=False, **quiet).then(
            with_view(self.undo),
            [entries, conversation_id, browser_id],
            [chatbot, entries, message, conversation_id, chats],
            **quiet,
        ).then(**finished)
        template.input(
            lambda name, chosen: default_system(self.engine_of(chosen), name), [template, model], system, **quiet
        )
        self.chatbot, self.entries, self.conversation_id, self.runs = chatbot, entries, conversation_id, runs
        self.template_box, self.system_box, self.message, self.sampling = template, system, message, sampling
        self.thinking, self.model_state, self.prompt_view, self.tools_box = thinking, model, prompt_view, tools
        if self.always_box is not None:  # this login's always-allowed tools: shown at load and after a choice
            runs[-1].then(self.always_of, browser_id, self.always_box, **quiet)
            self.always_box.input(self.revoke, [self.always_box, browser_id], self.always_box, **quiet)
