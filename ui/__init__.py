"""The front ends' shared parts: flags and model loading (flags.py), the Gradio app (blocks.py, imported only
when a browser launcher needs it, so the command-line tools start without Gradio)."""
import sys

from .flags import DEMO_MODEL, add_model_flags, check_serving_flags, exposure_warnings, fail, load_model, logins, parser

__all__ = ["build_app", "launch", "parser", "add_model_flags", "load_model", "check_serving_flags", "fail",
           "DEMO_MODEL"]


def build_app(*args, **kwargs):
    from .blocks import build_app as build

    return build(*args, **kwargs)


def launch(description: str, tabs: tuple[str, ...], with_visual: bool = False, argv=None) -> None:
    """Parse the shared flags, load the model (the demo model by default) and serve the app with `tabs`."""
    from model import UserError

    from .blocks import PAGE

    args = parser(description).parse_args(argv)
    try:
        check_serving_flags(args)
        model = load_model(args, with_visual=with_visual)
        app = build_app(model, tabs, args.template, args.image_transform, title=description,
                        max_upload_mb=args.max_upload_mb)
    except (UserError, ValueError) as error:
        fail(error)
    for warning in exposure_warnings(args):
        print(f"warning: {warning}", file=sys.stderr)
    app.queue(default_concurrency_limit=args.concurrency)
    app.launch(server_name=args.host, server_port=args.port, share=args.share, **PAGE,
               auth=logins(args.auth) if args.auth else None, max_file_size=int(args.max_upload_mb * 1e6))
