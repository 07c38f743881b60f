"""The Gradio app: the Chat and Single-turn tabs over one engine, with the /chat and /single_turn API beside them
(ui/gradio_api.py).

The chat and the /chat API send chat messages (with the chosen template) to the engine, which renders them
(engine/chats.py: the prompt comes back first, as `Rendered`, and the answer parsed, its reasoning apart); the
Single-turn tab sends a raw prompt. All read the engine's events (engine/interface.py) on a thread of their own
(`ui.chat.answer_updates`), so the model computes while Gradio sends the update before. A
per-session cancel flag is read before each forward pass, and a handler that Gradio closes stops its stream after
the current step, so Stop, a new message or a closed tab end the answer on the server within a decode step or two.
Gradio does not limit how many answers run at once: the engine it is given (engine/in_order.py) serves the page's
and the /v1 API's requests in arrival order.
"""

from __future__ import annotations

import functools
import inspect
from html import escape

import gradio as gr

from local_chat.defaults import IMAGE_TRANSFORM, IMAGE_TRANSFORMS, MAX_UPLOAD_MB
from local_chat.engine import ChatOptions, Engine, Request, checkpoint_name
from local_chat.engine.chats import ChatEngine
from local_chat.engine.interface import CHAT_SAMPLING, session_key
from local_chat.errors import UserError
from local_chat.history import Store
from local_chat.prompting import (
    EMPTY_MESSAGE,
    conversation_templates,
    default_system,
    default_template,
    message_text,
    open_upload,
    single_turn_prompt,
)
from local_chat.prompting.messages import template_reads
from local_chat.templates.single_turn import TEMPLATE_NAMES

from . import turns
from .chat import Cancels, answer_updates
from .gradio_api import api_chat, api_single_turn, page_sampling
from .history import IMAGE_REF, SavedChats, new_conversation_id
from .turns import DROPPED_TITLE, ERROR_MARK, kind_of, model_view, up_to_last_question, view  # noqa: F401 (tests)

EXAMPLES = [{"text": t} for t in ("What is 23 plus 45?", "What is the capital of Japan?", "Who are you?")]
IMAGE_EXAMPLES = [
    {"text": t} for t in ("What is in the image?", "What color is the circle?", "How many shapes are there?")
]
CSS = """
.stats { font-size: 0.8em; opacity: 0.75; }
.model-line { font-size: var(--text-md); }
.model-line summary { cursor: pointer; }
.model-line .model-details { color: var(--body-text-color-subdued); font-size: var(--text-sm); margin-top: 2px; }
.conversation img { max-width: min(240px, 60vw); max-height: 240px; border-radius: 6px; }
/* Gradio's own clear (the trash icon) would empty a saved conversation's view: New chat does that job */
.conversation button[aria-label="Clear"] { display: none; }
/* a notice with no body (an answer's figures, the place in the queue): a quiet line, no box, nothing to open */
.conversation .thought-group:has(> [aria-busy="true"]) { border: none; background: none; padding: 0; margin: 0; }
.conversation [role="button"][aria-busy="true"] { pointer-events: none; font-size: var(--text-sm); opacity: 0.7; }
.conversation [role="button"][aria-busy="true"] .arrow { display: none; }
/* the prompt panel as tall as its text (Gradio's wrapped code box keeps max_lines' height even when empty) */
.prompt-view .cm-scroller { min-height: 0 !important; }
@media (max-width: 500px) { .conversation { height: 52vh !important; } .model-line { font-size: var(--text-sm); } }
/* on a narrow screen Gradio's sidebar arrow hangs half off the screen's edge: a whole round button inside it */
@media (max-width: 768px) {
  .sidebar.conversations .toggle-button { border: 1px solid var(--border-color-primary) !important;
    border-radius: 50% !important; width: 36px !important; height: 36px !important; left: calc(100% + 6px) !important; }
  .sidebar.conversations.open .toggle-button { left: auto !important; right: 8px !important; }
  .sidebar.conversations .sidebar-content { padding-right: 52px !important; }
}
"""
# Images come from the app itself only: a model talked into writing <img src="https://..."> or ![](https://...)
# cannot make the browser call an outside address (and send it whatever the model put into the URL).
HEAD = """<meta http-equiv="Content-Security-Policy" content="img-src 'self' data: blob:">"""
# run by the page once it has loaded (launch's `js`)
PAGE_JS = """() => {
  // Escape stops the answer that streams (the message box's Stop, shown only then)
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    const stop = Array.from(document.querySelectorAll("button.stop-button")).find((b) => b.offsetParent !== null);
    if (stop) stop.click();
  }, true);  // in the capture phase: the message box handles its own keys
  // on a narrow screen the conversations start closed: the chat and its message box come first
  let tries = 0;
  const timer = setInterval(() => {
    const sidebar = document.querySelector(".sidebar.conversations");
    if (sidebar && window.innerWidth < 700 && sidebar.classList.contains("open")) {
      sidebar.querySelector(".toggle-button").click();
    }
    // on a wide screen the model's details show under its name; on a narrow one they are a tap away
    const details = document.querySelector(".model-line details");
    if (details && window.innerWidth >= 700) details.open = true;
    if ((sidebar && details) || ++tries > 50) clearInterval(timer);
  }, 100);
}"""
# what `launch` needs besides the address; the footer's "Settings" (Gradio's) would stand beside the chat's own
PAGE = {"css": CSS, "head": HEAD, "js": PAGE_JS, "footer_links": ["api", "gradio"]}
# every event that runs the model: no Gradio limit, the engine queues them with the /v1 API's (engine/in_order.py)
GENERATION = dict(concurrency_id="generation", concurrency_limit=None)
UI_ONLY = "undocumented"  # the page's own events stay out of the API docs: /chat and /single_turn are the API


