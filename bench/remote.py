"""The app in front of an engine (`python app.py --api_base URL`): what the front costs an answer.

An engine serves a random Llama folder of the demo model's size with a chat template: our own app, and
`transformers serve` where `transformers[serving]` is installed. The app runs in front of each (`--api_base`). In
turns, in one run, one `openai` client asks the engine directly and through the front's /v1 for the same greedy
answer (every answer runs to `max_tokens`: a tokenizer without EOS). Figures: the front's extra time to first text,
and its tokens/s after the first text over the engine's own.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from local_chat.launchers.loading import free_port

from .api_vs_serve import client_stream, has_serving, openai_server, openai_servers, save_chat_llama


def run(settings) -> dict[str, float]:
    tokens, repeats = settings.api_answer_tokens, settings.api_repeats
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp:
        folder = str(save_chat_llama(settings.api_shape, Path(tmp) / "model"))
        ports = {"local-chat": free_port(), "serve": free_port()}
        engines = {"local-chat": ([sys.executable, "app.py", "--pretrained_path", folder], "x")}
        if has_serving():
            serve = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", folder]
            engines["serve"] = ([*serve, "--device", "cpu"], folder)
        else:
            print("bench remote: transformers[serving] is not installed; only our own engine", file=sys.stderr)
        commands = {
            name: ([*command, "--port", str(ports[name])], ports[name]) for name, (command, _) in engines.items()
        }
        with openai_servers(commands) as clients:
            for name, (_, model) in engines.items():
                suffix = "" if name == "local-chat" else "_serve"
                results |= {
                    k + suffix: v for k, v in front_costs(clients[name], ports[name], model, tokens, repeats).items()
                }
    return results


def front_costs(engine, engine_port: int, model: str, tokens: int, repeats: int) -> dict[str, float]:
    """The front's extra time to first text (ms) and its token rate over the engine's, read in turns."""
    port = free_port()
    front_command = [sys.executable, "app.py", "--api_base", f"http://127.0.0.1:{engine_port}/v1", "--port", str(port)]
    if model != "x":
        front_command += ["--model", model]
    with openai_server(front_command, port) as front:
        client_stream(engine, model, tokens), client_stream(front, "x", tokens)  # warm up
        extra, ratio = [], []
        for round_ in range(repeats):
            seen = {}
            for name in ("engine", "front") if round_ % 2 == 0 else ("front", "engine"):
                client, asked = (engine, model) if name == "engine" else (front, "x")
                seen[name] = client_stream(client, asked, tokens)
            extra.append(seen["front"][0] - seen["engine"][0])
            ratio.append(seen["front"][1] / seen["engine"][1])
    return {
        "remote_ttft_overhead_ms": 1000 * statistics.median(extra),
        "remote_token_rate_ratio": statistics.median(ratio),
    }
