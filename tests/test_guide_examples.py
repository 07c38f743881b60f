"""LLaMA2-Accessory's inference guide examples run here with only their imports, paths and `.cuda()` changed
(and, in the multi-GPU one, NCCL and a GPU per rank made gloo and the CPU).

The scripts in guide_examples/ are the guide's code with the import lines edited and `.cuda()` dropped;
this test only fills in the paths.
"""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

EXAMPLES = Path(__file__).parent / "guide_examples"
ROOT = Path(__file__).resolve().parent.parent


def filled(name: str, paths: dict) -> str:
    """An example's code with its placeholders filled in."""
    code = (EXAMPLES / f"{name}.py").read_text()
    for placeholder, real in paths.items():
        code = code.replace(placeholder, str(real))
    return code


def run_here(name: str, paths: dict, capsys) -> str:
    """What an example prints, run in this process as a script (`__main__`): no interpreter to start."""
    capsys.readouterr()
    exec(compile(filled(name, paths), str(EXAMPLES / f"{name}.py"), "exec"), {"__name__": "__main__"})
    return capsys.readouterr().out


def run_example(name: str, paths: dict, folder: Path | None = None) -> subprocess.CompletedProcess:
    """Run an example in a Python of its own; from a file in `folder` where it spawns processes."""
    code = filled(name, paths)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    command = [sys.executable, "-c", code]
    if folder is not None:
        (folder / f"{name}.py").write_text(code)
        command = [sys.executable, str(folder / f"{name}.py")]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("example", ["pretrained", "single_turn", "multi_turn"])
@pytest.mark.parametrize("fmt", ["accessory", "meta", "hf"])
def test_text_examples_run(example, fmt, checkpoints, capsys):
    printed = run_here(example, {"/path/to/pretrained": checkpoints[fmt]}, capsys)
    assert len(printed.splitlines()) >= 2  # both ways of generating printed their answer


def test_multi_modal_example_runs(tmp_path, llava_dir, capsys):
    image = tmp_path / "shapes.png"
    picture = Image.new("RGB", (90, 60), "white")
    picture.paste((30, 60, 220), (10, 10, 50, 50))
    picture.save(image)
    printed = run_here("multi_modal", {"/path/to/pretrained": llava_dir, "/path/to/image": image}, capsys)
    assert len(printed.splitlines()) >= 2


def test_multi_gpu_example_runs_on_two_cpu_processes(tmp_path):
    """The guide's model-parallel example (NCCL and a GPU per rank made gloo and the CPU), on the demo model: every
    rank streams the same answer, the one a single process gives."""
    from local_chat.defaults import DEMO_MODEL
    from local_chat.launchers.loading import free_port
    from local_chat.model.meta import MetaModel
    from local_chat.templates.single_turn import format_prompt

    result = run_example(
        "multi_gpu",
        {
            "/path/to/pretrained": DEMO_MODEL,
            'backend="nccl"': 'backend="gloo"',
            "torch.cuda.set_device(rank)": "pass",
            "23560": str(free_port()),
        },
        folder=tmp_path,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "terminate called" not in result.stderr, result.stderr  # a rank that aborted as it ended
    single = MetaModel.from_pretrained(str(DEMO_MODEL), max_seq_len=2048)
    prompt = format_prompt({"instruction": "What's the best programming language in the world?"}, sys_name="alpaca")
    pieces = [piece["text"] for piece in single.stream_generate(prompt, image=None, max_gen_len=512)]
    # Both ranks print every piece; their lines may interleave, so compare what was printed, not its order (nor
    # its line breaks: print adds one after each piece, and an answer may hold some).
    printed = result.stdout.replace("\n", "")
    expected = "".join(pieces).replace("\n", "")
    assert len(pieces) > 2 and Counter(printed) == Counter(expected * 2), result.stdout
    assert printed.count(pieces[-1].replace("\n", "")) >= 2
