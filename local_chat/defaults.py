"""Limits and defaults that more than one layer reads: the bottom of the import order (docs/architecture.md), so
every layer may import it. Imports nothing of the project."""

from __future__ import annotations

from pathlib import Path

MAX_TOOL_ROUNDS = 8  # --max_tool_rounds: rounds of tool calls the page runs for one question
TOOL_TIMEOUT_S = 60.0  # --tool_timeout: how long a tool the page runs may take
WEB_SEARCH = "ddgs"  # --web_search: the provider of the page's switch and the web tools (web/search.py)
MAX_UPLOAD_MB = 20  # the default of --max_upload_mb: an image, or a conversation file to import
# auto: the model's processor fits the image (or the transform its config records); the others are model.image's
IMAGE_TRANSFORMS = ("auto", "padded_resize", "resized_center_crop")  # ("auto", *model.image.TRANSFORMS): a test checks
IMAGE_TRANSFORM = "auto"  # --image_transform's default, and the page's
DEFAULT_CONTEXT = 4096  # --max_seq_len's default for a local model, and `MetaModel.from_pretrained`'s
EXIT_AFTER_FAILURE_S = 3.0  # how long a process that failed waits, so that its sentence reaches the browser
MAX_CACHED_SESSIONS = 8  # --max_cached_sessions: conversations whose KV cache is kept between turns


def _demo_model() -> Path:
    """assets/demo-model of the checkout: beside this package (the README's editable install), else in the working
    directory (a `pip install .` run from the checkout)."""
    beside = Path(__file__).resolve().parent.parent / "assets" / "demo-model"
    here = Path.cwd() / "assets" / "demo-model"
    return here if not (beside / "config.json").exists() and (here / "config.json").exists() else beside


DEMO_MODEL = _demo_model()
