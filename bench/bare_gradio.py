"""A bare Gradio endpoint that replays ready-made answer pieces at a recorded pace: what Gradio and
gradio_client cost by themselves, so `bench/ui_overhead.py` can tell the app's own overhead apart.

python -m bench.bare_gradio --schedule pieces.json --port 7861
pieces.json: {"message": [[seconds after the call started, text], ...], ...}, recorded from the model.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator

import gradio as gr

from local_chat.engine.interface import CHAT_SAMPLING


def replay(schedule: dict[str, list[list]]):
    def chat(
        message: str,
        history: list[dict],
        image: gr.FileData | None = None,
        max_gen_len: int = CHAT_SAMPLING.max_new_tokens,
        temperature: float = CHAT_SAMPLING.temperature,
        top_p: float = CHAT_SAMPLING.top_p,
        top_k: int = CHAT_SAMPLING.top_k,
        repetition_penalty: float = CHAT_SAMPLING.repetition_penalty,
        system: str | None = None,
        template: str | None = None,
    ) -> Iterator[str]:
        """Yield the recorded pieces of the answer to `message` (up to `max_gen_len`), each at its recorded time."""
        started = time.perf_counter()
        for at, text in schedule[message][:max_gen_len]:
            wait = started + at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            yield text

    return chat


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schedule", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    with open(args.schedule) as f:
        schedule = json.load(f)
    with gr.Blocks() as app:
        gr.api(replay(schedule), api_name="chat")
    app.queue(default_concurrency_limit=1)
    app.launch(server_name="127.0.0.1", server_port=args.port, quiet=True)


if __name__ == "__main__":
    main()
