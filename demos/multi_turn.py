"""python demos/multi_turn.py [--pretrained_path CHECKPOINT] [flags]: multi-turn chat in the browser
(the demo model by default)."""

from local_chat.launchers.browser import multi_turn

if __name__ == "__main__":
    multi_turn()
