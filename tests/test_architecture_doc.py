"""docs/architecture.md names only modules that exist: a part that moves is moved there too."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_path_the_architecture_names_exists():
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = set(re.findall(r"\b[\w/]+(?:\.py|\.md|/)(?=[`\s<\"),])", text))
    assert len(paths) > 20, paths
    missing = sorted(p for p in paths if not (ROOT / p).exists() and not (ROOT / "local_chat" / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"