def model_panel(model: Engine) -> str:
    """The model line over the tabs (HTML): a short summary, its details a tap away; the checkpoint by its folder's
    name (nothing of the server's disk)."""
    facts = model.summary()
    seeing = " · sees images" if facts.sees_images else ""
    if facts.remote:  # engine/remote.py: a model another server serves
        context = f"{facts.context} tokens" if facts.context_known else "the engine's context"
        summary = f"<b>Model</b> <code>{escape(facts.path)}</code> · {context}{seeing}"
        details = f"served by {escape(facts.engine_url)} · batching: {escape(facts.batching)}"
    else:
        summary = f"<b>Model</b> <code>{escape(checkpoint_name(facts))}</code> · {facts.context} tokens{seeing}"
        details = (
            f"{escape(facts.architecture)} · {facts.format} · dtype {facts.dtype} · device {facts.device} · "
            f"quantization {facts.quant} · weights {facts.weight_mib:,.0f} MiB"
            + (" · compiled decoding" if facts.compiled else "")
            + (" · CUDA graphs" if facts.cuda_graphs else "")
            + f" · batching: {escape(facts.batching)}"
        )
    return f"<details><summary>{summary}</summary><div class='model-details'>{details}</div></details>"


def shown_prompt(model: Engine, text: str, images: int) -> str:
    """The prompt as "Prompt sent to the model" shows it: where the template has no image marker, the marker the
    model's processor puts in front for each image, so that the panel shows where the images went."""
    if not images:
        return text
    facts = model.summary()  # asked only for a prompt with images: a local model's sums its weights' sizes
    marker, token = facts.image_marker, facts.image_token
    if marker and token and token not in text:
        return marker * images + text
    return text


EFFORTS = ("low", "medium", "high")
ENGINE_THINKING = ("engine's default", "think", "don't think")  # the switch over an engine (--api_base)


def with_view(handler, at: int = 0):
    """`handler`, whose output `at` is the chat's typed list (ui/turns.py), with the Chatbot's view of it before it:
    wired to outputs [..., chatbot, entries, ...]."""

    def split(out):
        out = list(out)
        entries = out[at]
        shown = view(entries) if isinstance(entries, list) else entries  # else gr.skip(): both skipped
        return (*out[:at], shown, *out[at:])

    if inspect.isasyncgenfunction(handler):

        @functools.wraps(handler)
        async def streamed(*args, **kwargs):
            async for out in handler(*args, **kwargs):
                yield split(out)

        return streamed

    @functools.wraps(handler)
    def returned(*args, **kwargs):
        return split(handler(*args, **kwargs))

    return returned


def thinking_switch(model: Engine) -> tuple[str | None, object]:
    """(the template variable the page's thinking switch sets: "enable_thinking", "reasoning_effort", or None where
    the model's template reads neither; the switch's first value: what the template does with it unset). An engine
    that renders messages itself (--api_base) gets a switch whose template is unknown here: the engine's default
    (nothing sent), or `chat_template_kwargs.enable_thinking` true or false."""
    if getattr(model, "renders_messages", False):
        return "enable_thinking", ENGINE_THINKING[0]
    reads, renderer = template_reads(model), model.chat_renderer
    probe = [{"role": "user", "content": "Hi"}]

    def render(**variables):
        try:
            return renderer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, **variables)
        except Exception:  # a template that cannot render the probe: the switch starts as the variable's default
            return None

    if "reasoning_effort" in reads:
        unset = render()
        return "reasoning_effort", next((e for e in EFFORTS if render(reasoning_effort=e) == unset), "medium")
    if "enable_thinking" in reads:
        return "enable_thinking", render() != render(enable_thinking=False)
    return None, None


