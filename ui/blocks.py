"""The Gradio app: Chat, Vision chat and Single-turn tabs over one engine, and the /chat and /single_turn API.

Every tab and the API build their prompts with prompting/ and read the engine's events (engine/interface.py) on a
thread of their own (`ui.chat.answer_updates`), so the model computes while Gradio sends the update before. A
per-session cancel flag is read before each forward pass, and a handler that Gradio closes stops its stream after
the current step, so Stop, a new message or a closed tab end the answer on the server within a decode step or two.
Gradio does not limit how many answers run at once: the engine it is given (engine/in_order.py) serves the page's
and the /v1 API's requests in arrival order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import gradio as gr

from engine import Engine, Request, Sampling, checkpoint_name
from launchers.flags import IMAGE_TRANSFORMS, MAX_UPLOAD_MB
from model.prefix_cache import session_key
from prompting import (
    EMPTY_MESSAGE,
    chat_prompt,
    conversation_templates,
    default_system,
    default_template,
    message_text,
    open_upload,
    single_turn_prompt,
)
from single_turn_templates import TEMPLATE_NAMES
from user_error import UserError

from .chat import Cancels, answer_updates, save_preview

ERROR_MARK = "⚠️ "
EXAMPLES = ["What is 23 plus 45?", "What is the capital of Japan?", "Who are you?", "What can you do?"]
IMAGE_EXAMPLES = ["What is in the image?", "What color is the circle?", "How many shapes are there?"]
CSS = ".stats { font-size: 0.8em; opacity: 0.75; }"
# Images come from the app itself only: a model talked into writing <img src="https://..."> or ![](https://...)
# cannot make the browser call an outside address (and send it whatever the model put into the URL).
HEAD = """<meta http-equiv="Content-Security-Policy" content="img-src 'self' data: blob:">"""
PAGE = {"css": CSS, "head": HEAD}  # what `launch` needs besides the address
# every event that runs the model: no Gradio limit, the engine queues them with the /v1 API's (engine/in_order.py)
GENERATION = dict(concurrency_id="generation", concurrency_limit=None)
UI_ONLY = "undocumented"  # the page's own events stay out of the API docs: /chat and /single_turn are the API


def model_panel(model: Engine) -> str:
    """The model line over the tabs; the checkpoint by its folder's name (nothing of the server's disk)."""
    facts = model.summary()
    name = checkpoint_name(facts)
    if "engine_url" in facts:  # engine/remote.py: a model another server serves
        context = f"context {facts['context']} tokens" if facts["context_known"] else "context: the engine's"
        seeing = " · sees images" if facts["sees_images"] else ""
        return f"**Model** `{facts['path']}` · served by {facts['engine_url']} · {context}{seeing}"
    return (
        f"**Model** `{name}` · {facts['architecture']} · {facts.get('format', '')} · "
        f"dtype {facts.get('dtype', '')} · device {facts.get('device', '')} · quantization "
        f"{facts.get('quant', 'none')} · weights {facts['weight_mib']:,.0f} MiB · context {facts['context']} tokens"
        + (" · sees images" if facts["sees_images"] else "")
        + (" · compiled decoding" if facts["compiled"] else "")
        + f" · batching: {facts.get('batching', 'off')}"
    )


def page_sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty) -> Sampling:
    """The sampling the page's settings (`sampling_controls`, in that order), or the /chat API's, ask for."""
    return Sampling(int(max_gen_len), float(temperature), float(top_p), int(top_k), float(repetition_penalty))


def sampling_controls() -> list[gr.components.Component]:
    defaults = Sampling()
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


def error_message(text: str) -> dict:
    return {"role": "assistant", "content": ERROR_MARK + text}


def dropped_turns_notice(turns: int, context: int) -> dict:
    """A note in the chat (not part of the conversation the model sees) that its oldest turns were left out."""
    return {
        "role": "assistant",
        "metadata": {"title": "Older turns left out"},
        "content": f"The model no longer sees the {turns} oldest turn{'s' if turns > 1 else ''} of this "
        f"conversation: the conversation is longer than its {context}-token context.",
    }


def is_notice(message: dict) -> bool:
    return bool((message.get("metadata") or {}).get("title"))


def model_view(history: list[dict]) -> list[dict]:
    """The conversation as the model should see it: notes, and errors with the questions they answered, left out."""
    kept: list[dict] = []
    for message in history:
        if is_notice(message):
            continue
        if message["role"] == "assistant" and message_text(message["content"]).startswith(ERROR_MARK):
            if kept and kept[-1]["role"] == "user":
                kept.pop()
            continue
        kept.append(message)
    return kept


def up_to_last_question(history: list[dict]) -> list[dict]:
    """The conversation without the answer(s) after its last user message."""
    history = list(history or [])
    while history and history[-1]["role"] != "user":
        history.pop()
    return history


class ChatTab:
    """One chat (text or about an image); `history` is Gradio's list of {"role", "content"} messages."""

    def __init__(
        self,
        model: Engine,
        cancels: Cancels,
        template: str,
        image_transform: str,
        vision: bool,
        single_turn: bool = False,
        max_upload_mb: float = MAX_UPLOAD_MB,
    ):
        self.model, self.cancels, self.vision, self.single_turn = model, cancels, vision, single_turn
        self.template, self.image_transform, self.max_upload_mb = template, image_transform, max_upload_mb
        self.name = ("vision" if vision else "chat") + ("_single" if single_turn else "")  # its KV cache's key

    # ----- the handlers -----

    async def respond(self, history, image_path, template, system, transform, *sampling, request: gr.Request):
        """Answer the last user message of `history`; yields (history, stats, prompt)."""
        history = [dict(m) for m in history or []]
        question = message_text(history[-1]["content"])
        key = session_key(request.session_hash, self.name)  # this tab of this browser session: its Stop, its cache
        cancel = self.cancels.fresh(key)
        try:
            settings = page_sampling(*sampling)
            image = open_upload(image_path, self.max_upload_mb) if self.vision else None
            past = [] if self.single_turn else model_view(history[:-1])  # single-turn: each question alone
            chat = chat_prompt(self.model, template, system, past, question, settings.max_new_tokens, image)
        except UserError as error:
            yield history + [error_message(str(error))], "", ""
            return
        if chat.dropped_turns:
            notice = dropped_turns_notice(chat.dropped_turns, self.model.max_seq_len)
            if notice["content"] != next((m["content"] for m in reversed(history) if is_notice(m)), None):
                history.append(notice)  # once for each new cut, not at every turn
        history.append({"role": "assistant", "content": ""})
        yield history, "", chat.text
        answer = Request(
            chat.text, settings, tuple(chat.stop_symbols), chat.images or None, transform, session=key, cancel=cancel
        )
        async for text, line, error in answer_updates(self.model, answer):
            history[-1] = error_message(error) if error else {"role": "assistant", "content": text.strip()}
            yield history, line, chat.text

    async def submit(
        self,
        message,
        history,
        image_path,
        template,
        system,
        transform,
        max_gen_len,
        temperature,
        top_p,
        top_k,
        repetition_penalty,
        request: gr.Request,
    ):
        if not message.strip():
            gr.Warning(EMPTY_MESSAGE)
            yield history, message, gr.skip(), gr.skip()
            return
        history = list(history or []) + [{"role": "user", "content": message}]
        box = ""  # empty the message box once; later pieces leave it alone, so the next message can be typed
        async for history, stats, prompt in self.respond(
            history,
            image_path,
            template,
            system,
            transform,
            max_gen_len,
            temperature,
            top_p,
            top_k,
            repetition_penalty,
            request=request,
        ):
            if message_text(history[-1]["content"]).startswith(ERROR_MARK):
                box = message  # what the user typed survives an error
            yield history, box, stats, prompt
            box = gr.skip()

    async def regenerate(
        self,
        history,
        image_path,
        template,
        system,
        transform,
        max_gen_len,
        temperature,
        top_p,
        top_k,
        repetition_penalty,
        request: gr.Request,
    ):
        history = up_to_last_question(history)
        if not history:
            yield history, "", ""
            return
        async for update in self.respond(
            history,
            image_path,
            template,
            system,
            transform,
            max_gen_len,
            temperature,
            top_p,
            top_k,
            repetition_penalty,
            request=request,
        ):
            yield update

    async def edit(
        self,
        history,
        image_path,
        template,
        system,
        transform,
        max_gen_len,
        temperature,
        top_p,
        top_k,
        repetition_penalty,
        edited: gr.EditData,
        request: gr.Request,
    ):
        """A past user message was edited: drop what followed it and answer it again."""
        history = list(history or [])[: edited.index + 1]
        history[-1] = {"role": "user", "content": message_text(edited.value)}
        async for update in self.respond(
            history,
            image_path,
            template,
            system,
            transform,
            max_gen_len,
            temperature,
            top_p,
            top_k,
            repetition_penalty,
            request=request,
        ):
            yield update

    def stop(self, request: gr.Request):
        self.cancels.cancel(session_key(request.session_hash, self.name))

    @staticmethod
    def undo(history):
        history = up_to_last_question(history)
        last = message_text(history.pop()["content"]) if history else ""
        return history, last

    def new_image(self, path):
        """A new image starts a new conversation about it; the checked copy is what the model and preview see."""
        if not path:
            return [], None, None, ""
        try:
            preview = save_preview(open_upload(path, self.max_upload_mb))
        except UserError as error:
            return [error_message(str(error))], None, None, ""
        return [], preview, preview, "New image: a new conversation about it starts."

    # ----- the layout -----

    def build(self) -> None:
        model = self.model
        chatbot = gr.Chatbot(
            label="Conversation",
            height=460,
            buttons=["copy", "copy_all"],
            editable="user",
            placeholder="Ask something, or pick an example below.",
        )
        with gr.Row():
            message = gr.Textbox(
                show_label=False,
                placeholder="Type a message and press Enter",
                scale=8,
                max_lines=6,
                autofocus=not self.vision,
                elem_classes="message",
            )
            send = gr.Button("Send", variant="primary", scale=1, min_width=80)
            stop = gr.Button("Stop", variant="stop", scale=1, min_width=80)
        with gr.Row():
            regenerate = gr.Button("Regenerate", size="sm")
            undo = gr.Button("Undo", size="sm")
            clear = gr.Button("Clear", size="sm")
        stats = gr.Markdown(elem_classes="stats")
        image_state = gr.State(None)
        transform = gr.State(self.image_transform)
        if self.vision:
            with gr.Row():
                upload = gr.File(
                    label="Image (click or drop; a new image starts a new conversation)",
                    file_types=["image"],
                    type="filepath",
                    height=140,
                )
                preview = gr.Image(label="The image", interactive=False, height=200)
            with gr.Row():
                transform = gr.Radio(
                    IMAGE_TRANSFORMS, value=self.image_transform, label="Image transform (auto: the model's own)"
                )
        gr.Examples(IMAGE_EXAMPLES if self.vision else EXAMPLES, inputs=message, label="Examples")
        names = conversation_templates(model)
        with gr.Accordion("Template and system prompt", open=False):
            template = gr.Dropdown(names, value=self.template, label="Template")
            system = gr.Textbox(default_system(model, self.template), label="System prompt", lines=2)
        sampling = sampling_controls()
        with gr.Accordion("Prompt sent to the model", open=False):
            prompt_view = gr.Code(label="Prompt", language=None, interactive=False)

        settings = [image_state, template, system, transform, *sampling]
        outputs = [chatbot, stats, prompt_view]
        common = dict(**GENERATION, show_progress="hidden", api_visibility=UI_ONLY)
        # A message sent while an answer streams is not dropped: it first stops that answer, then is answered.
        sends = [
            trigger(self.stop, None, None, queue=False, trigger_mode="multiple", api_visibility=UI_ONLY).then(
                self.submit,
                [message, chatbot, *settings],
                [chatbot, message, stats, prompt_view],
                trigger_mode="multiple",
                **common,
            )
            for trigger in (message.submit, send.click)
        ]
        runs = [
            *sends,
            regenerate.click(self.regenerate, [chatbot, *settings], outputs, **common),
            chatbot.retry(self.regenerate, [chatbot, *settings], outputs, **common),
            chatbot.edit(self.edit, [chatbot, *settings], outputs, **common),
        ]
        stop.click(self.stop, None, None, cancels=runs, queue=False, api_visibility=UI_ONLY)
        undo.click(self.stop, None, None, cancels=runs, queue=False, api_visibility=UI_ONLY).then(
            self.undo, chatbot, [chatbot, message], api_visibility=UI_ONLY
        )
        chatbot.undo(self.stop, None, None, cancels=runs, queue=False, api_visibility=UI_ONLY).then(
            self.undo, chatbot, [chatbot, message], api_visibility=UI_ONLY
        )
        clear.click(self.stop, None, None, cancels=runs, queue=False, api_visibility=UI_ONLY).then(
            lambda: ([], "", ""), None, outputs, api_visibility=UI_ONLY
        )
        template.change(lambda name: default_system(model, name), template, system, api_visibility=UI_ONLY)
        if self.vision:
            upload.change(self.stop, None, None, cancels=runs, queue=False, api_visibility=UI_ONLY).then(
                self.new_image, upload, [chatbot, image_state, preview, stats], api_visibility=UI_ONLY
            )


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
        async for text, line, error in answer_updates(self.model, Request(prompt, settings, cancel=cancel)):
            yield (ERROR_MARK + error) if error else text.strip(), line, prompt

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
            stop = gr.Button("Stop", variant="stop")
        answer = gr.Textbox(label="Answer", lines=6, interactive=False, buttons=["copy"])
        stats = gr.Markdown(elem_classes="stats")
        gr.Examples(EXAMPLES, inputs=instruction, label="Examples")
        sampling = sampling_controls()
        with gr.Accordion("Prompt sent to the model", open=False):
            prompt_view = gr.Code(label="Prompt", language=None, interactive=False)
        inputs = [instruction, input_text, template, *sampling]
        common = dict(**GENERATION, api_visibility=UI_ONLY)
        runs = [
            run.click(self.run, inputs, [answer, stats, prompt_view], **common),
            instruction.submit(self.run, inputs, [answer, stats, prompt_view], **common),
        ]
        stop.click(self.stop, None, None, cancels=runs, queue=False, api_visibility=UI_ONLY)


