"""demos/generate.py: prompts from flags or files, templates, jsonl output, figures, and clear errors."""

import json

import pytest

from fixtures.app_server import GENERATE_RECORD_KEYS
from local_chat.defaults import DEMO_MODEL
from local_chat.launchers import generate

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")


def run(argv, capsys):
    generate.main([str(a) for a in argv])
    return capsys.readouterr().out


def test_prompts_to_jsonl_twice_the_same(tmp_path, capsys):
    argv = ["--prompts", "What is the capital of France?", "Hello!", "Who are you?", "--batch_size", "2"]
    out = run(argv + ["--output", tmp_path / "a.jsonl"], capsys)
    run(argv + ["--output", tmp_path / "b.jsonl"], capsys)
    records = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()  # no timings in the file
    assert [r["prompt"] for r in records] == ["What is the capital of France?", "Hello!", "Who are you?"]
    assert set(records[0]) == GENERATE_RECORD_KEYS
    assert records[0]["response"] == "The capital of France is Paris." and records[0]["finish_reason"] == "stop"
    assert "###" not in "".join(r["response"] for r in records)  # the chat template's separator ends answers
    for figure in (
        "batch size 2",
        "input tokens",
        "encode",
        "generate",
        "decode",
        "ms per output token",
        "output tokens/s",
    ):
        assert figure in out


def test_files_config_aliases_and_templates(tmp_path, capsys):
    (tmp_path / "p.txt").write_text("What is the capital of Peru?\n\nWhat is the capital of Chile?\nHi\n")
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "What is the capital of Kenya?", "id": 1}) + "\n")
    (tmp_path / "run.yaml").write_text(f"name_or_path: [{DEMO_MODEL}]\ntemplate: alpaca\nmax_gen_len: 32\n")
    run(
        [
            "--config",
            tmp_path / "run.yaml",
            "--data",
            tmp_path / "p.txt",
            "--limit",
            2,
            "--output",
            tmp_path / "o.jsonl",
        ],
        capsys,
    )
    answers = [json.loads(line)["response"] for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert len(answers) == 2 and "Lima" in answers[0] and "Santiago" in answers[1]
    out = run(["--data", tmp_path / "p.jsonl", "--template", "default", "--max_tokens_to_generate", 32], capsys)
    assert "Nairobi" in out


def test_compile_compiles_before_the_first_batch_and_answers_as_without(capsys):
    """--compile compiles the decode step for the batch sizes to come (here 2, then 1) before the first batch, so the
    figures leave it out; the answers are the same."""
    argv = ["--prompts", "What is the capital of France?", "Hi", "Who are you?", "--batch_size", 2]
    eager = run(argv, capsys)
    generate.main([str(a) for a in argv + ["--compile"]])
    compiled = capsys.readouterr()
    assert "Compiled the decode step in" in compiled.err
    answers = eager.split("\n\nbatch size")[0]
    assert "The capital of France is Paris." in answers and answers == compiled.out.split("\n\nbatch size")[0]


def test_system_prompt_replaces_the_templates_own(tmp_path, capsys):
    def record(*system):
        run(
            [
                "--prompts",
                "What is the capital of France?",
                "--template",
                "default",
                *system,
                "--output",
                tmp_path / "s.jsonl",
            ],
            capsys,
        )
        return json.loads((tmp_path / "s.jsonl").read_text())

    own, empty, short = record(), record("--system", ""), record("--system", "Be brief.")
    assert empty["input_tokens"] < short["input_tokens"] < own["input_tokens"]
    assert empty["response"] == own["response"] == "The capital of France is Paris."


@pytest.mark.parametrize(
    "argv, sentence",
    [
        (["--data", "missing.txt"], "does not exist"),
        (["--data", "{bad}"], 'has no "prompt" key'),
        (["--prompts"], "expected at least one argument"),
        (["--data", "{empty}"], "There are no prompts"),
        (["--prompts", "Hi", "--template", "nope"], "Unknown --template"),
        (
            ["--prompts", "Hi", "--template", "alpaca", "--system", "Be brief."],
            "--system needs a conversation template",
        ),
    ],
)
def test_bad_input_is_one_sentence(tmp_path, capsys, argv, sentence):
    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt here"}\n')
    (tmp_path / "empty.txt").write_text("\n")
    argv = [a.format(bad=tmp_path / "bad.jsonl", empty=tmp_path / "empty.txt") for a in argv]
    with pytest.raises(SystemExit):
        generate.main(argv)
    err = capsys.readouterr().err
    assert sentence in err and "Traceback" not in err
