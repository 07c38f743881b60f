"""The chat tab: its handlers (Send, Regenerate, Edit, Stop, Undo, a tool call's choice) and its layout, over one
engine; with saved conversations, its sidebar (ui/conversations.py), and its tools (ui/tool_rounds.py).

The chat sends chat messages (with the chosen template) to the engine, which renders them (engine/chats.py: the
prompt comes back first, as `Rendered`, and the answer parsed, its reasoning apart), and reads its events on a thread
of its own (`ui.chat.answer_updates`), so the model computes while Gradio sends the update before. A per-session
cancel flag is read before each forward pass, and a handler that Gradio closes stops its stream after the current
step, so Stop, a new message or a closed tab end the answer on the server within a decode step or two. Each handler
takes the `gr.Request` (and an edit its `gr.EditData`) first, where Gradio puts them, then the page's inputs, and the
settings as one `ChatSettings`; it returns a record whose fields name the components it updates (ui/wiring.py).
"""

from __future__ import annotations

import asyncio
import functools
from typing import NamedTuple

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
from local_chat.prompting.chat import image_parts, without_images
from local_chat.tools import Toolbox
from local_chat.voice import Voice
from local_chat.voice.clips import is_sound_file
from local_chat.web import put_web_in_prompt, standalone_query
from local_chat.web.tools import SERVER as WEB_SERVER

from . import turns
from .answer_turn import Turn
from .chat import Cancels, answer_updates
from .chat_parts import ChatParts
from .chat_settings import ChatSettings, attached_clips, attached_images, edited_question, message_parts
from .conversations import Sidebar
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
from .thinking import EFFORTS, EngineThinking, thinking_choices, thinking_control, thinking_kwargs, thinking_switch
from .tool_rounds import NOT_ANSWERED, ToolRounds
from .turns import kind_of, model_view, unanswered_calls, up_to_last_question, with_calls_closed
from .voice import PageVoice
from .wiring import GENERATION, UI_ONLY, taking_settings, updating

WEB_TITLE = "Web search"


class Answering(NamedTuple):
    """What an answer's handlers update as it streams."""

    chat: list | object
    prompt: str | object
    conversation_id: str | None
    listed: object


class Sent(NamedTuple):
    """What Send updates: `Answering`'s, and the message box (emptied once; given back on an error)."""

    chat: list | object
    box: dict | None | object
    prompt: str | object
    conversation_id: str | None
    listed: object


class Streamed(NamedTuple):
    """What every answer's run updates on the page (`ChatTab.on_page`): `Sent`'s, the box showing Stop at each piece,
    and the answer spoken (ui/voice.py's value)."""

    chat: list | object
    box: dict | object
    prompt: str | object
    conversation_id: str | None
    listed: object
    speech: object


class Saved(NamedTuple):
    """The chat as shown once saved, and the saved conversation (Stop's mark)."""

    chat: list | object
    conversation_id: str | None
    listed: object


class Undone(NamedTuple):
    chat: list | object
    box: dict
    conversation_id: str | None
    listed: object


class Finished(NamedTuple):
    """Once an answer, Stop or Undo is over: the message box's Send, and the controls under the messages."""

    box: dict
    nav: dict | object


class Restored(NamedTuple):
    """What follows the conversation open: its thinking switch, Tools control, and the controls under its messages."""

    thinking: object
    tools: object
    nav: dict | object


