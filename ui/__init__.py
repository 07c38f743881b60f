"""The front ends' shared parts: flags and model loading (flags.py), the Gradio app (blocks.py, imported only
when a browser launcher needs it, so the command-line tools start without Gradio)."""
import sys

from user_error import UserError

from .flags import (DEMO_MODEL, add_model_flags, check_serving_flags, compile_before_answering, exposure_warnings, fail,
                    load_model, logins, parser)

__all__ = ["build_app", "launch", "parser", "add_model_flags", "load_model", "check_serving_flags", "fail",
           "DEMO_MODEL"]


def build_app(*args, **kwargs):
    from .blocks import build_app as build

    return build(*args, **kwargs)


def launch(description: str, tabs: tuple[str, ...], with_visual: bool = False, argv=None) -> None:
    """Parse the shared flags, load the model (the demo model by default) and serve the app with `tabs`: the model
    in this process, the web server in a process of its own (ui/processes.py says why)."""
    args = parser(description).parse_args(argv)  # before torch and transformers load: --help answers at once
    from .chat import default_template
    from .processes import leave_a_core_to_the_server, serve_in_own_process

    try:
        check_serving_flags(args)
        model = load_model(args, with_visual=with_visual)
        template = default_template(model, args.template)
    except UserError as error:
        fail(error)
    for warning in exposure_warnings(args):
        print(f"warning: {warning}", file=sys.stderr)
    leave_a_core_to_the_server(model)
    compile_before_answering(model)  # with the threads it will answer with
    serve_in_own_process(model, serve, description, tabs, template, args)


def serve(model, description: str, tabs: tuple[str, ...], template: str, args) -> None:
    """The web server's process: the app over `model` (a `RemoteModel`), served until the process ends."""
    from .blocks import PAGE

    app = build_app(model, tabs, template, args.image_transform, title=description, max_upload_mb=args.max_upload_mb)
    app.queue(default_concurrency_limit=args.concurrency)
    try:
        app.launch(server_name=args.host, server_port=args.port, share=args.share, **PAGE,
                   auth=logins(args.auth) if args.auth else None, max_file_size=int(args.max_upload_mb * 1e6))
    finally:  # ended by the launcher (SystemExit): stop the server's threads, so that the process can exit
        app.close()
