"""python demos/single_turn.py [--pretrained_path CHECKPOINT] [flags]: single-turn instructions in the browser
(the demo model by default)."""

from local_chat.launchers.browser import single_turn

if __name__ == "__main__":
    single_turn()
