"""--models_dir: each listed model loads in a process of its own (engine/choices/folders.py's `Models` starts and ends
them), which answers its requests as the launcher's process does for one model (engine/process.py's `serve_model`)."""

from __future__ import annotations

import contextlib
import signal
import sys
import traceback

from local_chat.errors import UserError, described

from .settings import LaunchSettings


def model_entry_and_flags(args: LaunchSettings, model_id: str) -> tuple[dict, LaunchSettings]:
    """A listed model's --models_config entry, and its flags: the entry's settings over the command line's."""
    from .models_config import model_flags

    entry = (args.model_settings or {}).get(model_id, {})
    return entry, model_flags(args, entry, model_id)


def model_max_seq_len(args: LaunchSettings, model_id: str) -> int | None:
    """The --max_seq_len a listed model loads with (its --models_config's, else the command line's)."""
    return model_entry_and_flags(args, model_id)[1].max_seq_len


def start_model(args: LaunchSettings, path: str, model_id: str, with_visual: bool = False, lora=None):
    """The `ModelProcess` (engine/choices/folders.py) that loads the checkpoint at `path` with the flags `args`
    (`with_visual`: refuse a model that sees no images, for the image demos), and the LoRA adapters `lora`
    ({name: folder})."""
    import multiprocessing

    from local_chat.engine.choices.folders import ModelProcess

    entry, flags = model_entry_and_flags(args, model_id)
    adapters = tuple(f"{name}={folder}" for name, folder in (lora or {}).items()) or flags.lora
    flags = flags.but(pretrained_path=(path,), models_dir=None, listed=(), model_settings={}, model_entry=entry,
                      lora=adapters)  # fmt: skip
    context = multiprocessing.get_context("spawn")
    connection, there = context.Pipe()
    process = context.Process(target=model_main, args=(there, flags, model_id, with_visual), name=f"model {model_id}")
    process.start()
    there.close()
    return ModelProcess(process, connection)


def model_main(connection, args: LaunchSettings, model_id: str, with_visual: bool) -> None:
    """A model's process: load it, send its facts (or why it could not load), then answer until the pipe closes."""
    from local_chat.engine.pipe import ModelFailed

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the launcher, which ends this process
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unloaded: an exit that ends its workers too
    print(f"Loading {model_id}...", file=sys.stderr, flush=True)
    try:
        with _progress_told(connection):
            engine, args = _loaded(args, with_visual, connection)
        facts = _facts(engine, args, model_id)
    except Exception as error:  # a checkpoint that passed the listing's checks and still fails: one sentence
        if not isinstance(error, UserError):
            traceback.print_exception(error)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # ended while it exits: quietly, no SystemExit in its atexit
        connection.send(ModelFailed(str(error) if isinstance(error, UserError) else described(error)))
        return
    from local_chat.engine.process import serve_model

    print(f"Loaded {model_id}.", file=sys.stderr, flush=True)
    try:
        connection.send(facts)
        serve_model(engine, connection)  # until the launcher unloads it (or ends)
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        engine.stop_batching()


def _loaded(args: LaunchSettings, with_visual: bool, connection) -> tuple:
    """(the model's engine, batching; the settings with --concurrency settled)."""
    from local_chat.engine.pipe import LoadProgress

    from .loading import compile_before_answering, load_engine, start_batching

    engine = load_engine(args, with_visual)
    if engine.compiled is not None:
        connection.send(LoadProgress("compiling"))
    compile_before_answering(engine)
    connection.send(LoadProgress("preparing to answer"))  # the batch's paged cache: seconds for a large one
    return engine, start_batching(engine, args)


@contextlib.contextmanager
def _progress_told(connection, every: float = 0.05):
    """While loading: transformers' "Loading weights" bar told to the launcher as `LoadProgress("weights", done)`, at
    each `every` of it (a hook on transformers' progress bars; the bar itself still shows in the terminal)."""
    from transformers.utils import logging as hf_logging

    from local_chat.engine.pipe import LoadProgress

    def told(bar, total: int):
        said = -1.0
        for done, item in enumerate(bar, 1):
            if done == total or done / total - said >= every:
                said = done / total
                connection.send(LoadProgress("weights", said))
            yield item

    def hook(factory, args, kwargs):
        bar = factory(*args, **kwargs)
        total = len(args[0]) if args and hasattr(args[0], "__len__") else kwargs.get("total")
        return told(bar, total) if kwargs.get("desc") == "Loading weights" and total else bar

    set_hook = getattr(hf_logging, "set_tqdm_hook", None)  # transformers 5.x; without it, the seconds alone are told
    previous = set_hook(hook) if set_hook is not None else None
    try:
        yield
    finally:
        if set_hook is not None:
            set_hook(previous)


def _facts(engine, args: LaunchSettings, model_id: str) -> dict:
    """What the web server gets to know of the loaded model: `model_facts`, with its template (--template or its
    entry's, else its own), its answers' defaults (the API's, and the page's) and system prompt as its
    --models_config entry sets them, and its --concurrency as its batching settled it."""
    from local_chat.engine.interface import CHAT_SAMPLING
    from local_chat.engine.process import model_facts
    from local_chat.prompting import default_template

    from .models_config import sampling_of

    facts = model_facts(engine)
    entry = args.model_entry
    facts["generation_defaults"] = sampling_of(facts["generation_defaults"], entry, model_id)
    return {**facts, "template": default_template(engine, args.template), "system": entry.get("system"),
            "chat_sampling": sampling_of(CHAT_SAMPLING, entry, model_id), "places": args.concurrency}  # fmt: skip