class ChatTab:
    """The chat: text and images in one conversation, each image going to the model with the message it was
    attached to; saved as it goes where saved conversations are on (`saved`); or single questions (`single_turn`),
    each answered alone. `history` is the chat's typed list (ui/turns.py)."""

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
        web=None,
        voice: Voice | None = None,
    ):
        self.engine = ChatEngine.over(engine, template, max_upload_mb)  # chat messages rendered, answers parsed
        self.picker = picker  # --models_dir: each session's model (ui/model_picker.py)
        self.cancels, self.saved, self.single_turn = cancels, saved, single_turn
        self.template, self.image_transform, self.max_upload_mb = template, image_transform, max_upload_mb
        self.name = "chat_single" if single_turn else "chat"  # this tab's Stop
        self.saving = saved.on and not single_turn
        servers = tool_servers if not single_turn else None  # --mcp_config, and the web's tools
        if isinstance(servers, Toolbox) and picker is None and self.engine.why_no_tools(template) is not None:
            servers = servers.leaving_out(WEB_SERVER)  # the web's tools only where the model can call them
        self.tools = ToolRounds(servers, max_tool_rounds, saved, self.saving)
        self.web = web  # --web_search: the Search the web switch's search (web/context.py's WebResearch)
        self.voice = PageVoice(voice or Voice(), max_upload_mb)  # the microphone, Speak answers, read aloud
        self.sidebar = Sidebar(saved, self.stop, picker) if self.saving else None  # with its branches
        self.parts: ChatParts | None = None  # once built
        self.runs: list = []  # the events that answer, which Stop cancels

    def _owner(self, browser_id, request) -> str | None:
        return self.saved.owner(browser_id, request) if self.saving else None

    def engine_of(self, model: str | None, request: gr.Request | None = None) -> ChatEngine:
        """The engine of this session's model (with a picker; `request`: refused where its login may not load it
        and it is not loaded), else the page's."""
        return self.engine if self.picker is None else self.picker.engine_of(model, request)

    # ----- an answer -----

    async def respond(self, history, settings: ChatSettings, request: gr.Request, question_first: bool = True):
        """Answer the last question of `history`, or go on after its decided tool calls; yields `Answering`, the
        conversation saved when the answer ends. A reasoning model's thought streams into a Thinking entry above the
        answer, folded once the answer begins. `question_first`: the question is saved before it is answered (a new
        message); an edit or a regeneration is saved only with its answer, so the conversation keeps its earlier
        turns until one comes. An answer cut by Stop, a new message, a closed tab or a crash is saved as far as it
        went, marked stopped (ui/answer_turn.py)."""
        history = [dict(m) for m in history or []]
        cancel = self.cancels.fresh(session_key(request.session_hash, self.name))
        listed, first, conversation_id = gr.skip(), None, settings.conversation_id
        try:
            engine, owner = self.engine_of(settings.model, request), self._owner(settings.browser_id, request)
            turn = Turn(engine, settings, request, cancel, self.saved, owner, question_first)
            if question_first:  # the question is kept
                turn.conversation_id, listed = self._commit(request, owner, turn.conversation_id, history)
            elif owner is not None and turn.conversation_id is None:
                turn.conversation_id = new_conversation_id()
            conversation_id = turn.conversation_id
            if not unanswered_calls(history):  # else the calls run first (`decide`)
                if settings.web_search and self.web is not None:
                    query = standalone_query(model_view(history))
                    yield Answering(history + [turns.notice(WEB_TITLE, f"Searching the web for “{query}”…")],
                                    gr.skip(), conversation_id, listed)  # fmt: skip
                    turn.findings = await self.web.search(query)
                first = await asyncio.to_thread(self._request, turn, history)  # images, documents, the web
        except UserError as error:
            yield Answering(history + [turns.error(str(error))], "", conversation_id, listed)
            return
        try:
            yield Answering(history, gr.skip(), conversation_id, listed)
            async for shown in self._rounds(turn, first, history):
                yield shown
        finally:
            turn.save(history)  # where the answer did not end: as far as it went, marked stopped
        options = dict(thinking=settings.thinking, prompt=turn.prompt, tools_off=self.tools.tools_off(settings.tools))
        saved = self._commit_shown(request, owner, turn.conversation_id, history, **options)
        yield Answering(saved.chat, turn.prompt, saved.conversation_id, saved.listed)

    def _request(self, turn: Turn, history) -> Request:
        """The request that answers `history` as it stands, with the documents it holds and the web's pages found
        for it, which it notes on `turn` (`UserError` where it cannot be sent)."""
        engine, settings = turn.engine, turn.settings
        messages = self.saved.for_the_model(model_view(history))
        if self.single_turn:  # each question alone
            messages = messages[-1:]
        if messages[-1]["role"] == "user" and not message_text(messages[-1]["content"]).strip():
            raise UserError(EMPTY_MESSAGE)
        if not engine.sees_images and any(image_parts(m) for m in messages):
            messages = [without_images(m) for m in messages]
            turns.with_images_left_out(history, settings.model or "This model")
        answer_tokens = settings.sampling.max_new_tokens
        system = [{"role": "system", "content": settings.system}] if settings.system is not None else []
        messages, turn.documents = put_in_prompt(engine, system + messages, answer_tokens, self.saved.shelf)
        if turn.findings is not None:  # numbered after the documents
            first = 1 + (turn.documents.last_number if turn.documents else 0)
            reranker = self.web.reranker
            messages, turn.web = put_web_in_prompt(engine, messages, answer_tokens, turn.findings, first, reranker)
        door = f"{self.name}/{turn.conversation_id}" if turn.conversation_id else self.name
        return Request(
            sampling=settings.sampling,
            image_transform=settings.transform,
            session=session_key(turn.request.session_hash, door),
            cancel=turn.cancel,
            messages=messages,
            chat=ChatOptions(
                template=settings.template,
                answer_tokens=settings.sampling.max_new_tokens,
                template_kwargs=thinking_kwargs(settings.thinking),
                tools=self.tools.tools_for(engine, settings),
            ),
        )

    async def _rounds(self, turn: Turn, answer: Request | None, history: list):
        """The answer, then each round of its tool calls (ui/tool_rounds.py) and the answer after them, until it
        ends without calls, its calls wait for the user, or it passes --max_tool_rounds."""
        settings, tools = turn.settings, self.tools
        owner = tools.owner(settings.browser_id, turn.request) if tools.servers is not None else None
        while True:
            if unanswered_calls(history):
                if (closed := tools.over_rounds(history)) is not None:
                    history[:] = closed
                    yield Answering(history, turn.prompt, turn.conversation_id, gr.skip())
                    return
                if tools.ask_or_allow(history, owner):
                    return  # the cards wait for the user's choice (`decide`)
                turn.ended = False
                async for _ in tools.run_calls(history, turn.owner, turn.conversation_id):
                    yield Answering(history, turn.prompt, turn.conversation_id, gr.skip())
                try:
                    answer = await asyncio.to_thread(self._request, turn, history)
                except UserError as error:
                    history.append(turns.error(str(error)))
                    return
            asked = len(history)  # where the answer's entries begin
            history.append(turns.answer(""))
            turn.ended = False
            async for shown in self._answer(turn, answer, history, asked):
                yield shown
            if not unanswered_calls(history) or turn.stopped:
                return

    async def _answer(self, turn: Turn, answer: Request, history: list, asked: int):
        """`answer`'s updates streamed into `history` from entry `asked` on (a thought, the answer, or its error),
        then its figures; yields `Answering` as it grows."""
        line, failed, update, engine = "", False, None, turn.engine
        model = turn.settings.model if self.picker is not None else None  # which model gave the answer, saved with it
        by = f" · {model}" if model else ""
        async for update in answer_updates(engine, answer):
            if update.rendered is not None:
                turn.prompt = shown_prompt(engine, update.rendered.text, update.rendered.images)
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
                turn.stopped = True
            # the figures (or the place in the queue) under the answer
            figures = [turns.stats(line)] if line and not failed else []
            yield Answering(history + figures, turn.prompt, turn.conversation_id, gr.skip())
            turn.now_and_then(history)
        if (sources := sources_entry(turn.documents, turn.web)) and not failed:
            history.append(sources)  # under the answer, folded
        if line and not failed:
            history.append(turns.stats(line))
        if turn.stopped:
            history.append(turns.stopped())
        elif update is not None and update.tool_calls and not failed:  # the last entry: Gradio shows its buttons
            if kind_of(history[asked]) == Kind.ANSWER and not history[asked]["content"]:
                del history[asked]
            history.extend(self.tools.call_cards(update.tool_calls))
        turn.ended = True

    def _commit(self, request: gr.Request, owner, conversation_id, history, **options) -> tuple:
        """(conversation id, the list's update) once `history` is saved (with `options`: the thinking switch's value,
        where the page has one, the prompt its last answer was sent, which the prompt panel shows again once it is
        reopened, the tools switched off); `UserError` where it cannot be (changed in another window since this page
        read it)."""
        if owner is None:
            return conversation_id, gr.skip()
        options["prompt"] = options.get("prompt") if isinstance(options.get("prompt"), str) else None
        options = {key: value for key, value in options.items() if value is not None} or None
        conversation_id = self.saved.save(request.session_hash, owner, conversation_id, history, options)
        return conversation_id, self.saved.listed(owner, conversation_id)

    def _commit_shown(self, request: gr.Request, owner, conversation_id, history, **options) -> Saved:
        """The chat as shown once `history` is saved (with `_commit`'s `options`); where it cannot be (changed in
        another window since this page read it), the chat with the sentence under it, nothing saved."""
        try:
            return Saved(history, *self._commit(request, owner, conversation_id, history, **options))
        except UserError as error:
            return Saved(history + [turns.error(str(error))], gr.skip(), gr.skip())

    # ----- the handlers -----

    async def submit(self, request: gr.Request, message, history, settings: ChatSettings):
        """Send the message box's text and images; yields `Sent`."""
        conversation_id = settings.conversation_id
        text, files = message_parts(message)
        typed = {"text": text, "files": files}  # what the box gives back on an error: nothing typed is lost
        if not text.strip():
            gr.Warning(EMPTY_MESSAGE)
            yield Sent(history, message, gr.skip(), gr.skip(), gr.skip())
            return
        engine = self.engine_of(settings.model)
        image_files, document_files = split_files([f for f in files if not is_sound_file(f)])
        if settings.pdf_pictures and engine.sees_images:  # its pages, as images
            image_files, document_files = await as_pictures(image_files, document_files)
        images, refused = attached_images(image_files, engine, self.max_upload_mb)
        clips, unheard = attached_clips([f for f in files if is_sound_file(f)], engine, self.max_upload_mb)
        documents, unread = await read_documents(document_files, self.max_upload_mb, self.saved.shelf)
        if refused or unheard or unread:  # the files taken out of the box, the text left in it: the next Send works
            gr.Warning(" ".join(filter(None, [refused, unheard, unread])))
            kept = [path for path, _ in [*images, *clips, *documents]]
            yield Sent(gr.skip(), {"text": text, "files": kept}, gr.skip(), gr.skip(), gr.skip())
            return
        try:
            owner = self._owner(settings.browser_id, request)
            if owner is not None and conversation_id is None:
                conversation_id = settings.conversation_id = new_conversation_id()
            question = self.saved.user_message(owner, conversation_id, text, images, clips)
            question = with_documents(question, [document for _, document in documents])
            question = with_ids(question) if self.saving else question  # its place in the saved tree
        except UserError as error:
            failed = list(history or []) + [{"role": "user", "content": text}, turns.error(str(error))]
            yield Sent(failed, typed, "", conversation_id, gr.skip())
            return
        history = with_calls_closed(list(history or []), NOT_ANSWERED) + [question]  # calls left waiting: not run
        box = None  # empty the message box once; later pieces leave it alone, so the next message can be typed
        async for shown in self.respond(history, settings, request):
            if kind_of(shown.chat[-1]) == Kind.ERROR:
                box = typed
            yield Sent(shown.chat, box, shown.prompt, shown.conversation_id, shown.listed)
            box = gr.skip()

    async def regenerate(self, request: gr.Request, history, settings: ChatSettings):
        """Answer the last question again: the new answer is a sibling of the one before (history/tree.py)."""
        history = up_to_last_question(history)
        if not history:
            yield Answering(history, "", settings.conversation_id, gr.skip())
            return
        history[-1] = answered_again(history[-1]) if self.saving else history[-1]
        async for shown in self.respond(history, settings, request, question_first=False):
            yield shown

    async def edit(self, request: gr.Request, edited: gr.EditData, history, settings: ChatSettings):
        """A past user message was edited: answer the edited one (its images stay), a sibling of the question before
        (history/tree.py), which keeps what followed it."""
        history = list(history or [])[: edited.index + 1]
        edited = edited_question(history[-1], message_text(edited.value))
        history[-1] = with_ids(edited) if self.saving else edited
        async for shown in self.respond(history, settings, request, question_first=False):
            yield shown

    async def decide(self, request: gr.Request, selected: gr.SelectData, history, settings: ChatSettings):
        """Allow once, always allow or deny the waiting calls (ui/tool_rounds.py), then run them and go on with the
        answer."""
        history = [dict(entry) for entry in history or []]
        if not self.tools.approve(history, selected.value, settings.browser_id, request):
            yield Answering(history, gr.skip(), gr.skip(), gr.skip())
            return
        async for shown in self.respond(history, settings, request, question_first=False):
            yield shown

    def finished(self, conversation_id, browser_id, request: gr.Request) -> Finished:
        return Finished(idle_box(), self._nav_of(conversation_id, browser_id, request))

    def _nav_of(self, conversation_id, browser_id, request: gr.Request):
        """The controls under the open conversation's messages (ui/branches.py); none without saved conversations."""
        return self.sidebar.branches.points_of(conversation_id, browser_id, request) if self.sidebar else gr.skip()

    def stop(self, request: gr.Request):
        self.cancels.cancel(session_key(request.session_hash, self.name))

    def mark_stopped(self, history, conversation_id, browser_id, request: gr.Request) -> Saved:
        """After Stop: the answer as it was shown, marked as stopped, and saved so."""
        history = turns.marked_stopped(history)
        if history is None:
            return Saved(gr.skip(), gr.skip(), gr.skip())
        return self._commit_shown(request, self._owner(browser_id, request), conversation_id, history)

    def undo(self, history, conversation_id, browser_id, request: gr.Request) -> Undone:
        """Take the last question back into the message box: it and its answers are deleted."""
        history = up_to_last_question(history)
        last = history.pop() if history else None
        box = {"text": (last.get("text") or message_text(last["content"])) if last else "", "files": []}
        if conversation_id is None:  # nothing saved yet, nothing to save
            return Undone(history, box, conversation_id, gr.skip())
        owner = self._owner(browser_id, request)
        self.saved.take_back(request.session_hash, owner, conversation_id, last)
        saved = self._commit_shown(request, owner, conversation_id, history)
        return Undone(saved.chat, box, saved.conversation_id, saved.listed)  # the question back in the box

    # ----- the conversation open -----

    @functools.cached_property
    def switch(self) -> tuple[str | None, object]:
        return thinking_switch(self.engine) if not self.single_turn else (None, None)

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
        fits = isinstance(kept, bool) if isinstance(first, bool) else kept in (*EFFORTS, *EngineThinking)
        return kept if fits else first

    def restore_of(self, conversation_id, browser_id, model, request: gr.Request) -> Restored:
        """The open conversation's thinking switch and Tools control, as it left them, and the controls under its
        messages (ui/branches.py)."""
        return Restored(
            self.thinking_of(conversation_id, browser_id, model, request),
            self.tools.tools_of(conversation_id, browser_id, request),
            self._nav_of(conversation_id, browser_id, request),
        )

    # ----- the layout -----

    def model_outputs(self) -> list:
        """What follows the model chosen on the page (ui/model_picker.py's `chat_updates`): the template, system
        prompt, message box, thinking switch and sampling."""
        parts = self.parts
        sampling = [parts.max_gen_len, parts.temperature, parts.top_p, parts.top_k, parts.repetition_penalty]
        return [parts.template, parts.system, parts.box, parts.thinking, *sampling]

    def build(self, browser_id, model=None) -> ChatParts:
        """The tab's layout and wiring; `browser_id`: the page's; `model`: the picker's state (this session's model),
        where there is one. The sidebar, where there is one, was built before (it is the page's)."""
        engine = self.engine
        conversation_id = gr.State(None)
        hears = self.voice.voice.hears or engine.summary().hears  # a microphone: for --stt_model, or the model
        chatbot, box = chat_box(engine, interactive=not self.saving, hears=hears)
        web_search = (
            gr.Checkbox(False, label="Search the web", elem_classes="web-switch") if self.web else gr.State(False)
        )
        speech, speak_answers = self.voice.build()
        tools, always = self.tools.build(engine)  # --mcp_config: the tools switched on for this conversation
        thinking = gr.State(None) if self.single_turn else thinking_control(engine, self.picker is not None)
        examples = gr.Examples(  # a click sends the example, as Enter does
            IMAGE_EXAMPLES if self.single_turn else EXAMPLES, inputs=box, label="Examples (a click sends one)"
        )
        with gr.Accordion("Template and system prompt", open=False):
            template = gr.Dropdown(conversation_templates(engine), value=self.template, label="Template")
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
        max_gen_len, temperature, top_p, top_k, repetition_penalty = sampling
        self.parts = ChatParts(
            chatbot=chatbot,
            chat=gr.State([]),
            box=box,
            prompt=prompt_panel(),
            listed=self.sidebar.listed if self.sidebar else gr.State(None),
            nav=self.sidebar.branches.nav if self.sidebar else gr.State(None),
            always=always,
            conversation_id=conversation_id,
            browser_id=browser_id,
            template=template,
            system=system,
            transform=transform,
            max_gen_len=max_gen_len,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            repetition_penalty=repetition_penalty,
            thinking=thinking,
            model=model if model is not None else gr.State(None),
            tools=tools,
            pdf_pictures=pictures,
            web_search=web_search,
            speak_answers=speak_answers,
            speech=speech,
        )
        self._wire(self.parts, examples.load_input_event.then)  # once an example is in the message box
        return self.parts

    def _wire(self, parts: ChatParts, example_clicked) -> None:
        """The tab's events: Send (Enter, an example), Regenerate, Edit, a tool call's choice, Stop, Undo."""
        named, chatbot, box = parts.named(), parts.chatbot, parts.box
        settings = parts.settings()
        common = dict(**GENERATION, show_progress="hidden", api_visibility=UI_ONLY)
        quiet = dict(api_visibility=UI_ONLY)
        toggle = dict(queue=False, show_progress="hidden", **quiet)

        def answering(handler):
            return updating(taking_settings(self.on_page(handler)), Streamed, named)

        def sent_after(event):
            """The message box sent after `event` (Enter, an example's click). A message sent while an answer
            streams is not dropped: it first stops that answer, then is answered."""
            return event(self.stop, None, None, trigger_mode="multiple", **toggle).then(
                **answering(self.submit), inputs=[box, parts.chat, *settings], trigger_mode="multiple", **common
            )

        # while an answer streams, Send becomes Stop (and Escape presses it: ui/static/page.js); wired before the
        # answers: the page sends a trigger's events in order, and waits for a queued one before the next
        for trigger in (box.submit, example_clicked, chatbot.retry, chatbot.edit, chatbot.option_select):
            trigger(busy_box, None, box, **toggle)
        history = [parts.chat, *settings]
        self.runs = runs = [
            sent_after(box.submit),
            sent_after(example_clicked),
            chatbot.retry(**answering(self.regenerate), inputs=history, **common),
            chatbot.edit(**answering(self.edit), inputs=history, **common),
            chatbot.option_select(**answering(self.decide), inputs=history, **common),  # a tool call's choice
        ]
        # the box back to Send, and the controls under the messages drawn again (ui/branches.py)
        finished = dict(**updating(self.finished, Finished, named), inputs=[parts.conversation_id, parts.browser_id])
        for run in runs:
            run.then(**finished, **toggle)
        shown = [parts.chat, parts.conversation_id, parts.browser_id]
        box.stop(self.stop, None, None, cancels=runs, **toggle).then(
            **updating(self.mark_stopped, Saved, named), inputs=shown, **quiet
        ).then(**finished, **toggle)
        chatbot.undo(self.stop, None, None, cancels=runs, queue=False, **quiet).then(
            **updating(self.undo, Undone, named), inputs=shown, **quiet
        ).then(**finished, **toggle)
        parts.template.input(
            lambda name, chosen: default_system(self.engine_of(chosen), name),
            [parts.template, parts.model],
            parts.system,
            **quiet,
        )
        self.tools.wire(parts, runs[-1])  # this login's always-allowed tools: shown after a choice, and revoked
        self.voice.wire(box, parts.speech, parts.model, lambda model: self.engine_of(model).summary().hears)

    def on_page(self, handler):
        """`handler`'s results (an answer's run) as `Streamed`: the message box showing Stop at each piece, and the
        answer spoken where Speak answers is on (its last sentences after its last piece). The answer before this one
        puts Send back when it ends (`finished`), which can come after this answer began (a message sent as that one
        ends): the next piece shows Stop again."""

        @functools.wraps(handler)
        async def streaming(*args, **kwargs):
            speech = self.voice.answer_speech(args[-1].speak_answers)  # the settings come last
            shown = None
            try:
                async for shown in handler(*args, **kwargs):
                    said = speech.heard(shown.chat) if speech and isinstance(shown.chat, list) else gr.skip()
                    yield streamed(shown, said)
                if speech and shown is not None and isinstance(shown.chat, list):
                    async for said in speech.rest(shown.chat):
                        yield Streamed(gr.skip(), busy_box(), gr.skip(), gr.skip(), gr.skip(), said)
            finally:
                if speech:
                    speech.close()

        return streaming

    def restore_step(self) -> dict:
        """The event step that sets the open conversation's switches and draws its controls again (`restore_of`)."""
        parts = self.parts
        return dict(
            **updating(self.restore_of, Restored, parts.named()),
            inputs=[parts.conversation_id, parts.browser_id, parts.model],
            api_visibility=UI_ONLY,
        )


def streamed(shown: Sent | Answering, said) -> Streamed:
    """`shown` as the page shows it: its box showing Stop, `said` its speech."""
    box = shown.box if isinstance(shown, Sent) else gr.skip()
    update = box if isinstance(box, dict) and box.get("__type__") == "update" else gr.update(value=box)
    return Streamed(shown.chat, {**update, **busy_box()}, shown.prompt, shown.conversation_id, shown.listed, said)
