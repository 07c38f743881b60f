"""The model picker (--models_dir): a dropdown in the model line, each browser session with its own current model.
Choosing one that is not loaded loads it (engine/choices/folders.py) while the page stays usable, and a line under the
picker says how far the load has come; once it is loaded, the model line, the chat's template, system prompt,
attachments, thinking switch and answer settings follow the new model, and the conversation goes on with it (its
history rendered by the new template). Reopening a saved conversation offers the model of its latest answer."""

from __future__ import annotations

import asyncio

import gradio as gr

from local_chat.engine.chats import ChatEngine
from local_chat.engine.choices.chosen import ModelEngine
from local_chat.engine.choices.common import Lease
from local_chat.engine.choices.folders import Models, NotLoaded
from local_chat.engine.interface import Sampling
from local_chat.prompting import conversation_templates, default_system

from .layout import message_box_images, model_panel, sampling_values
from .thinking import thinking_update
from .wiring import UI_ONLY

LOADING_POLL_S = 0.5  # how often the line under the picker tells how long the load has taken
BAR_CELLS = 20  # the load's progress bar


class ModelPicker:
    """The picker over `models`, starting on `first` (the --model one, loaded already)."""

    def __init__(self, models: Models, first: str, max_upload_mb: float, admins: list[str] | None = None):
        self.models, self.first, self.max_upload_mb = models, first, max_upload_mb
        self.admins = admins  # the logins that may load a model (None: everyone)
        self._engines: dict[str, ChatEngine] = {}
        self._systems: dict[str, str | None] = {}  # each model's system prompt, where --models_config gives one
        self._samplings: dict[str, Sampling] = {}  # each model's answer settings on the page

    def engine_of(self, model_id: str | None, request: gr.Request | None = None) -> ChatEngine:
        """The chat engine of `model_id`. For an answer to `request`'s login that may not load models (--admins),
        `NotLoaded` where it is not loaded now (the least recently used was unloaded to make room, or it was quiet
        too long). A model the picker never had is loaded to learn its facts (a blocking call, which `choose` makes
        off the server's loop; the page's handlers only ask for models it had)."""
        model_id = model_id or self.first
        if request is not None and not self.may_load(request) and self.models.loaded(model_id) is None:
            raise NotLoaded(
                f"{model_id} is not loaded any more; an admin loads it on the page, or choose a loaded one."
            )
        if model_id not in self._engines:
            self._had(self.models.lease(model_id))
        return self._engines[model_id]

    def _had(self, lease: Lease) -> None:
        """Keep what the page reads of a leased model (its engine's facts, system prompt and settings), then give
        the lease back."""
        model_id = lease.model_id
        self._systems[model_id], self._samplings[model_id] = lease.system, lease.chat_sampling
        if model_id not in self._engines:
            self._engines[model_id] = ChatEngine(ModelEngine(self.models, model_id), lease.template, self.max_upload_mb)
        lease.release()

    def system_of(self, model_id: str | None) -> str:
        """`model_id`'s default system prompt: its --models_config's, else its template's."""
        engine = self.engine_of(model_id)
        given = self._systems.get(model_id or self.first)
        return given if given is not None else default_system(engine, engine.template)

    def sampling_of(self, model_id: str | None) -> Sampling:
        """`model_id`'s answer settings on the page: the page's own, with its --models_config's sampling keys."""
        self.engine_of(model_id)
        return self._samplings[model_id or self.first]

    def build(self, start_line: str) -> None:
        """The dropdown and the model line beside it, and the line under them that says what is loading."""
        with gr.Row(elem_classes="model-row"):
            self.dropdown = gr.Dropdown(
                self.models.ids(), value=self.first, label="Model", scale=0, min_width=220, elem_classes="model-picker"
            )
            self.line = gr.HTML(start_line, elem_classes="model-line")
        with gr.Row(elem_classes="model-status-row"):
            self.status = gr.Markdown("", elem_classes="model-status")
            self.offer = gr.Button(visible=False, size="sm", scale=0, elem_classes="model-offer")
        self.current = gr.State(self.first)  # this browser session's model
        self.offered = gr.State(None)  # the model a reopened conversation's latest answer came from

    def wire(self, tabs: list) -> None:
        """Choosing a model updates the chat tabs' parts that depend on it (`tab.model_outputs`)."""
        outputs = [self.current, self.dropdown, self.line, self.status, self.offer]
        for tab in tabs:
            outputs += tab.model_outputs()
        switch = dict(outputs=outputs, show_progress="hidden", concurrency_limit=None, api_visibility=UI_ONLY)
        self.dropdown.input(self.choose, [self.dropdown, self.current], **switch)
        self.offer.click(self.choose, [self.offered, self.current], **switch)
        self._tabs = tabs

    def offer_model(self, model_id: str | None, current: str):
        """A reopened conversation's model (`model_id`: its latest answer's), offered where it is another than this
        session's and can still be chosen: (status, offer button, offered)."""
        if not model_id or model_id == current or not self.models.known(model_id):
            return "", gr.update(visible=False), None
        said = f"This conversation's latest answer came from **{model_id}**; this chat answers with {current}."
        return said, gr.update(value=f"Go on with {model_id}", visible=True), model_id

    async def choose(self, chosen: str, current: str, request: gr.Request):
        """Load `chosen` (saying how long it has taken), then switch this session to it; a model that cannot load
        (or that only an admin may load) says why and the session keeps its model."""
        may_load = self.may_load(request)
        others = [gr.skip() for tab in self._tabs for _ in tab.model_outputs()]
        hidden = gr.update(visible=False)
        if not chosen or chosen == current:  # the same choice again (the dropdown may send one twice): as it is
            yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), hidden, *others
            return
        loading = asyncio.get_running_loop().run_in_executor(None, self.models.lease_or_failure, chosen, may_load)
        while not loading.done():
            yield gr.skip(), gr.skip(), gr.skip(), self.waiting(chosen), gr.skip(), *others
            await asyncio.wait([loading], timeout=LOADING_POLL_S)
        lease = loading.result()
        if isinstance(lease, str):
            yield gr.skip(), current, gr.skip(), f"⚠️ {lease} This chat keeps {current}.", gr.skip(), *others
            return
        self._had(lease)
        engine = self.engine_of(chosen)
        system, sampling = self.system_of(chosen), self.sampling_of(chosen)
        updates = [update for tab in self._tabs for update in chat_updates(tab, engine, system, sampling)]
        yield chosen, chosen, model_panel(engine), f"Now answering: **{chosen}**.", hidden, *updates

    def may_load(self, request: gr.Request) -> bool:
        """Whether this page's login may load models (--admins)."""
        return self.admins is None or getattr(request, "username", None) in self.admins

    def waiting(self, model_id: str) -> str:
        """What a load is at: a sentence, with a bar once its process tells how far it has come."""
        said = f"Waiting for the model: {self.models.waiting_sentence(model_id)}…"
        progress = self.models.load_progress(model_id)
        if progress is None or progress.done is None:
            return said
        filled = round(progress.done * BAR_CELLS)
        return f"{said}  \n`{'█' * filled}{'░' * (BAR_CELLS - filled)}` {progress}"


def chat_updates(tab, engine: ChatEngine, system: str, sampling: Sampling) -> list:
    """A chat tab's `model_outputs` for `engine`: the template, system prompt, thinking switch and answer settings
    reset to its defaults, and the message box taking images or not as it sees them."""
    return [
        gr.update(choices=conversation_templates(engine), value=engine.template),
        system,
        gr.update(**message_box_images(engine.sees_images, tab.voice.voice.hears or engine.summary().hears)),
        gr.skip() if tab.single_turn else thinking_update(engine),
        *sampling_values(sampling),
    ]