def api_error(sentence: str) -> gr.Error:
    """The sentence for an API caller; a caller's mistake is not the server's, so no traceback in its terminal."""
    return gr.Error(sentence, print_exception=False)


async def api_answer(engine: Engine, request: Request) -> AsyncIterator[str]:
    """The growing answer for an API caller; an error ends the call as that one sentence."""
    async for text, _, error in answer_updates(engine, request):
        if error:
            raise api_error(error)
        yield text.strip()


def api_chat(
    model: Engine,
    cancels: Cancels,
    launcher_template: str,
    image_transform: str,
    max_upload_mb: float = MAX_UPLOAD_MB,
):
    async def chat(
        message: str,
        history: list[dict],
        image: gr.FileData | None = None,
        max_gen_len: int = 256,
        temperature: float = 0.1,
        top_p: float = 0.75,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
        system: str | None = None,
        template: str | None = None,
        request: gr.Request = None,
    ) -> AsyncIterator[str]:
        """Answer `message` after `history` ([{"role", "content"}, ...]); yields the growing answer. The oldest
        turns of a history longer than the context are left out. `system` (or a "system" message in `history`)
        replaces the template's system prompt; `template` (default: the launcher's) is a conversation template."""
        key = session_key(request.session_hash, "api")
        cancel = cancels.fresh(key)
        path = image["path"] if isinstance(image, dict) else getattr(image, "path", None)
        try:
            if template in TEMPLATE_NAMES:
                raise UserError(
                    f"{template!r} is a single-turn template: call /single_turn with it, or pass /chat "
                    f"one of: {', '.join(conversation_templates(model))}."
                )
            picture = open_upload(path, max_upload_mb)
            settings = page_sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty)
            prompt = chat_prompt(
                model, template or launcher_template, system, history, message, settings.max_new_tokens, picture
            )
        except UserError as error:
            raise api_error(str(error))
        answer = Request(
            prompt.text,
            settings,
            tuple(prompt.stop_symbols),
            prompt.images or None,
            image_transform,
            session=key,
            cancel=cancel,
        )
        async for text in api_answer(model, answer):
            yield text

    return chat


