"""--n_gpus N with --device cpu: N processes over gloo in lockstep, as on N GPUs. Answers equal one process's;
Stop and a dead worker never leave a request waiting."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fixtures.app_server import (
    ENV,
    ROOT,
    TORCHRUN,
    generate,
    generate_here,
    interrupted,
    launched,
    v1_answer,
    wait_for_pieces,
)
from local_chat.defaults import DEMO_MODEL

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome"}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")


@pytest.mark.parametrize(
    "model, sampling",
    [
        ("demo", ["--temperature", "0"]),
        ("accessory", ["--temperature", "0.9", "--top_p", "0.9", "--seed", "7", "--max_new_tokens", "24"]),
    ],
)
def test_generate_on_two_ranks_writes_what_one_writes(tmp_path, checkpoints, model, sampling):
    """The demo model's answers held to a schema, too: rank 0 decides each step with its mask."""
    prompts = ["--prompts", "What is the capital of France?", "Who are you?", "What is the capital of Peru?"]
    path = [] if model == "demo" else ["--pretrained_path", str(checkpoints[model]), "--template", "alpaca"]
    (tmp_path / "city.json").write_text(json.dumps(CITY_SCHEMA))
    schema = ["--json_schema", str(tmp_path / "city.json")] if model == "demo" else []
    flags = [*prompts, *path, *sampling, *schema, "--batch_size", "2"]
    one = generate_here(tmp_path, "one", *flags)
    two = generate(tmp_path, "two", *flags, "--n_gpus", "2", "--device", "cpu")
    assert two == one and len(one.splitlines()) == 3
    if schema:
        assert all(json.loads(json.loads(line)["response"])["city"] for line in one.splitlines())


def test_generate_under_torchrun_writes_what_one_process_writes(tmp_path):
    flags = ["--prompts", "What is the capital of Japan?", "What is the capital of Chile?", "--temperature", "0"]
    one = generate_here(tmp_path, "one", *flags)
    assert generate(tmp_path, "torchrun", *flags, "--device", "cpu", launcher=TORCHRUN) == one