def thinking_kwargs(thinking) -> dict:
    """The template variables the thinking switch's value sets: a checkbox's bool, an effort's name, an engine's
    choice, or nothing."""
    if thinking in ENGINE_THINKING[1:]:
        thinking = thinking == ENGINE_THINKING[1]
    if isinstance(thinking, bool):
        return {"enable_thinking": thinking}
    if thinking in EFFORTS:
        return {"reasoning_effort": thinking}
    return {}


def sampling_controls() -> list[gr.components.Component]:
    defaults = CHAT_SAMPLING
    with gr.Accordion("Settings", open=False):
        max_gen_len = gr.Slider(1, 2048, value=defaults.max_new_tokens, step=1, label="Max answer length (tokens)")
        temperature = gr.Slider(0.0, 2.0, value=defaults.temperature, step=0.05, label="Temperature (0 = greedy)")
        top_p = gr.Slider(0.05, 1.0, value=defaults.top_p, step=0.05, label="Top p")
        with gr.Accordion("More", open=False):
            top_k = gr.Slider(0, 200, value=defaults.top_k, step=1, label="Top k (0 = off)")
            repetition_penalty = gr.Slider(
                1.0, 2.0, value=defaults.repetition_penalty, step=0.05, label="Repetition penalty"
            )
    return [max_gen_len, temperature, top_p, top_k, repetition_penalty]


def prompt_panel() -> gr.Code:
    """The "Prompt sent to the model" panel: the exact text, its long lines wrapped."""
    with gr.Accordion("Prompt sent to the model", open=False):
        return gr.Code(
            label="Prompt", language=None, interactive=False, wrap_lines=True, max_lines=20, elem_classes="prompt-view"
        )


def edited_question(content, edited_text: str) -> dict:
    """A user message whose text was edited: its images (saved ones' addresses, or upload files) stay, the text is
    the new one."""
    saved = "".join(ref[0] for ref in IMAGE_REF.finditer(message_text(content)))
    files = [p for p in content if isinstance(p, dict) and p.get("type") == "file"] if isinstance(content, list) else []
    text = saved + IMAGE_REF.sub("", edited_text)
    return {"role": "user", "content": [*files, text] if files else text}


def busy_box():
    return gr.update(submit_btn=False, stop_btn="Stop")


def idle_box():
    return gr.update(submit_btn="Send", stop_btn=False)


def message_parts(message) -> tuple[str, list[str]]:
    """(text, attached files) of the message box's value ({"text", "files"}), or of a plain string."""
    if isinstance(message, dict):
        files = [f if isinstance(f, str) else f.get("path") for f in message.get("files") or []]
        return message.get("text") or "", [f for f in files if f]
    return message or "", []


FORMER_TABS = {"vision": "chat", "vision_single": "chat_single"}  # the Vision chat became the chat's attachments


