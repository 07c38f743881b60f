"""The Gradio app: its tabs (blocks.py), the chat's prompts, Stop and streaming (chat.py), and the web server's own
process with its stand-in for the model (processes.py). The launchers (launchers/) start it."""


def build_app(*args, **kwargs):
    """The app's Blocks (ui.blocks.build_app), Gradio imported only when it is called."""
    from .blocks import build_app as build

    return build(*args, **kwargs)
