"""The `fast` marker (`python -m pytest -m fast`): the tests that start no server, no browser and no process.

A test is marked at collection when neither its body, nor the tests' own functions and classes it calls (tests/,
bench/ and fixtures/, theirs too), nor its fixtures name what starts one (`STARTERS`). The reading can miss a way in,
so a test marked fast runs with those ways shut: starting a process or a Gradio server fails it with a sentence saying
where it started and to name the starter here (or to mark the test `@pytest.mark.starts("...")`, which keeps it out
of the fast set). The documents' reader is the one process allowed: one worker for the whole session (`ALLOWED`)."""

from __future__ import annotations

import ast
import inspect
import multiprocessing.process
import re
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import pytest

# what starts a server, a browser or a process, as the tests' code names it
STARTERS = re.compile(
    r"\b(serve|serve_engine|launched|llama_server|app_server|open_page|browser|launch|Popen|subprocess|"
    r"multiprocessing|ProcessPoolExecutor|start_ranks|start_model|torchrun|TORCHRUN)\b"
    r"|compil"  # torch.compile: inductor's compile workers are processes
    r"|launchers\."  # a launcher's main: its web server's process starts first
)
ALLOWED = ("/local_chat/documents/extract.py",)  # where a fast test may start a process (the documents' reader)
TESTS = str(Path(__file__).resolve().parent)
CHECKOUT = Path(__file__).resolve().parent.parent
HELPERS = (TESTS, str(CHECKOUT / "bench"), str(CHECKOUT / "fixtures"))  # where the tests' own code is
_read: dict = {}  # function or class -> whether it (or what it calls of the tests' own) names a starter


def starts_something(code, seen: frozenset = frozenset()) -> bool:
    """Whether the source of `code` (a function or class), or of the tests' own functions and classes it calls,
    names a starter."""
    if code in _read:
        return _read[code]
    try:
        source = textwrap.dedent(inspect.getsource(code))
    except (OSError, TypeError):
        return False
    found = bool(STARTERS.search(source))
    module = sys.modules.get(getattr(code, "__module__", ""), None)
    for name in [] if found else _called(source):
        helper = getattr(module, name, None)
        if (inspect.isfunction(helper) or inspect.isclass(helper)) and _ours(helper) and helper not in seen:
            if starts_something(helper, seen | {code}):
                found = True
                break
    _read[code] = found
    return found


def _called(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}


def _ours(code) -> bool:
    """Whether `code` is the tests' own (not pytest's, not the package's, not this module's)."""
    try:
        return inspect.getsourcefile(inspect.unwrap(code)).startswith(HELPERS) and code.__module__ != __name__
    except TypeError:
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "fast: starts no server, no browser and no process (set at collection)")
    config.addinivalue_line("markers", "starts(what): starts a process where its code does not say so (not fast)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("starts") is not None:
            continue
        fixtures = getattr(item, "_fixtureinfo", None)
        definitions = [d for defs in (fixtures.name2fixturedefs.values() if fixtures else ()) for d in defs]
        code = [getattr(item, "function", None), *(d.func for d in definitions if _ours(d.func))]
        if not any(c is not None and starts_something(c) for c in code):
            item.add_marker(pytest.mark.fast)


def _refused(what: str, original):
    """A stand-in for `original` that fails the test, but where ALLOWED calls it."""

    def refused(*args, **kwargs):
        stack = traceback.extract_stack()[:-1]
        if any(frame.filename.endswith(ALLOWED) for frame in stack):
            return original(*args, **kwargs)
        ours = [f for f in stack if "/local_chat/" in f.filename or f.filename.startswith(HELPERS)]
        where = f" (from {Path(ours[-1].filename).name}:{ours[-1].lineno}, {ours[-1].name})" if ours else ""
        raise AssertionError(
            f"This test is marked fast but starts {what}{where}: name what starts it in tests/fast_marks.py's "
            "STARTERS, or mark the test @pytest.mark.starts('...')."
        )

    return refused


@pytest.fixture(autouse=True)
def _fast_tests_start_nothing(request, monkeypatch):
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    monkeypatch.setattr(subprocess.Popen, "__init__", _refused("a process", subprocess.Popen.__init__))
    start = multiprocessing.process.BaseProcess.start
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refused("a process", start))
    if "gradio" in sys.modules:
        blocks = sys.modules["gradio"].Blocks
        monkeypatch.setattr(blocks, "launch", _refused("a server", blocks.launch))
    yield
