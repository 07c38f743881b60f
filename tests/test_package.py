"""The package's joints: one installed package (and Accessory's three faces), imports in the order
docs/architecture.md lists, a front of another engine that starts without torch, dependencies pinned."""

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bench.front import started_front, stub_engine

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "local_chat"
FACES = ("model", "templates", "conversation")
CHECKOUT_ONLY = ("bench", "demo_model", "fixtures", "tests")


def documented_layers() -> list[list[str]]:
    """The modules of each layer, top first, from the import-order table of docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Import order", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| [^|]+ \| (.+) \|$", section, flags=re.M)
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1)), rows
    return [re.findall(r"`([^`]+)`", modules) for _, modules in rows]


def layer_of(path: str, layers: list[list[str]]) -> int:
    """The layer of a file under local_chat/: the one whose entry names it most closely (a file, else a folder)."""
    matches = [
        (len(entry), number)
        for number, entries in enumerate(layers)
        for entry in entries
        if path == entry or (entry.endswith("/") and path.startswith(entry))
    ]
    assert matches, f"local_chat/{path} is in no layer of docs/architecture.md's import order"
    return max(matches)[1]


def imported_modules(file: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of everything `file` imports, in functions too, relative imports made absolute; for
    `from a import b`, both `a` and `a.b` (b may be a module)."""
    package = file.relative_to(ROOT).parent.parts
    found = []
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            found += [(node.lineno, base), *((node.lineno, f"{base}.{alias.name}") for alias in node.names)]
    return found


def module_path(name: str) -> str | None:
    """local_chat's file of a dotted name, relative to local_chat/ (None: not a module of the package)."""
    path = ROOT.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file() and PACKAGE in candidate.parents:
            return candidate.relative_to(PACKAGE).as_posix()
    return None


def test_every_import_of_the_package_goes_down_the_layers():
    layers = documented_layers()
    upward, outward = [], []
    for file in sorted(PACKAGE.rglob("*.py")):
        here = file.relative_to(PACKAGE).as_posix()
        for line, name in imported_modules(file):
            if name.split(".")[0] in (*FACES, *CHECKOUT_ONLY):
                outward.append(f"local_chat/{here}:{line} imports {name}")
            target = module_path(name)
            if target is not None and layer_of(target, layers) < layer_of(here, layers):
                upward.append(f"local_chat/{here}:{line} (layer {layer_of(here, layers) + 1}) imports {name} "
                              f"(layer {layer_of(target, layers) + 1})")  # fmt: skip
    assert not upward, "imports against docs/architecture.md's order:\n" + "\n".join(upward)
    assert not outward, "the package imports Accessory's faces or the checkout's code:\n" + "\n".join(outward)


def test_the_order_test_finds_an_upward_import():
    layers = documented_layers()
    assert layer_of(module_path("local_chat.launchers.flags"), layers) == 0
    assert layer_of(module_path("local_chat.engine.interface"), layers) == len(layers) - 1
    assert layer_of("model/meta.py", layers) < layer_of("model/generation.py", layers)  # a file beats its folder
    assert "local_chat.engine.interface" in {name for _, name in imported_modules(PACKAGE / "model" / "meta.py")}


def test_the_faces_are_thin():
    """Accessory's import paths hold only imports from the package (and their docstring)."""
    for face in FACES:
        body = ast.parse((ROOT / face / "__init__.py").read_text()).body
        kinds = {type(node).__name__ for node in body[1:]}
        assert kinds <= {"ImportFrom", "Assign"}, (face, kinds)
        assert all(node.module.startswith("local_chat.") for node in body if isinstance(node, ast.ImportFrom))


def test_the_front_of_another_engine_starts_without_torch_or_transformers():
    """`python app.py --api_base URL` loads no model: `-X importtime` lists every module it imported up to serving
    its page, and neither torch nor transformers is among them."""
    with stub_engine() as url, started_front(url, python=(sys.executable, "-X", "importtime")) as (_, output):
        pass
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in output.read_text().splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "gradio" in imported and "local_chat" in imported  # the listing is complete enough to mean something
    assert not imported & {"torch", "transformers"}


def pinned() -> dict[str, str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    pins = dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))
    return {canonicalize_name(name): version for name, version in pins.items()}


def test_requirements_pin_every_dependency_of_pyproject():
    """Every requirement of the project's metadata (pyproject.toml's dependencies and extras, as installed)."""
    declared = importlib.metadata.requires("local-chat")
    pins = pinned()
    for requirement in map(Requirement, declared):
        name = canonicalize_name(requirement.name)
        if name in ("torch", "local-chat"):  # torch is installed first (its CPU or CUDA build); the project itself
            assert name not in pins
            continue
        assert name in pins, f"requirements.txt does not pin {name}: run bash .ci/freeze"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside {requirement.specifier}"


def test_a_non_editable_install_has_the_package_the_faces_and_the_commands(tmp_path):
    """`pip install .` (into a folder, beside this environment's dependencies): the package and Accessory's three
    faces are its only top-level names, the console scripts run, and the faces import."""
    source, target = tmp_path / "source", tmp_path / "site"  # built from a copy: the build leaves files beside it
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "tests", "assets", "build", "*.egg-info"))
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target"]  # setuptools as pyproject asks
    subprocess.run([*install, str(target), str(source)], check=True, capture_output=True, timeout=300)
    top = {
        p.name for p in target.iterdir() if not p.name.endswith(".dist-info") and p.name not in ("bin", "__pycache__")
    }
    assert top == {"local_chat", *FACES}
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    python = [sys.executable, "-c", "import sys; sys.path.pop(0); exec(sys.argv[1])"]  # not the working directory
    where = subprocess.run(
        [*python, "import local_chat, model; from model import MetaModel; from templates import format_prompt; "
         "from conversation import default_conversation; print(local_chat.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(target)
    for script in ("local-chat", "local-chat-generate"):
        shown = subprocess.run([target / "bin" / script, "--help"], env=env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and shown.stdout.startswith(f"usage: {script}"), shown.stderr
    demo = subprocess.run(
        [*python, "from local_chat.defaults import DEMO_MODEL; print(DEMO_MODEL)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert demo.stdout.strip() == str(ROOT / "assets" / "demo-model")  # run from the checkout, it finds the demo model


def test_the_commit_message_hook_holds_subjects_to_72_characters(tmp_path):
    hook = ROOT / ".githooks" / "commit-msg"

    def accepted(message: str) -> bool:
        (tmp_path / "message").write_text(message)
        return subprocess.run([hook, tmp_path / "message"], capture_output=True).returncode == 0

    assert accepted("A subject\n\nThe details, in the body.\n") and accepted("é" * 72 + "\n")
    assert not accepted("a" * 73 + "\n") and not accepted("A subject\nand more on the second line\n")
    assert accepted("A subject\n# a comment git strips\n")
