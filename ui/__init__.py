"""The browser front end shared by app.py and demos/: flags, model loading, the Gradio app."""
from .blocks import CSS, build_app
from .flags import DEMO_MODEL, check_serving_flags, fail, load_model, parser

__all__ = ["build_app", "launch", "parser", "load_model", "DEMO_MODEL"]


def launch(description: str, tabs: tuple[str, ...], with_visual: bool = False, argv=None) -> None:
    """Parse the shared flags, load the model (the demo model by default) and serve the app with `tabs`."""
    from model import UserError

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
