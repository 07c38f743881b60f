"""python app.py [--pretrained_path CHECKPOINT] [flags]: the chat app (Chat, Single-turn) in the browser.

With no --pretrained_path it runs the built-in demo model; `python app.py --help` lists every flag. Installed, the same
app is the `local-chat` command.
"""

from local_chat.launchers.browser import app

if __name__ == "__main__":
    app()
