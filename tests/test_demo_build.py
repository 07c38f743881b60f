"""The demo model's build script: it still runs end to end (a few training steps, then the evaluation), and its
worked sums are right."""
import random
import subprocess
import sys
from pathlib import Path

from model import MetaModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "assets"))

import build_demo_model as build  # noqa: E402
import demo_data as data  # noqa: E402


def test_build_script_quick_mode_still_runs(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "assets" / "build_demo_model.py"), "--quick",
                             "--out", str(tmp_path / "demo")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| arithmetic |" in result.stdout
    assert MetaModel.from_pretrained(str(tmp_path / "demo"), with_visual=True).sees_images


def _step_value(expression: str) -> int:
    words = expression.split()
    value = int(words[0])
    for op, number in zip(words[1::2], words[2::2]):
        value += int(number) if op == "plus" else -int(number)
    return value


def test_sums_are_worked_out_digit_by_digit_and_every_step_is_right():
    rng = random.Random(0)
    cases = [("plus", 27, 48), ("plus", 99, 99), ("plus", 198, 99), ("minus", 53, 25), ("minus", 100, 1),
             ("minus", 40, 36), ("plus", 5, 37)] + [data._pair(rng) for _ in range(300)]
    for op, a, b in cases:
        result = a + b if op == "plus" else a - b
        answer = data.worked_answer(a, op, b)
        assert answer.endswith(f"{a} {op} {b} is {result}."), answer
        if a < 10 and b < 10:
            continue
        steps = answer.split(": ", 1)[1].rsplit(", so ", 1)[0].split(", ")
        rebuilt = 0
        for place, step in enumerate(steps):
            expression, value = step.split(" is ")
            assert _step_value(expression) == int(value), (answer, step)
            rebuilt += int(value) % 10 * 10 ** place
        rebuilt += int(value) // 10 * 10 ** len(steps)  # the last carry
        assert rebuilt == result, answer


def test_learning_rate_warms_up_holds_its_peak_then_anneals_to_a_tenth():
    factors = [build.learning_rate_factor(step, 1200) for step in range(1201)]
    assert factors[0] < 0.05 and factors[99] == 1.0
    assert all(f == 1.0 for f in factors[100:901])  # held through the first three quarters
    decay = factors[900:]
    assert all(a >= b for a, b in zip(decay, decay[1:])) and abs(factors[1200] - 0.1) < 1e-9


def test_an_answer_cut_by_stop_is_context_but_never_a_target():
    rng = random.Random(0)
    whole, question = data.identity_turn(rng), data.capital_turn(rng)
    cut = data.stopped(rng, whole)
    assert cut.stopped and whole.answer.startswith(cut.answer + " ")  # cut after a word, never whole
    sample = data.Sample([cut, question], "conversation")
    build.check_segments_match_templates(sample)
    targets = [text for text, is_answer in build.segments(sample) if is_answer]
    assert targets == [" " + question.answer + build.SEPARATOR]
