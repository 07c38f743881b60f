"""The browser launchers: `python app.py` (local-chat) and Accessory's demos/*.py, each a set of tabs over one model.

The model loads in the launcher's process; the web server runs in a process of its own (ui/processes.py says why).
"""

from __future__ import annotations

import sys

from user_error import UserError

from .flags import exposure_warnings, fail, logins, parser
from .loading import check_serving_flags, compile_before_answering, load_model


def launch(description: str, tabs: tuple[str, ...], with_visual: bool = False, argv=None) -> None:
    """Parse the shared flags, load the model (the demo model by default) and serve the app with `tabs`: the model
    in this process, the web server in a process of its own."""
    args = parser(description).parse_args(argv)  # before torch and transformers load: --help answers at once
    from ui.chat import default_template
    from ui.processes import leave_a_core_to_the_server, serve_in_own_process

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
    from ui import build_app
    from ui.blocks import PAGE

    app = build_app(model, tabs, template, args.image_transform, title=description, max_upload_mb=args.max_upload_mb)
    app.queue(default_concurrency_limit=args.concurrency)
    try:
        app.launch(
            server_name=args.host,
            server_port=args.port,
            share=args.share,
            **PAGE,
            auth=logins(args.auth) if args.auth else None,
            max_file_size=int(args.max_upload_mb * 1e6),
        )
    finally:  # ended by the launcher (SystemExit): stop the server's threads, so that the process can exit
        app.close()


def app(argv=None) -> None:
    """`local-chat`, `python app.py`: every tab (Chat, Vision chat where the model sees images, Single-turn)."""
    launch("Chat with a local model", ("chat", "vision", "single"), argv=argv)


def multi_turn(argv=None) -> None:
    launch("Multi-turn chat", ("chat",), argv=argv)


def multi_turn_mm(argv=None) -> None:
    launch("Multi-turn chat about an image", ("vision",), with_visual=True, argv=argv)


def single_turn(argv=None) -> None:
    launch("Single-turn instructions", ("single",), argv=argv)


def single_turn_mm(argv=None) -> None:
    launch("Single-turn questions about an image", ("vision_single",), with_visual=True, argv=argv)
