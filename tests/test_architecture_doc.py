"""docs/architecture.md names only modules that exist: a part that moves is moved there too (its layout's tree
too, each name in the folder its line stands under)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = r"(?<![\w/.])\.?[\w/.]*\w(?:\.py|\.md|\.txt|/)(?=[`\s<\"),:])"


def layout_and_prose(text: str) -> tuple[str, str]:
    """(the Layout section's tree, the rest of the page)."""
    before, _, after = text.partition("## Layout")
    tree = re.search(r"```\n(.*?)\n```", after, flags=re.S)
    return (tree.group(1) if tree else ""), before + (after[tree.end() :] if tree else after)


def missing_in_tree(tree: str) -> list[str]:
    """The names of the layout's tree that are not in the folder their line stands under (the folder an unindented
    line names first, or local_chat/'s folder a line indented by two names), nor at the top."""
    missing, folder = [], ROOT
    for line in tree.splitlines():
        if (top := re.match(r"^\.?\w+/", line)) is not None:
            folder = ROOT / top.group(0)
        elif re.match(r"^\S", line):
            folder = ROOT
        elif (entry := re.match(r"^  (\w+/)", line)) is not None:
            folder = ROOT / "local_chat" / entry.group(1)
        for name in re.findall(NAMED, line + " "):
            if not any((base / name).exists() for base in (folder, ROOT, ROOT / "local_chat")):
                missing.append(f"{folder.relative_to(ROOT)}/{name}")
    return missing


def test_every_path_the_architecture_names_exists():
    tree, prose = layout_and_prose((ROOT / "docs" / "architecture.md").read_text())
    paths = set(re.findall(r"\b[\w/]+(?:\.py|\.md|/)(?=[`\s<\"),])", prose))
    assert len(paths) > 20, paths
    missing = sorted(p for p in paths if not (ROOT / p).exists() and not (ROOT / "local_chat" / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"
    assert tree.count("\n") > 30, "docs/architecture.md's Layout holds no tree"
    assert missing_in_tree(tree) == [], "docs/architecture.md's Layout names files its folders do not hold"


def test_the_layout_check_finds_a_file_in_the_wrong_folder():
    tree = "local_chat/     the package\n  ui/           blocks.py (the app), generation.py (not the page's)\n"
    assert missing_in_tree(tree) == ["local_chat/ui/generation.py"]
