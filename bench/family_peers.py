"""python bench/family_peers.py: what `transformers serve` makes of each family's reasoning and calls, beside this
app, on the same tiny random models of the real classes with their published templates, made to write the same
text (tests/text_families.py). Prints a markdown table: for each family and server, whether the reasoning came back
apart (`reasoning_content`) and whether a call came back as `tool_calls` with its arguments as JSON.
Needs transformers[serving] (pip install -e ".[dev]")."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

NINE = ("deepseek_v3_1", "glm4_moe", "glm4_moe_lite", "kimi_k2", "minimax_m2", "seed_oss", "granite4", "lfm2_moe")
NINE += ("nemotron_h",)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def ask(api, forced, tokenizer, kind, folder: str) -> tuple[str, str]:
    """(what came back of a forced reasoning + answer, of a forced call) from one server."""
    question = [{"role": "user", "content": "Hello there!"}]
    extra = {"extra_body": {"chat_template_kwargs": kind.thinking}} if kind.thinking else {}
    if "{r}" in kind.thought:
        forced.again(kind.think("I greet back.", "Hello!"), tokenizer, kind.end)
        message = api.chat.completions.create(model=folder, messages=question, max_tokens=200, **extra).choices[0]
        reasoning = (message.message.model_extra or {}).get("reasoning_content")
        apart = reasoning == "I greet back." and message.message.content == "Hello!"
        thought = "apart" if apart else f"in the answer: {message.message.content!r}"[:60]
    else:
        thought = "(no reasoning)"
    forced.again(kind.call("get_weather", '{"city": "Paris"}'), tokenizer, kind.call_end or kind.end)
    choice = api.chat.completions.create(model=folder, messages=question, tools=[WEATHER], max_tokens=200).choices[0]
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
    called = "tool_calls" if calls == [("get_weather", {"city": "Paris"})] else f"text: {choice.message.content!r}"
    return thought, called[:60]


def main() -> None:
    import text_families
    import tiny_models
    from app_server import serve
    from openai import OpenAI
    from transformers.cli.serve import Serve

    from local_chat.launchers.loading import free_port
    from local_chat.model.meta import MetaModel

    rows = ["| family | ours: reasoning | ours: call | transformers serve: reasoning | transformers serve: call |"]
    rows.append("|---|---|---|---|---|")
    for name in NINE:
        kind = text_families.FAMILIES[name]
        folder = str(text_families.build(name, Path(tempfile.mkdtemp()) / name))
        port = free_port()
        server = Serve(force_model=folder, port=port, device="cpu", non_blocking=True, log_level="error")
        try:
            [loaded] = server._model_manager.loaded_models.values()
            theirs = tiny_models.ForcedAnswer(loaded.model, loaded.processor, "x", kind.end)
            api = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
            their_row = ask(api, theirs, loaded.processor, kind, folder)
        finally:
            server.kill_server()
        model = MetaModel.from_pretrained(folder)
        forced = tiny_models.ForcedAnswer(model.llma, model.tokenizer.hf, "x", kind.end)
        with serve(model) as (url, _):
            our_row = ask(
                OpenAI(base_url=url + "/v1", api_key="x", max_retries=0), forced, model.tokenizer.hf, kind, folder
            )
        rows.append(f"| {name} | {' | '.join(our_row)} | {' | '.join(their_row)} |")
        print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