class ChatTab:
    """The chat: text and images in one conversation, each image going to the model with the message it was
    attached to; saved as it goes where saved conversations are on (`saved`); or single questions (`single_turn`),
    each answered alone. `history` is Gradio's list of {"role", "content"} messages."""

    def __init__(
        self,
        model: Engine,
        cancels: Cancels,
        template: str,
        image_transform: str,
        saved: SavedChats,
        single_turn: bool = False,
        max_upload_mb: float = MAX_UPLOAD_MB,
    ):
        self.model = ChatEngine.over(model, template, max_upload_mb)  # chat messages rendered, answers parsed
        self.cancels, self.saved, self.single_turn = cancels, saved, single_turn
        self.template, self.image_transform, self.max_upload_mb = template, image_transform, max_upload_mb
        self.name = "chat_single" if single_turn else "chat"  # this tab's Stop
        self.saving = saved.on and not single_turn

    def _owner(self, browser_id, request) -> str | None:
        return self.saved.owner(browser_id, request) if self.saving else None

    # ----- the handlers -----

    async def respond(
        self, history, conversation, browser_id, template, system, transform, *sampling, request, thinking=None
    ):
        """Answer the last question of `history` (the typed list, ui/turns.py); yields (history, prompt,
        conversation, its list's update), the conversation saved when the answer ends. A reasoning model's thought
        streams into a Thinking entry above the answer, folded once the answer begins."""
        history = [dict(m) for m in history or []]
        cancel = self.cancels.fresh(session_key(request.session_hash, self.name))
        listed = gr.skip()
        try:
            owner = self._owner(browser_id, request)
            conversation, listed = self._commit(owner, conversation, history)  # the question is kept from now on
            settings = page_sampling(*sampling)
            messages = self.saved.for_the_model(owner, conversation, model_view(history))
            if self.single_turn:  # each question alone
                messages = messages[-1:]
            if not message_text(messages[-1]["content"]).strip():
                raise UserError(EMPTY_MESSAGE)
        except UserError as error:
            yield history + [turns.error(str(error))], "", conversation, listed
            return
        system_message = [{"role": "system", "content": system}] if system is not None else []
        cache = session_key(request.session_hash, f"{self.name}/{conversation}" if conversation else self.name)
        answer = Request(
            sampling=settings,
            image_transform=transform,
            session=cache,
            cancel=cancel,
            messages=system_message + messages,
            chat=ChatOptions(
                template=template, answer_tokens=settings.max_new_tokens, template_kwargs=thinking_kwargs(thinking)
            ),
        )
        asked = len(history)  # where the answer's entries begin
        history.append(turns.answer(""))
        yield history, gr.skip(), conversation, listed
        prompt, line, failed = gr.skip(), "", False
        async for update in answer_updates(self.model, answer):
            if update.rendered is not None:
                prompt = shown_prompt(self.model, update.rendered.text, update.rendered.images)
                turns.with_dropped_turns(history, update.rendered.dropped_turns, self.model.max_seq_len)
                asked = len(history) - 1
            line, failed = update.line, update.error is not None
            thought = update.reasoning and turns.thinking(
                update.reasoning, update.thinking_done, update.thought_seconds
            )
            shown = turns.error(update.error) if failed else turns.answer(update.text.strip())
            history[asked:] = [entry for entry in (thought, shown) if entry and entry["content"]]
            if not history[asked:]:
                history.append(turns.answer(""))
            # the figures (or the place in the queue) under the answer
            yield history + ([turns.stats(line)] if line and not failed else []), prompt, conversation, gr.skip()
        if line and not failed:
            history.append(turns.stats(line))
        yield history, prompt, *self._commit(owner, conversation, history, thinking)

    def _commit(self, owner, conversation, history, thinking=None) -> tuple:
        """(conversation id, the list's update) once `history` is saved (with the thinking switch's value, where
        the page has one)."""
        if owner is None:
            return conversation, gr.skip()
        options = {"thinking": thinking} if thinking is not None else None
        conversation = self.saved.save(owner, conversation, history, options)
        return conversation, gr.update(choices=self.saved.choices(owner), value=conversation)

    @functools.cached_property
    def switch(self) -> tuple[str | None, object]:
        return thinking_switch(self.model) if not self.single_turn else (None, None)

    def thinking_of(self, conversation, browser_id, request: gr.Request):
        """The thinking switch as the open conversation left it (else as the template starts it)."""
        variable, first = self.switch
        if variable is None:
            return gr.skip()
        try:
            owner = self._owner(browser_id, request)
            kept = self.saved.store.get(owner, conversation).options.get("thinking") if conversation else None
        except UserError:
            kept = None
        fits = isinstance(kept, bool) if isinstance(first, bool) else kept in (EFFORTS + ENGINE_THINKING)
        return kept if fits else first

    async def submit(
        self,
        message,
        history,
        conversation,
        browser_id,
        template,
        system,
        transform,
        max_gen_len,
        temperature,
        top_p,
        top_k,
        repetition_penalty,
        thinking=None,
        request: gr.Request = None,
    ):
        """Send the message box's text and images; yields (history, box, prompt, conversation, list)."""
        text, files = message_parts(message)
        typed = {"text": text, "files": files}  # what the box gives back on an error: nothing typed is lost
        if not text.strip():
            gr.Warning(EMPTY_MESSAGE)
            yield history, message, gr.skip(), gr.skip(), gr.skip()
            return
        images, refused = self._attached(files)
        if refused:  # the files taken out of the box, the text left in it: the next Send works
            gr.Warning(refused)
            yield gr.skip(), {"text": text, "files": [path for path, _ in images]}, gr.skip(), gr.skip(), gr.skip()
            return
        try:
            owner = self._owner(browser_id, request)
            if owner is not None and conversation is None:
                conversation = new_conversation_id()
            question = self.saved.user_message(owner, conversation, text, images)
        except UserError as error:
            failed = list(history or []) + [{"role": "user", "content": text}, turns.error(str(error))]
            yield failed, typed, "", conversation, gr.skip()
            return
        history = list(history or []) + [question]
        box = None  # empty the message box once; later pieces leave it alone, so the next message can be typed
        async for history, prompt, conversation, listed in self.respond(
            history,
            conversation,
            browser_id,
            template,
            system,
            transform,
            max_gen_len,
            temperature,
            top_p,
            top_k,
            repetition_penalty,
            request=request,
            thinking=thinking,
        ):
            if kind_of(history[-1]) == "error":
                box = typed
            yield history, box, prompt, conversation, listed
            box = gr.skip()

    def _attached(self, files) -> tuple[list[tuple[str, object]], str]:
        """(path, checked image) of each attached file that can be read, and the sentence for those that cannot
        (empty when none): a model that cannot see refuses them all."""
        if files and not self.model.sees_images:
            return [], (
                "This model does not see images, so the attachment was taken out of the message (your text is still "
                "there); start a model that sees them to ask about an image."
            )
        images, refused = [], []
        for path in files:
            try:
                images.append((path, open_upload(path, self.max_upload_mb)))
            except UserError as error:
                refused.append(str(error))
        if not refused:
            return images, ""
        return images, "Taken out of the message (your text is still there): " + " ".join(refused)

    async def regenerate(
        self,
        history,
        conversation,
        browser_id,
        template,
        system,
        transform,
        max_gen_len,
        temperature,
        top_p,
        top_k,
        repetition_penalty,
        thinking=None,
        request: gr.Request = None,
    ):
        history = up_to_last_question(history)
        if not history:
            yield history, "", conversation, gr.skip()
            return
        async for update in self.respond(
            history,
            conversation,
            browser_id,
            template,
            system,
            transform,
            max_gen_len,
            temperature,
            top_p,
            top_k,
            repetition_penalty,
            request=request,
            thinking=thinking,
        ):
            yield update

    async def edit(
        self,
        history,
        conversation,
        browser_id,
        template,
        system,
        transform,
        max_gen_len,
        temperature,
        top_p,
        top_k,
        repetition_penalty,
        thinking=None,
        edited: gr.EditData = None,
        request: gr.Request = None,
    ):
        """A past user message was edited: drop what followed it and answer it again (its images stay)."""
        history = list(history or [])[: edited.index + 1]
        history[-1] = edited_question(history[-1]["content"], message_text(edited.value))
        async for update in self.respond(
            history,
            conversation,
            browser_id,
            template,
            system,
            transform,
            max_gen_len,
            temperature,
            top_p,
            top_k,
            repetition_penalty,
            request=request,
            thinking=thinking,
        ):
            yield update

    def stop(self, request: gr.Request):
        self.cancels.cancel(session_key(request.session_hash, self.name))

    def mark_stopped(self, history, conversation, browser_id, request: gr.Request):
        """After Stop: the answer as it was shown, marked as stopped, and saved so."""
        history = turns.marked_stopped(history)
        if history is None:
            return gr.skip(), gr.skip(), gr.skip()
        owner = self._owner(browser_id, request)
        return history, *self._commit(owner, conversation, history)

    def undo(self, history, conversation, browser_id, request: gr.Request):
        history = up_to_last_question(history)
        last = history.pop() if history else None
        text = IMAGE_REF.sub("", message_text(last["content"])) if last else ""
        if conversation is None:  # nothing saved yet, nothing to save
            return history, {"text": text, "files": []}, conversation, gr.skip()
        return (
            history,
            {"text": text, "files": []},
            *self._commit(self._owner(browser_id, request), conversation, history),
        )

    # ----- saved conversations -----

    def first_load(self, browser_id, was_open, request: gr.Request):
        """The page's first load: the browser's id (made now if it has none), its conversations, and the one that
        was open on its page before (a reload), reopened: (id, list, chat, conversation, title)."""
        browser_id = self.saved.browser_id(browser_id)
        owner = self._owner(browser_id, request)
        shown, conversation, title = [], None, ""
        was_open = was_open.get("conversation") if isinstance(was_open, dict) else None
        if isinstance(was_open, str):
            try:
                found = self.saved.store.get(owner, was_open)
                shown, conversation, title = self.saved.shown(owner, found.id, found.messages), found.id, found.title
            except UserError:  # deleted meanwhile (in another tab), or another login's: an empty chat
                pass
        listed = gr.update(choices=self.saved.choices(owner), value=conversation)
        return browser_id, listed, shown, conversation, title

    def open(self, chosen, browser_id, request: gr.Request):
        """Reopen one of this owner's conversations: (chat, conversation, title, note)."""
        if not chosen:
            return gr.skip(), gr.skip(), gr.skip(), ""
        try:
            owner = self._owner(browser_id, request)
            found = self.saved.store.get(owner, chosen)
        except UserError as error:
            return gr.skip(), gr.skip(), gr.skip(), str(error)
        return self.saved.shown(owner, found.id, found.messages), found.id, found.title, ""

    @staticmethod
    def new_chat():
        return [], None, gr.update(value=None), "", "", None

    @staticmethod
    def conversation_actions(conversation):
        """What depends on which conversation is open: the browser's memory of it (a reload reopens it), the actions
        that need one (enabled only then), and a delete confirmation, which belonged to the one before."""
        needs_one = gr.update(interactive=conversation is not None)
        # in a dict: the browser keeps no empty value, and a reload after New chat must find "none open"
        return {"conversation": conversation}, *[needs_one] * 5, gr.update(visible=False), None

    def rename(self, conversation, title, browser_id, request: gr.Request):
        try:
            owner = self._owner(browser_id, request)
            if conversation is None:
                raise UserError("Send a message first: a new chat gets its title from it.")
            self.saved.store.rename(owner, conversation, title)
        except UserError as error:
            return gr.skip(), str(error)
        return gr.update(choices=self.saved.choices(owner), value=conversation), "Renamed."

    def delete(self, asked_for, conversation, browser_id, request: gr.Request):
        """Delete the conversation the confirmation was asked for (`asked_for`), only while it is the one open."""
        if asked_for is None or asked_for != conversation:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), "Nothing was deleted: open the conversation to delete."
        try:
            owner = self._owner(browser_id, request)
            self.saved.store.delete(owner, conversation)
        except UserError as error:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), str(error)
        return [], None, gr.update(choices=self.saved.choices(owner), value=None), "", "Deleted."

    def export(self, kind: str):
        def export(conversation, browser_id, request: gr.Request):
            try:
                if conversation is None:
                    raise UserError("There is nothing to export yet: send a message first.")
                path = self.saved.export(self._owner(browser_id, request), conversation, kind)
            except UserError as error:
                return gr.update(visible=False), str(error)
            return gr.update(value=path, visible=True), ""

        return export

    def import_file(self, file, browser_id, request: gr.Request):
        path = file if isinstance(file, str) else getattr(file, "name", None)
        try:
            owner = self._owner(browser_id, request)
            conversation = self.saved.import_file(owner, path)
            found = self.saved.store.get(owner, conversation)
        except UserError as error:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), str(error)
        shown = self.saved.shown(owner, conversation, found.messages)
        listed = gr.update(choices=self.saved.choices(owner), value=conversation)
        return shown, conversation, listed, found.title, "Imported."

    # ----- the layout -----

    def build(self, browser_id) -> None:
        model = self.model
        conversation = gr.State(None)
        chatbot = gr.Chatbot(
            label="Conversation",
            height="58vh",
            min_height=260,
            buttons=["copy", "copy_all"],
            editable="user",
            placeholder="Ask something" + (", or attach an image" if model.sees_images else "") + ".",
            elem_classes="conversation",
        )
        message = gr.MultimodalTextbox(
            show_label=False,
            placeholder="Type a message and press Enter"
            + (" (attach, drop or paste images)" if model.sees_images else ""),
            file_types=["image"] if model.sees_images else [],
            file_count="multiple",
            sources=["upload"] if model.sees_images else [],
            max_lines=6,
            autofocus=True,
            submit_btn="Send",
            stop_btn=False,
            elem_classes="message",
        )
        variable, first = self.switch
        thinking = gr.State(None)
        if first in ENGINE_THINKING:
            thinking = gr.Radio(list(ENGINE_THINKING), value=first, label="Thinking", elem_classes="thinking")
        elif variable == "enable_thinking":
            thinking = gr.Checkbox(first, label="Think before answering", container=False, elem_classes="thinking")
        elif variable == "reasoning_effort":
            thinking = gr.Radio(list(EFFORTS), value=first, label="Reasoning effort", elem_classes="thinking")
        gr.Examples(IMAGE_EXAMPLES if self.single_turn else EXAMPLES, inputs=message, label="Examples")
        names = conversation_templates(model)
        with gr.Accordion("Template and system prompt", open=False):
            template = gr.Dropdown(names, value=self.template, label="Template")
            system = gr.Textbox(default_system(model, self.template), label="System prompt", lines=2)
        transform = gr.State(self.image_transform)
        if model.sees_images:
            with gr.Accordion("Image transform", open=False):
                transform = gr.Radio(
                    IMAGE_TRANSFORMS, value=self.image_transform, label="Image transform (auto: the model's own)"
                )
        sampling = sampling_controls()
        prompt_view = prompt_panel()

        entries = gr.State([])  # the chat as the page keeps it (ui/turns.py); the Chatbot shows its view
        settings = [conversation, browser_id, template, system, transform, *sampling, thinking]
        chats = self.sidebar_list if self.saving else gr.State(None)
        outputs = [chatbot, entries, prompt_view, conversation, chats]
        common = dict(**GENERATION, show_progress="hidden", api_visibility=UI_ONLY)
        quiet = dict(api_visibility=UI_ONLY)
        toggle = dict(queue=False, show_progress="hidden", **quiet)
        runs = [
            # A message sent while an answer streams is not dropped: it first stops that answer, then is answered.
            message.submit(self.stop, None, None, trigger_mode="multiple", **toggle).then(
                with_view(self.submit),
                [message, entries, *settings],
                [chatbot, entries, message, prompt_view, conversation, chats],
                trigger_mode="multiple",
                **common,
            ),
            chatbot.retry(with_view(self.regenerate), [entries, *settings], outputs, **common),
            chatbot.edit(with_view(self.edit), [entries, *settings], outputs, **common),
        ]
        # while an answer streams, Send becomes Stop (and Escape presses it: PAGE_JS)
        for trigger in (message.submit, chatbot.retry, chatbot.edit):
            trigger(busy_box, None, message, **toggle)
        for run in runs:
            run.then(idle_box, None, message, **toggle)
        message.stop(self.stop, None, None, cancels=runs, **toggle).then(
            with_view(self.mark_stopped),
            [entries, conversation, browser_id],
            [chatbot, entries, conversation, chats],
            **quiet,
        ).then(idle_box, None, message, **toggle)
        chatbot.undo(self.stop, None, None, cancels=runs, queue=False, **quiet).then(
            with_view(self.undo),
            [entries, conversation, browser_id],
            [chatbot, entries, message, conversation, chats],
            **quiet,
        ).then(idle_box, None, message, **toggle)
        template.change(lambda name: default_system(model, name), template, system, **quiet)
        self.chatbot, self.entries, self.conversation, self.runs = chatbot, entries, conversation, runs
        self.thinking = thinking

    def build_sidebar(self) -> None:
        """New chat and this owner's conversations, newest first (reopen, rename, delete, export, import)."""
        with gr.Sidebar(label="Conversations", open=True, elem_classes="conversations"):
            self.new_button = gr.Button("New chat", variant="primary", size="sm")
            self.sidebar_list = gr.Radio([], value=None, show_label=False, container=False, elem_classes="chat-list")
            with gr.Accordion("This conversation", open=False):
                none_open = dict(interactive=False)  # until a conversation is open (`conversation_actions`)
                self.title = gr.Textbox(label="Title", max_lines=1, **none_open)
                self.rename_button = gr.Button("Rename", size="sm", **none_open)
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

    def wire_sidebar(self, browser_id, app: gr.Blocks) -> None:
        quiet = dict(api_visibility=UI_ONLY)
        chatbot, entries, conversation, chats = self.chatbot, self.entries, self.conversation, self.sidebar_list
        chat = [chatbot, entries]
        was_open = self.saved.browser_state("open")  # the conversation open on this browser's page
        asked_to_delete = gr.State(None)  # the conversation a delete confirmation is shown for
        restore = dict(fn=self.thinking_of, inputs=[conversation, browser_id], outputs=self.thinking, **quiet)
        app.load(
            with_view(self.first_load, at=2),
            [browser_id, was_open],
            [browser_id, chats, *chat, conversation, self.title],
            **quiet,
        ).then(**restore)
        actions = [self.title, self.rename_button, self.export_json, self.export_markdown, self.delete_button]
        conversation.change(
            self.conversation_actions, conversation, [was_open, *actions, self.confirm_row, asked_to_delete], **quiet
        )
        stop = dict(fn=self.stop, inputs=None, outputs=None, cancels=self.runs, queue=False, **quiet)
        # New chat, and Gradio's own clear of the chat (hidden by CSS), leave the saved conversation as it is
        for trigger in (self.new_button.click, chatbot.clear):
            trigger(**stop).then(
                with_view(self.new_chat), None, [*chat, conversation, chats, self.title, self.note, self.download],
                **quiet,
            ).then(**restore)  # fmt: skip
        chats.input(**stop).then(
            with_view(self.open), [chats, browser_id], [*chat, conversation, self.title, self.note], **quiet
        ).then(**restore)
        self.rename_button.click(self.rename, [conversation, self.title, browser_id], [chats, self.note], **quiet)
        for button, kind in ((self.export_json, "json"), (self.export_markdown, "md")):
            button.click(self.export(kind), [conversation, browser_id], [self.download, self.note], **quiet)
        shown, hidden = gr.update(visible=True), gr.update(visible=False)
        self.delete_button.click(lambda c: (shown, c), conversation, [self.confirm_row, asked_to_delete], **quiet)
        self.keep.click(lambda: (hidden, None), None, [self.confirm_row, asked_to_delete], **quiet)
        self.confirm_delete.click(**stop).then(
            with_view(self.delete),
            [asked_to_delete, conversation, browser_id],
            [*chat, conversation, chats, self.title, self.note],
            **quiet,
        ).then(lambda: (hidden, None), None, [self.confirm_row, asked_to_delete], **quiet).then(**restore)
        self.import_button.upload(
            with_view(self.import_file),
            [self.import_button, browser_id],
            [*chat, conversation, chats, self.title, self.note],
            **quiet,
        ).then(**restore)


