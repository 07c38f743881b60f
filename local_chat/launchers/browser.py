"""The browser launchers: `python app.py` (local-chat) and Accessory's demos/*.py, each a set of tabs over one model.

The model loads in the launcher's process; the web server runs in a process of its own (engine/process.py says why).
With --api_base no model loads: the web server runs in the launcher's process, over the engine (engine/remote.py).
"""

from __future__ import annotations

import atexit
import os
import sys

from local_chat.errors import UserError

from .flags import api_keys, api_off_reason, exposure_warnings, fail, logins, parser
from .loading import (
    BATCH_PLACES,
    ENGINE_PLACES,
    check_before_the_server,
    check_serving_flags,
    compile_before_answering,
    load_engine,
    start_batching,
)


def launch(description: str, tabs: tuple[str, ...], with_visual: bool = False, argv=None) -> None:
    """Parse the shared flags, load the model (the demo model by default) and serve the app with `tabs`: the model
    in this process, the web server in a process of its own."""
    args = parser(description).parse_args(argv)  # before torch and transformers load: --help answers at once
    from local_chat.prompting import default_template

    try:
        args = check_before_the_server(args)  # a wrong port or template is told at once
    except UserError as error:
        fail(error)
    server = web_server(args)  # first: its start overlaps all the rest
    try:
        args = check_serving_flags(args)
        check_history(args)  # a database that cannot be used is told now, not after the model loads
        for warning in [*exposure_warnings(args), *filter(None, [api_off_reason(args)])]:
            print(f"warning: {warning}", file=sys.stderr)
        if args.models_dir:
            serve_listed(description, tabs, args, with_visual)
            return
        engine = load_engine(args, with_visual=with_visual)
        template = default_template(engine, args.template)
        if server is None:  # --api_base: no model here, the web server is the only process
            serve_front(engine, description, tabs, template, args.but(concurrency=args.concurrency or ENGINE_PLACES))
            return
        from local_chat.engine.process import serve_in_own_process

        compile_before_answering(engine)  # with the threads it will answer with
        args = start_batching(engine, args)
        code = 0
        try:
            serve_in_own_process(server, engine, description, tabs, template, args)
        except SystemExit as exit:
            code = int(exit.code or 0)
        finally:
            engine.stop_batching()  # its thread would keep the process alive
        exit_now(code)  # the server closed (serve_in_own_process closes it on every way out)
    except UserError as error:
        fail(error)
    finally:
        if server is not None:
            server.close()


