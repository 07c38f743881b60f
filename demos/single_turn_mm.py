"""python demos/single_turn_mm.py [--pretrained_path CHECKPOINT] [flags]: single-turn questions about an image
in the browser (the demo model by default)."""

from local_chat.launchers.browser import single_turn_mm

if __name__ == "__main__":
    single_turn_mm()
