"""python demos/multi_turn_mm.py [--pretrained_path CHECKPOINT] [flags]: multi-turn chat about an image in the browser
(the demo model by default)."""

from local_chat.launchers.browser import multi_turn_mm

if __name__ == "__main__":
    multi_turn_mm()
