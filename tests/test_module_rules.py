"""The rule for modules (DESIGN.md, docs/architecture.md): one role each, said in its docstring; no mixins (a class
reading state that only the classes mixed with it make), no class spread over files; size is a warning past
`LONG_MODULE` lines, not a gate."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "local_chat"
LONG_MODULE = 600
SELF_READS_ALLOWED = {"__class__", "__dict__"}  # Python's own


def modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*.py"))}


def classes(trees: dict[Path, ast.Module]) -> dict[str, list[tuple[Path, ast.ClassDef]]]:
    """The package's classes by name (a name may stand in several modules)."""
    found: dict[str, list] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append((path, node))
    return found


def base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
        elif isinstance(base, ast.Subscript) and isinstance(base.value, ast.Name):
            names.append(base.value.id)
    return names


def own_names(node: ast.ClassDef) -> set[str]:
    """What a class defines itself: its methods, class attributes and annotations, and what its methods assign to
    `self`."""
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names |= {target.id for target in item.targets if isinstance(target, ast.Name)}
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and is_self(sub.value):
            names.add(sub.attr)
        elif isinstance(sub, ast.Call) and getattr(sub.func, "id", None) == "setattr" and sub.args:
            if is_self(sub.args[0]) and isinstance(sub.args[1], ast.Constant):
                names.add(sub.args[1].value)
    return names


def is_self(node) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def self_reads(node: ast.ClassDef) -> set[str]:
    """The attributes of `self` a class's own methods read (not those of classes defined inside it)."""
    reads = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(item):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load) and is_self(sub.value):
                    reads.add(sub.attr)
    return reads


def mixins(trees: dict[Path, ast.Module]) -> list[str]:
    """Each class of the package whose methods read attributes of `self` that neither it nor its bases define (its
    bases all the package's own, so that what they define is known): state some other class must bring."""
    found = classes(trees)
    problems = []
    for name, definitions in found.items():
        for path, node in definitions:
            defined, pending, known = set(), [node], True
            while pending:
                current = pending.pop()
                defined |= own_names(current)
                for base in base_names(current):
                    if base == "object":
                        continue
                    if base not in found or len(found[base]) != 1:
                        known = False  # a library's class (or an ambiguous name): what it defines is not read here
                        continue
                    pending.append(found[base][0][1])
            missing = self_reads(node) - defined - SELF_READS_ALLOWED
            if known and missing:
                problems.append(f"{path.relative_to(PACKAGE.parent)}: {name} reads {sorted(missing)}")
    return problems


def test_no_class_reads_state_another_class_brings():
    """No mixins: a class's methods read only what it (or a base it names) makes, so a class is read in one place."""
    assert mixins(modules()) == []


def test_the_mixin_check_finds_a_mixin():
    """The check itself: a class reading what only the class mixed with it makes is found; a complete base is not."""
    source = """
class Sidebar:
    def listed(self):
        return self.store.titles()
class Page(Sidebar):
    def __init__(self, store):
        self.store = store
class Base:
    def __init__(self):
        self.size = 1
    def grow(self):
        self.size += 1
class Grown(Base):
    def show(self):
        return self.size
"""
    problems = mixins({PACKAGE / "example.py": ast.parse(source)})
    assert problems == ["local_chat/example.py: Sidebar reads ['store']"]


def test_each_module_says_its_role():
    """One role each: every module opens with a docstring that says what it is for; one past `LONG_MODULE` lines is a
    warning (is it still one role?), not a failure."""
    trees = modules()
    missing = [str(path.relative_to(PACKAGE.parent)) for path, tree in trees.items() if not ast.get_docstring(tree)]
    assert missing == []
    for path in trees:
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > LONG_MODULE:
            warnings.warn(f"{path.relative_to(PACKAGE.parent)}: {lines} lines, past {LONG_MODULE}", stacklevel=1)
