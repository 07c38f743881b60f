"""LLaMA2-Accessory's inference guide examples run here with only their imports, paths and `.cuda()` changed.

The scripts in guide_examples/ are the guide's code with the import lines edited and `.cuda()` dropped;
this test only fills in the paths.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

EXAMPLES = Path(__file__).parent / "guide_examples"
ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str, paths: dict) -> subprocess.CompletedProcess:
    code = (EXAMPLES / f"{name}.py").read_text()
    for placeholder, real in paths.items():
        code = code.replace(placeholder, str(real))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("example", ["pretrained", "single_turn", "multi_turn"])
@pytest.mark.parametrize("fmt", ["accessory", "meta", "hf"])
def test_text_examples_run(example, fmt, checkpoints):
    result = run_example(example, {"/path/to/pretrained": checkpoints[fmt]})
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) >= 2  # both ways of generating printed their answer
    assert "Traceback" not in result.stderr


def test_legacy_example_names_the_unsupported_llama_peft(tmp_path, checkpoints, sp_model_file):
    peft_config = tmp_path / "llamaPeft_normBiasLora.json"
    peft_config.write_text(json.dumps({"lora_rank": 16, "bias_tuning": True}))
    result = run_example("legacy", {
        "/path/to/llama/7B/params.json": checkpoints["meta"] / "params.json",
        "configs/model/finetune/sg/llamaPeft_normBiasLora.json": peft_config,
        "/path/to/tokenizer.model": sp_model_file,
        "/path/to/pretrained": checkpoints["accessory"],
    })
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert "llama_type 'llama_peft' is not supported" in last_line and "LLaVA" in last_line


def test_multi_modal_example_runs(tmp_path, llava_dir):
    image = tmp_path / "shapes.png"
    picture = Image.new("RGB", (90, 60), "white")
    picture.paste((30, 60, 220), (10, 10, 50, 50))
    picture.save(image)
    result = run_example("multi_modal", {"/path/to/pretrained": llava_dir, "/path/to/image": image})
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) >= 2
