"""The Gradio page: its tabs (blocks.py), the chat's handlers (chat_tab.py), the /chat and /single_turn API
(gradio_api.py), the saved conversations (history.py), the typed messages (turns.py), and what the page does with an
engine's events (chat.py). The launchers (launchers/) start it, beside the /v1 API (api/), over one engine
(engine/)."""


def build_app(*args, **kwargs):
    """The app's Blocks (ui.blocks.build_app), Gradio imported only when it is called."""
    from .blocks import build_app as build

    return build(*args, **kwargs)