def exit_now(code: int) -> None:
    """End the model's process with `code` once its exit handlers ran (the tensor-parallel ranks told), but without
    the interpreter's own finalization: torch's native threads still alive there (OpenMP's workers among them) made
    the C++ runtime abort the exit now and then ("terminate called without an active exception", SIGABRT, in about
    one exit of three on a 2-core machine)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def web_server(args):
    """The web server's process (engine/pipe.py's `WebServer`), started now so that it gets ready while the model
    loads; None with --api_base and --models_dir (no model in this process: the server runs here) and on torchrun's
    other ranks."""
    if args.api_base is not None or args.models_dir or os.environ.get("RANK", "0") != "0":
        return None
    from local_chat.engine.pipe import WebServer

    return WebServer(serve)


def serve_front(engine, description: str, tabs: tuple[str, ...], template: str, args) -> None:
    """--api_base: the page and /v1 over the engine's model; where the engine serves several, over each of them,
    picked by the page's picker and /v1's `model` (engine/choices/served.py)."""
    from local_chat.engine.choices.chosen import ModelEngine
    from local_chat.engine.choices.served import EngineModels
    from local_chat.prompting import default_template

    models = EngineModels(engine, args.concurrency, lambda model: default_template(model, args.template))
    if len(models.ids()) < 2:
        serve(engine, description, tabs, template, args)
        return
    serve(ModelEngine(models, engine.model), description, tabs, template, args.but(served_name=engine.model), models)


def serve_listed(description: str, tabs: tuple[str, ...], args, with_visual: bool) -> None:
    """--models_dir: the web server in this process, each listed model in a process of its own, loaded when asked
    for (engine/choices/folders.py); the one --model names loads now, while the server's code imports."""
    import signal
    import threading

    from local_chat.engine.choices.chosen import ModelEngine
    from local_chat.engine.choices.folders import Models

    from .model_processes import model_max_seq_len, start_model

    paths = {model.id: str(model.path) for model in args.listed}
    adapters = [model for model in args.listed if model.adapter is not None and model.problem is None]
    checkpoints = [model for model in args.listed if model not in adapters]
    lora = {m.id: {a.adapter: str(a.path) for a in adapters if a.base == m.id} for m in checkpoints}  # loaded with it
    models = Models(
        [(model.id, model.problem) for model in checkpoints],
        start=lambda model_id: start_model(args, paths[model_id], model_id, with_visual, lora[model_id]),
        max_loaded=args.max_loaded_models,
        idle_unload_s=None if args.idle_unload is None else args.idle_unload * 60,
        contexts={model.id: model.context(model_max_seq_len(args, model.id)) for model in checkpoints},
        adapters={adapter.id: (adapter.base, adapter.adapter) for adapter in adapters},
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # ended: its models' processes end too (below)
    try:
        first: list = []
        loading = threading.Thread(target=lambda: first.append(models.lease_or_failure(args.served_name)))
        loading.start()
        import local_chat.api  # noqa: F401  (while the model loads)
        import local_chat.ui  # noqa: F401

        loading.join()
        if isinstance(first[0], str):
            raise UserError(first[0])
        first[0].release()
        page_args = args.but(concurrency=args.concurrency or BATCH_PLACES)  # each model's queue holds it to its own
        serve(ModelEngine(models, args.served_name), description, tabs, first[0].template, page_args, models)
    finally:
        models.close()


def serve(engine, description: str, tabs: tuple[str, ...], template: str, args, models=None) -> None:
    """The web server's process: the page and the /v1 API over `engine` (a `PipeEngine`, or a `RemoteEngine`),
    served until the process ends; both doors' answers wait in one queue, in arrival order (engine/in_order.py).
    With --models_dir, `engine` is the start-up model's of `models` (each with its own queue already)."""
    from local_chat.api import OpenAIAPI
    from local_chat.documents import Shelf
    from local_chat.engine.in_order import InArrivalOrder
    from local_chat.tools import Toolbox
    from local_chat.ui import build_app
    from local_chat.ui.layout import PAGE
    from local_chat.web import WebTools

    queue = engine if models is not None else InArrivalOrder(engine, args.concurrency)
    summary = engine.summary()
    if models is None and (summary.adapters or summary.adapter_problems):  # --lora's adapters, as models
        from local_chat.engine.choices.chosen import ModelEngine
        from local_chat.engine.choices.lora import AdapterChoices

        models = AdapterChoices(queue, template)
        queue = ModelEngine(models, models.base)
    store = open_history(args)
    admins = args.admins
    retrieval = retrieval_models(args)
    web = web_research(args, reranker=retrieval[1])
    voice = voice_of_flags(args)
    tools = Toolbox.of(tool_servers(args), WebTools(web) if web is not None else None)
    app = build_app(
        queue, tabs, template, args.image_transform, description, args.max_upload_mb, store.store, admins=admins,
        tool_servers=tools, max_tool_rounds=args.max_tool_rounds, retrieval=retrieval, web=web, voice=voice,
    )  # fmt: skip
    app.queue(default_concurrency_limit=args.concurrency)
    poll_less(app)
    keys = api_keys(args.api_key) if args.api_key else None
    api = None
    if not api_off_reason(args):  # named as --models_dir found it (loading.py's choose_listed_model)
        name = args.served_name
        api = OpenAIAPI(queue, template, args.image_transform, args.max_upload_mb, keys, name, models, not admins)
        api.shelf = Shelf(":memory:", *retrieval)  # its file parts' documents, searched as the page's are
        api.web = web  # web_search_options
        api.voice = voice  # /v1/audio
    routes = [*(api.routes() if api is not None else []), *([store.route()] if store.on else [])]
    if store.on:
        print(f"Conversations are kept in {store.store.path}.", file=sys.stderr, flush=True)
    try:
        app.launch(
            app_kwargs={"routes": routes},
            server_name=args.host,
            server_port=args.port,
            share=args.share,
            **PAGE,
            auth=logins(args.auth) if args.auth else None,
            max_file_size=int(args.max_upload_mb * 1e6),
            quiet=True,  # Gradio would suggest its own `share=True` where the app's flag is --share
            prevent_thread_lock=True,
        )
        print(f"* Running on {app.local_url}", file=sys.stderr, flush=True)
        print(f"* Public link: {app.share_url}" if args.share else "* --share makes a public link.", file=sys.stderr,
              flush=True)  # fmt: skip
        app.block_thread()
    finally:  # ended by the launcher (SystemExit): stop the server's threads, so that the process can exit
        app.close()
        store.close()
        if tools is not None:
            tools.close()


# Gradio's queue looks for new events every 1 ms and for progress every 10 ms, idle or not: some 900 wake-ups a
# second of the web server's process, each taking a core from a model that decodes on the CPU's every core (a Llama of
# Qwen2.5-0.5B's shape, 2-core Xeon, /v1: 16.6 tokens/s polled so, 17.6 every 20 ms). A click's event starts at most
# 20 ms later; progress bars (none of the chat's) update every 100 ms.
QUEUE_POLL_S, PROGRESS_POLL_S = 0.02, 0.1


def poll_less(app) -> None:
    """Gradio's queue, once `app.queue()` made it, polling every `QUEUE_POLL_S` and `PROGRESS_POLL_S`."""
    events = getattr(app, "_queue", None)
    if events is not None and hasattr(events, "sleep_when_free"):
        events.sleep_when_free, events.progress_update_sleep_when_free = QUEUE_POLL_S, PROGRESS_POLL_S


def retrieval_models(args) -> tuple:
    """--embedding_model's and --reranker's models (documents/vectors.py), loaded now; None for each not given."""
    from local_chat.documents.vectors import Embedder, Reranker

    embedder = Embedder(args.embedding_model) if args.embedding_model else None
    reranker = Reranker(args.reranker) if args.reranker else None
    for flag, model in (("embedding model", embedder), ("reranker", reranker)):
        if model is not None:
            print(f"Documents: the {flag} {model.name} helps find passages.", file=sys.stderr, flush=True)
    return embedder, reranker


def web_research(args, reranker=None):
    """--web_search's provider with the pages' limits (web/context.py's `WebResearch`), told in the terminal; None
    with `off`."""
    from local_chat.web import FetchLimits, WebResearch, parse_provider

    provider = parse_provider(args.web_search)
    if provider is None:
        return None
    private = " (private addresses allowed: --web_allow_private)" if args.web_allow_private else ""
    print(f"Web search: {provider}{private}.", file=sys.stderr, flush=True)
    return WebResearch(provider, FetchLimits(allow_private=args.web_allow_private), reranker=reranker)


def voice_of_flags(args):
    """--stt_model's and --tts_model's `Voice` (voice/), loaded now and told in the terminal."""
    from local_chat.voice import voice_of

    voice = voice_of(args.stt_model, args.tts_model)
    if voice.hears:
        print(f"Speech in: {voice.transcriber.name} (the message box's microphone).", file=sys.stderr, flush=True)
    said = voice.note or (f"Speech out: {voice.speaker.name}." if voice.speaks else "Speech out: off.")
    print(said, file=sys.stderr, flush=True)
    return voice


def tool_servers(args):
    """--mcp_config's servers, opened now (tools/servers.py), each told in the terminal; None without the flag."""
    if args.mcp_config is None:
        return None
    from local_chat.tools import ToolServers, read_config

    servers = ToolServers(read_config(args.mcp_config), args.tool_timeout)
    by_server: dict[str, list[str]] = {}
    for tool in servers.tools:
        by_server.setdefault(tool.server, []).append(tool.called)
    for name, called in by_server.items():
        print(f"Tools of {name}: {', '.join(called)}.", file=sys.stderr, flush=True)
    for sentence in servers.problems.values():
        print(f"warning: {sentence}", file=sys.stderr, flush=True)
    return servers


def open_history(args):
    """The saved conversations (ui/history.py's `SavedChats`) the flags ask for: --history_db (default: in the
    user's data folder), or none with --no_history."""
    from local_chat.ui.history import SavedChats

    return SavedChats(history_store(args), args.max_upload_mb)


def check_history(args) -> None:
    """Open and close the database the flags name: one that cannot be used is a `UserError` (without Gradio, which
    only the web server's process imports)."""
    store = history_store(args)
    if store is not None:
        store.close()


def history_store(args):
    """The `Store` of --history_db (default: in the user's data folder), or None with --no_history."""
    from local_chat.history import Store, default_db_path

    return None if args.no_history else Store(args.history_db or default_db_path())


def app(argv=None) -> None:
    """`local-chat`, `python app.py`: the Chat tab (images where the model sees them) and the Single-turn tab."""
    launch("Chat with a local model", ("chat", "single"), argv=argv)


def multi_turn(argv=None) -> None:
    launch("Multi-turn chat", ("chat",), argv=argv)


def multi_turn_mm(argv=None) -> None:
    launch("Multi-turn chat about images", ("chat",), with_visual=True, argv=argv)


def single_turn(argv=None) -> None:
    launch("Single-turn instructions", ("single",), argv=argv)


def single_turn_mm(argv=None) -> None:
    launch("Single-turn questions about an image", ("chat_single",), with_visual=True, argv=argv)