def api_single_turn(model: Engine, cancels: Cancels):
    async def single_turn(
        instruction: str,
        input: str = "",
        template: str = "alpaca",
        max_gen_len: int = 256,
        temperature: float = 0.1,
        top_p: float = 0.75,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
        request: gr.Request = None,
    ) -> AsyncIterator[str]:
        """Answer one instruction in a single-turn template (alpaca, shortqa, qg, caption, None)."""
        cancel = cancels.fresh(session_key(request.session_hash, "api-single"))
        try:
            settings = page_sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty)
            prompt = single_turn_prompt(instruction, input, template)
        except UserError as error:
            raise api_error(str(error))
        async for text in api_answer(model, Request(prompt, settings, cancel=cancel)):
            yield text

    return single_turn


def build_app(
    model: Engine,
    tabs: tuple[str, ...] = ("chat", "vision", "single"),
    template: str | None = None,
    image_transform: str = "padded_resize",
    title: str = "Chat",
    max_upload_mb: float = MAX_UPLOAD_MB,
) -> gr.Blocks:
    """The app over `model`; a "vision" tab is left out when the model cannot see images. `max_upload_mb` caps
    the images this app reads (also pass it to `launch(max_file_size=...)`, which caps what Gradio receives)."""
    template = default_template(model, template)
    cancels = Cancels()
    if not model.sees_images:
        tabs = tuple(t for t in tabs if not t.startswith("vision"))
    labels = {"chat": "Chat", "vision": "Vision chat", "vision_single": "Image questions", "single": "Single-turn"}
    with gr.Blocks(title=title) as app:
        gr.Markdown(model_panel(model), elem_classes="stats")
        with gr.Tabs():
            for tab in tabs:
                with gr.Tab(labels[tab], id=tab):
                    if tab == "single":
                        SingleTurnTab(model, cancels).build()
                    else:
                        ChatTab(
                            model,
                            cancels,
                            template,
                            image_transform,
                            vision=tab.startswith("vision"),
                            single_turn=tab == "vision_single",
                            max_upload_mb=max_upload_mb,
                        ).build()
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