class SingleTurnTab:
    def __init__(self, model: Engine, cancels: Cancels):
        self.model, self.cancels = model, cancels

    async def run(
        self,
        instruction,
        input_text,
        template,
        max_gen_len,
        temperature,
        top_p,
        top_k,
        repetition_penalty,
        request: gr.Request,
    ):
        cancel = self.cancels.fresh(session_key(request.session_hash, "single"))
        try:
            settings = page_sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty)
            prompt = single_turn_prompt(instruction, input_text, template)
        except UserError as error:
            yield ERROR_MARK + str(error), "", ""
            return
        async for update in answer_updates(self.model, Request(prompt, settings, cancel=cancel)):
            yield (ERROR_MARK + update.error) if update.error else update.text.strip(), update.line, prompt

    def stop(self, request: gr.Request):
        self.cancels.cancel(session_key(request.session_hash, "single"))

    def build(self) -> None:
        instruction = gr.Textbox(
            label="Instruction", lines=3, placeholder="What is the capital of France?", elem_classes="message"
        )
        input_text = gr.Textbox(label="Input (optional context)", lines=2)
        template = gr.Dropdown(list(TEMPLATE_NAMES), value="alpaca", label="Template")
        with gr.Row():
            run = gr.Button("Generate", variant="primary")
            stop = gr.Button("Stop", variant="stop", visible=False)  # only while an answer streams
        answer = gr.Textbox(label="Answer", lines=6, interactive=False, buttons=["copy"])
        stats = gr.Markdown(elem_classes="stats")
        gr.Examples([e["text"] for e in EXAMPLES], inputs=instruction, label="Examples")
        sampling = sampling_controls()
        prompt_view = prompt_panel()
        inputs = [instruction, input_text, template, *sampling]
        common = dict(**GENERATION, api_visibility=UI_ONLY)
        toggle = dict(queue=False, show_progress="hidden", api_visibility=UI_ONLY)
        running = [gr.update(visible=False), gr.update(visible=True)]  # (Generate, Stop)
        idle = [gr.update(visible=True), gr.update(visible=False)]
        runs = []
        for trigger in (run.click, instruction.submit):
            trigger(lambda: running, None, [run, stop], **toggle)
            runs.append(trigger(self.run, inputs, [answer, stats, prompt_view], **common))
            runs[-1].then(lambda: idle, None, [run, stop], **toggle)
        stop.click(self.stop, None, None, cancels=runs, **toggle).then(lambda: idle, None, [run, stop], **toggle)


