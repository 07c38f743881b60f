"""python demos/single_turn.py [--pretrained_path CHECKPOINT] [flags]: single-turn instructions in the browser (the demo model by default)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ui import launch  # noqa: E402

if __name__ == "__main__":
    launch("Single-turn instructions", ("single",), with_visual=False)