@pytest.mark.parametrize(
    "flags, sentence",
    [
        (["--n_gpus", "3"], "8 attention heads (8 key/value heads), which do not divide over 3 ranks"),
        (["--n_gpus", "2", "--quant", "4"], "--quant cannot be combined with tensor parallel"),
        (["--n_gpus", "2", "--parallel", "pipeline"], "--parallel pipeline spreads layers over GPUs"),
    ],
)
def test_impossible_layouts_are_one_sentence_at_start(flags, sentence):
    result = subprocess.run(
        [sys.executable, str(ROOT / "demos" / "generate.py"), "--prompts", "Hi", "--device", "cpu", *flags],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert result.returncode == 1
    assert sentence in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.fixture(scope="module")
def app_on_two_ranks():
    app, client = launched("--n_gpus", "2", "--device", "cpu")
    yield app, client
    app.kill()
    app.wait()


def follower_of(app) -> int:
    """Rank 1: the launcher's newest child (the web server's process starts first, then the ranks load the model)."""
    found = subprocess.run(["pgrep", "-n", "-P", str(app.pid), "-f", "spawn_main"], capture_output=True, text=True)
    return int(found.stdout)


def ask(client, country: str, history=()) -> str:
    return client.predict(
        message=f"What is the capital of {country}?", history=list(history), temperature=0.0, api_name="/chat"
    )


def test_app_on_two_ranks_answers_a_conversation(app_on_two_ranks):
    _, client = app_on_two_ranks
    history = []
    for country, capital in CAPITALS.items():  # the session's KV cache is kept on both ranks between turns
        answer = ask(client, country, history)
        assert answer == f"The capital of {country} is {capital}."
        history += [
            {"role": "user", "content": f"What is the capital of {country}?"},
            {"role": "assistant", "content": answer},
        ]


def test_stop_on_two_ranks_then_the_next_request_works(app_on_two_ranks):
    _, client = app_on_two_ranks
    job = client.submit(message="Who are you?", history=[], max_gen_len=200, api_name="/chat")
    wait_for_pieces(job, 3)
    job.cancel()
    started = time.time()
    assert ask(client, "Italy") == "The capital of Italy is Rome."
    assert time.time() - started < 30


def test_a_killed_worker_is_an_error_within_ten_seconds_and_the_app_exits(app_on_two_ranks):
    app, client = app_on_two_ranks
    job = client.submit(message="Who are you?", history=[], max_gen_len=2000, api_name="/chat")
    wait_for_pieces(job, 3)
    follower = follower_of(app)
    killed_at = time.time()
    os.kill(follower, signal.SIGKILL)
    with pytest.raises(Exception, match="A model worker stopped: rank 1"):
        job.result(timeout=10)
    assert time.time() - killed_at < 10
    assert app.wait(timeout=20) == 1  # the launcher exits with the message, as the README says
    assert "error: A model worker stopped" in app.stdout.read()


def ends_quietly(output: str) -> bool:
    """No rank printed where Ctrl-C found it, and rank 0 told the others to end without an error."""
    return not any(sign in output for sign in ("KeyboardInterrupt", "Exception ignored", "[rank1]", "error:"))


def test_ctrl_c_ends_every_rank_quietly():
    app, client = launched("--n_gpus", "2", "--device", "cpu")
    assert ask(client, "Peru") == "The capital of Peru is Lima."
    assert v1_answer(client, "What is the capital of Japan?") == "The capital of Japan is Tokyo."  # /v1 too
    output = interrupted(app)
    assert app.returncode == 0 and ends_quietly(output) and "Traceback" not in output, output
    assert "Batching: off: not with tensor parallel yet." in output  # answers one at a time, as before
    left = processes_of(app)
    assert not left, left


def test_under_torchrun_rank_0_serves_the_app_and_ctrl_c_mid_answer_ends_every_rank():
    app, client = launched("--device", "cpu", launcher=TORCHRUN)
    assert ask(client, "Chile") == "The capital of Chile is Santiago."
    assert v1_answer(client, "What is the capital of Japan?") == "The capital of Japan is Tokyo."  # rank 0's /v1
    job = client.submit(message="Who are you?", history=[], max_gen_len=2000, api_name="/chat")
    wait_for_pieces(job, 3)  # both ranks are inside the answer's steps
    output = interrupted(app)  # torchrun's agent reports the signal with a traceback of its own
    assert "tensor parallel over 2 CPU processes" in output and ends_quietly(output), output
    left = processes_of(app)
    assert not left, left


def processes_of(app) -> list[str]:
    """The processes still running in the app's session (`launched` starts one): ranks, the web server. An ended
    one whose parent left before reaping it stays listed as a zombie until init does: those are not counted."""
    listed = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-s", str(app.pid)], capture_output=True, text=True)
    return [line for line in listed.stdout.splitlines() if not line.split()[1].startswith("Z")]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, byte_tokenizer):
    from fixtures import tiny_models

    return tiny_models.save_hf(
        tiny_models.random_gpt2(len(byte_tokenizer)), tmp_path_factory.mktemp("gpt2"), hf_tokenizer=byte_tokenizer
    )


def test_a_model_tensor_parallel_cannot_split_is_one_sentence_on_cpu_ranks(gpt2_dir):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "demos" / "generate.py"),
            "--prompts",
            "Hi",
            "--device",
            "cpu",
            "--n_gpus",
            "2",
            "--pretrained_path",
            str(gpt2_dir),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "This gpt2 model cannot be split over processes (transformers has no tensor-parallel plan" in result.stderr


def test_on_gpus_such_a_model_runs_in_pipeline_mode_instead(gpt2_dir, checkpoints, monkeypatch):
    import torch

    from local_chat.launchers.flags import parser
    from local_chat.launchers.loading import parallel_plan

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the plan only: nothing is loaded
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    plan = lambda path: parallel_plan(parser("test").parse_args(["--n_gpus", "2", "--pretrained_path", str(path)]))
    assert plan(gpt2_dir) == (2, "pipeline", "cuda")
    assert plan(checkpoints["hf"]) == (2, "tensor", "cuda")  # a Llama splits
    assert plan(checkpoints["accessory"]) == (2, "tensor", "cuda")


def test_an_exception_on_rank_0_mid_answer_is_an_error_and_the_launcher_exits(tmp_path):
    started = time.time()
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "rank0_fault.py")], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert (
        "The model failed on rank 0 (RuntimeError: injected fault on rank 0), so its ranks are out of step"
        in result.stdout
    ), result.stdout + result.stderr
    assert result.returncode == 1 and "still running" not in result.stdout
    assert "error: The model failed on rank 0" in result.stderr
    assert time.time() - started < 60