def build_app(
    model: Engine,
    tabs: tuple[str, ...] = ("chat", "single"),
    template: str | None = None,
    image_transform: str = IMAGE_TRANSFORM,
    title: str = "Chat",
    max_upload_mb: float = MAX_UPLOAD_MB,
    store: Store | None = None,
) -> gr.Blocks:
    """The app over `model`: the chat ("chat"; images where the model sees them, kept in `store`'s saved
    conversations when one is given), single questions about an image ("chat_single"), and the Single-turn tab
    ("single"). `max_upload_mb` caps the images this app reads (also pass it to `launch(max_file_size=...)`, which
    caps what Gradio receives). Serve `SavedChats(store).route()` beside it: the saved images' route."""
    template = default_template(model, template)
    cancels = Cancels()
    saved = SavedChats(store, max_upload_mb)
    tabs = tuple(dict.fromkeys(FORMER_TABS.get(tab, tab) for tab in tabs))
    labels = {"chat": "Chat", "chat_single": "Image questions", "single": "Single-turn"}
    with gr.Blocks(title=title) as app:
        browser_id = saved.browser_state() if saved.on else gr.State(None)
        chat_tabs = {
            tab: ChatTab(model, cancels, template, image_transform, saved, tab == "chat_single", max_upload_mb)
            for tab in tabs
            if tab.startswith("chat")
        }
        saving = next((chat for chat in chat_tabs.values() if chat.saving), None)
        if saving is not None:
            saving.build_sidebar()
        gr.HTML(model_panel(model), elem_classes="model-line")
        with gr.Tabs():
            for tab in tabs:
                with gr.Tab(labels[tab], id=tab):
                    if tab == "single":
                        SingleTurnTab(model, cancels).build()
                    else:
                        chat_tabs[tab].build(browser_id)
        if saving is not None:
            saving.wire_sidebar(browser_id, app)
        gr.api(
            api_chat(model, cancels, template, image_transform, max_upload_mb),
            api_name="chat",
            **GENERATION,
        )
        if "single" in tabs:
            gr.api(api_single_turn(model, cancels), api_name="single_turn", **GENERATION)

        def tab_closed(request: gr.Request):
            cancels.cancel_session(request.session_hash)
            model.drop_sessions(request.session_hash)

        app.unload(tab_closed)
    return app
