"""The Gradio app: the Chat and Single-turn tabs over one engine (ui/chat_tab.py, ui/single_turn.py), with the
/chat and /single_turn API beside them (ui/gradio_api.py) and the saved conversations' sidebar (ui/conversations.py;
built before the tabs, wired after the chat it serves). Gradio does not limit how many answers run at once: the
engine it is given (engine/in_order.py) serves the page's and the /v1 API's requests in arrival order.
"""

from __future__ import annotations

import gradio as gr

from local_chat.defaults import IMAGE_TRANSFORM, MAX_TOOL_ROUNDS, MAX_UPLOAD_MB
from local_chat.engine import Engine
from local_chat.engine.choices.chosen import ModelEngine
from local_chat.history import Store
from local_chat.prompting import default_template

from .chat import Cancels
from .chat_tab import ChatTab
from .gradio_api import api_chat, api_single_turn
from .history import SavedChats
from .layout import model_panel
from .model_picker import ModelPicker
from .single_turn import SingleTurnTab
from .wiring import GENERATION

FORMER_TABS = {"vision": "chat", "vision_single": "chat_single"}  # the Vision chat became the chat's attachments


def build_app(
    engine: Engine,
    tabs: tuple[str, ...] = ("chat", "single"),
    template: str | None = None,
    image_transform: str = IMAGE_TRANSFORM,
    title: str = "Chat",
    max_upload_mb: float = MAX_UPLOAD_MB,
    store: Store | None = None,
    admins: list[str] | None = None,
    tool_servers=None,
    max_tool_rounds: int = MAX_TOOL_ROUNDS,
    retrieval: tuple = (None, None),
    web=None,
    voice=None,
) -> gr.Blocks:
    """The app over `model`: the chat ("chat"; images where the model sees them, kept in `store`'s saved
    conversations when one is given), single questions about an image ("chat_single"), and the Single-turn tab
    ("single"). `max_upload_mb` caps the images this app reads (also pass it to `launch(max_file_size=...)`, which
    caps what Gradio receives). Serve `SavedChats(store).route()` beside it: the saved images' route. With a model
    picker (--models_dir), `admins`: the only logins that load models (None: everyone). `tool_servers`: the tools the
    model may call on the chat (tools/servers.py's `ToolServers`, --mcp_config), at most `max_tool_rounds` rounds a
    question. `retrieval`: the documents' embedding model and reranker (documents/vectors.py), where given. `web`:
    the web search of the chat's Search the web switch (web/context.py's `WebResearch`, --web_search), or None.
    `voice`: the chat's microphone and speech (voice/'s `Voice`, --stt_model and --tts_model), or None."""
    template = default_template(engine, template)
    cancels = Cancels()
    saved = SavedChats(store, max_upload_mb, retrieval)
    tabs = tuple(dict.fromkeys(FORMER_TABS.get(tab, tab) for tab in tabs))
    # --models_dir: a picker, each session with its own model (the chat tabs follow it)
    picker = (
        ModelPicker(engine.models, engine.model_id, max_upload_mb, admins) if isinstance(engine, ModelEngine) else None
    )
    labels = {"chat": "Chat", "chat_single": "Image questions", "single": "Single-turn"}
    with gr.Blocks(title=title) as app:
        browser_id = saved.browser_state() if saved.on else gr.State(None)
        chat_tabs = {
            tab: ChatTab(
                engine,
                cancels,
                template,
                image_transform,
                saved,
                tab == "chat_single",
                max_upload_mb,
                picker,
                tool_servers,
                max_tool_rounds,
                web,
                voice,
            )  # fmt: skip
            for tab in tabs
            if tab.startswith("chat")
        }
        saving = next((chat for chat in chat_tabs.values() if chat.saving), None)  # the chat with the sidebar
        if saving is not None:
            saving.sidebar.build()
        if picker is not None:
            picker.build(model_panel(engine))
        else:
            gr.HTML(model_panel(engine), elem_classes="model-line")
        with gr.Tabs():
            for tab in tabs:
                with gr.Tab(labels[tab], id=tab):
                    session_model = picker.current if picker is not None else None
                    if tab == "single":
                        SingleTurnTab(engine, cancels, picker).build(session_model)
                    else:
                        chat_tabs[tab].build(browser_id, session_model)
        if saving is not None:
            saving.sidebar.wire(app, saving)
        if picker is not None:
            picker.wire(list(chat_tabs.values()))
        gr.api(
            api_chat(engine, cancels, template, image_transform, max_upload_mb),
            api_name="chat",
            **GENERATION,
        )
        if "single" in tabs:
            gr.api(api_single_turn(engine, cancels), api_name="single_turn", **GENERATION)

        def tab_closed(request: gr.Request):
            cancels.cancel_session(request.session_hash)
            engine.drop_sessions(request.session_hash)
            saved.forget(request.session_hash)

        app.unload(tab_closed)
    return app
