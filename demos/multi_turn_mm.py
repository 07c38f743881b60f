"""python demos/multi_turn_mm.py [--pretrained_path CHECKPOINT] [flags]: multi-turn chat about an image in the browser (the demo model by default)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ui import launch  # noqa: E402

if __name__ == "__main__":
    launch("Multi-turn chat about an image", ("vision",), with_visual=True)
