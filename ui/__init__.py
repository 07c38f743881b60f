"""The front ends' shared parts: flags and model loading (flags.py), the Gradio app (blocks.py, imported only
when a browser launcher needs it, so the command-line tools start without Gradio)."""
from .flags import DEMO_MODEL, add_model_flags, check_serving_flags, fail, load_model, parser

__all__ = ["build_app", "launch", "parser", "add_model_flags", "load_model", "check_serving_flags", "fail",
           "DEMO_MODEL"]


def build_app(*args, **kwargs):
    from .blocks import build_app as build

    return build(*args, **kwargs)


def launch(description: str, tabs: tuple[str, ...], with_visual: bool = False, argv=None) -> None:
    """Parse the shared flags, load the model (the demo model by default) and serve the app with `tabs`."""
    from model import UserError

    from .blocks import CSS

    args = parser(description).parse_args(argv)
    try:
        check_serving_flags(args)
        model = load_model(args, with_visual=with_visual)
        app = build_app(model, tabs, args.template, args.image_transform, title=description)
    except (UserError, ValueError) as error:
        fail(error)
    auth = tuple(args.auth.split(":", 1)) if args.auth else None
    app.queue(default_concurrency_limit=args.concurrency)
    app.launch(server_name=args.host, server_port=args.port, share=args.share, auth=auth, css=CSS)
