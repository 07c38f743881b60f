"""The model picker (--models_dir): a dropdown in the model line, each browser session with its own current model.
Choosing one that is not loaded loads it (engine/models.py) while the page stays usable, and a line under the picker
says how long it has been loading; once it is loaded, the model line, the chat's template, system prompt and
attachments follow the new model, and the conversation goes on with it (its history rendered by the new template)."""

from __future__ import annotations

import asyncio

import gradio as gr

from local_chat.engine.chats import ChatEngine
from local_chat.engine.models import ModelEngine, Models
from local_chat.prompting import conversation_templates, default_system

from .layout import message_box_images, model_panel
from .wiring import UI_ONLY

LOADING_POLL_S = 0.5  # how often the line under the picker tells how long the load has taken


class ModelPicker:
    """The picker over `models`, starting on `first` (the --model one, loaded already)."""

    def __init__(self, models: Models, first: str, max_upload_mb: float, admins: list[str] | None = None):
        self.models, self.first, self.max_upload_mb = models, first, max_upload_mb
        self.admins = admins  # the logins that may load a model (None: everyone)
        self._engines: dict[str, ChatEngine] = {}
        self._systems: dict[str, str | None] = {}  # each model's system prompt, where --models_config gives one

    def engine_of(self, model_id: str | None) -> ChatEngine:
        """The chat engine of `model_id` (loading it, where it is not loaded, to learn its default template)."""
        model_id = model_id or self.first
        if model_id not in self._engines:
            lease = self.models.lease(model_id)
            lease.release()
            self._systems[model_id] = lease.system
            self._engines[model_id] = ChatEngine(ModelEngine(self.models, model_id), lease.template, self.max_upload_mb)
        return self._engines[model_id]

    def system_of(self, model_id: str | None) -> str:
        """`model_id`'s default system prompt: its --models_config's, else its template's."""
        engine = self.engine_of(model_id)
        given = self._systems.get(model_id or self.first)
        return given if given is not None else default_system(engine, engine.template)

    def build(self, start_line: str) -> None:
        """The dropdown and the model line beside it, and the line under them that says what is loading."""
        with gr.Row(elem_classes="model-row"):
            self.dropdown = gr.Dropdown(
                self.models.ids(), value=self.first, label="Model", scale=0, min_width=220, elem_classes="model-picker"
            )
            self.line = gr.HTML(start_line, elem_classes="model-line")
        self.status = gr.Markdown("", elem_classes="model-status")
        self.current = gr.State(self.first)  # this browser session's model

    def wire(self, tabs: list) -> None:
        """Choosing a model updates the chat tabs' parts that depend on it (`tab.model_outputs`)."""
        outputs = [self.current, self.dropdown, self.line, self.status]
        for tab in tabs:
            outputs += tab.model_outputs()
        self.dropdown.input(
            self.choose,
            [self.dropdown, self.current],
            outputs,
            show_progress="hidden",
            concurrency_limit=None,
            api_visibility=UI_ONLY,
        )
        self._tabs = tabs

    async def choose(self, chosen: str, current: str, request: gr.Request):
        """Load `chosen` (saying how long it has taken), then switch this session to it; a model that cannot load
        (or that only an admin may load) says why and the session keeps its model."""
        may_load = self.admins is None or getattr(request, "username", None) in self.admins
        others = [gr.skip() for tab in self._tabs for _ in tab.model_outputs()]
        if chosen == current:
            yield gr.skip(), gr.skip(), gr.skip(), "", *others
            return
        loading = asyncio.get_running_loop().run_in_executor(None, self.models.lease_or_failure, chosen, may_load)
        while not loading.done():
            yield (
                gr.skip(),
                gr.skip(),
                gr.skip(),
                f"Waiting for the model: {self.models.waiting_sentence(chosen)}…",
                *others,
            )
            await asyncio.wait([loading], timeout=LOADING_POLL_S)
        lease = loading.result()
        if isinstance(lease, str):
            yield gr.skip(), current, gr.skip(), f"⚠️ {lease} This chat keeps {current}.", *others
            return
        lease.release()
        engine = self.engine_of(chosen)
        updates = [update for _ in self._tabs for update in chat_updates(engine, self.system_of(chosen))]
        yield chosen, gr.skip(), model_panel(engine), f"Now answering: **{chosen}**.", *updates


def chat_updates(engine: ChatEngine, system: str) -> list:
    """A chat tab's `model_outputs` for `engine`: the template and system prompt reset to its defaults, and the
    message box taking images or not as it sees them."""
    return [
        gr.update(choices=conversation_templates(engine), value=engine.template),
        system,
        gr.update(**message_box_images(engine.sees_images)),
    ]
