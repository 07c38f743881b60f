"""The demo model's evaluation through MetaModel and the templates: held-out questions a skill, and its bars."""

from __future__ import annotations

import random
from dataclasses import replace

from local_chat.templates.multi_turn import default_conversation
from local_chat.templates.single_turn import format_prompt

from . import data
from .recipe import DECLINE_ONE_DIGIT_SHARE, SEPARATOR
from .samples import system_prompt

# ----- evaluation, through MetaModel and the templates -----


def _eval_samples(seed: int, held_out: set, n: int) -> dict[str, list[data.Sample]]:
    rng = random.Random(seed + 2)
    sets: dict[str, list[data.Sample]] = {}

    def arith(template):
        return [data.Sample([data.arithmetic_turn(rng, held_out, keep_held_out=True)], template) for _ in range(n)]

    sets["arithmetic"] = arith("alpaca") + arith("conversation")
    # every sum of two one-digit numbers (most of them seen in training): the first sums a user tries
    small = [
        data.Turn(f"What is {a} {op} {b}?", "", "arithmetic", data.calculate(a, op, b))
        for op in ("plus", "minus")
        for a in range(10)
        for b in range(10)
        if op == "plus" or a >= b
    ]
    sets["arithmetic_one_digit"] = [data.Sample([t], tmpl) for t in small for tmpl in ("alpaca", "conversation")]
    capital_turns = [
        data.Turn(f"What is the capital of {c}?", f"The capital of {c} is {cap}.", "capital", cap)
        for c, cap in data.CAPITALS.items()
    ]
    sets["capitals"] = [data.Sample([t], tmpl) for t in capital_turns for tmpl in ("alpaca", "conversation")]
    for kind, question in (
        ("image_what", "What is in the image?"),
        ("image_color", None),
        ("image_count", "How many shapes are there?"),
    ):
        samples = []
        for i in range(n):
            image, shapes = data.shapes_image(rng)
            if kind == "image_color":
                color, shape = rng.choice(shapes)
                turn = data.Turn(f"What color is the {shape}?", "", kind, color)
            else:
                turn = data.Turn(question, "", kind, sorted(shapes) if kind == "image_what" else len(shapes))
            samples.append(data.Sample([turn], "alpaca" if i % 2 else "conversation", image, shapes))
        sets[kind] = samples
    deep, followups = [], []
    for _ in range(n):
        history = [data.text_turn(rng, held_out, None) for _ in range(5)]
        deep.append(data.Sample(history + [data.arithmetic_turn(rng, held_out, keep_held_out=True)], "conversation"))
        first = data.arithmetic_turn(rng, held_out)
        followups.append(data.Sample([first, data.followup_turn(rng, first.value)], "conversation"))
    sets["arithmetic_turn6"] = deep
    sets["followup"] = followups
    cut_short = (data.identity_turn, data.capital_turn, data.unknown_turn, lambda r: data.arithmetic_turn(r, held_out))
    # After an answer cut by Stop, the whole answer and nothing more: not the rest of the cut one.
    sets["after_stop"] = [
        data.Sample(
            [
                data.stopped(rng, rng.choice(cut_short)(rng)),
                replace(
                    data.arithmetic_turn(rng, held_out, keep_held_out=True)
                    if rng.random() < 0.5
                    else data.capital_turn(rng),
                    kind="exact",
                ),
            ],
            "conversation",
        )
        for _ in range(n)
    ]
    sets["identity"] = [
        data.Sample([data.Turn(q, "", "identity")], t)
        for q in ("Who are you?", "What can you do?")
        for t in ("alpaca", "conversation")
    ]
    sets["image_absent"] = [
        absent_shape_sample(rng, template) for _ in range(n // 2) for template in ("alpaca", "conversation")
    ]
    # last, so that the sets above draw what they drew before it
    sets["arithmetic_symbols"] = [
        data.Sample(
            [data.with_symbols(rng, data.arithmetic_turn(rng, held_out, True))], ("alpaca", "conversation")[i % 2]
        )
        for i in range(n)
    ]
    sets["arithmetic_one_digit_symbols"] = [
        replace(s, turns=[data.with_symbols(rng, s.turns[0])]) for s in sets["arithmetic_one_digit"]
    ]
    sets["declines"] = [
        data.Sample(
            [replace(data.decline_turn(rng, DECLINE_ONE_DIGIT_SHARE), kind="exact")], ("alpaca", "conversation")[i % 2]
        )
        for i in range(n)
    ]
    # with the system prompt cleared in the app: a held-out sum or a capital
    sets["no_system"] = [
        data.Sample(
            [data.arithmetic_turn(rng, held_out, keep_held_out=True) if i % 2 else data.capital_turn(rng)],
            "conversation",
            system="",
        )
        for i in range(n)
    ]
    return sets


def absent_shape_sample(rng: random.Random, template: str) -> data.Sample:
    """A question about a shape that is not in the image, and its exact answer."""
    while True:
        image, shapes = data.shapes_image(rng)
        present = {kind for _, kind in shapes}
        missing = [kind for kind in data.SHAPES if kind not in present]
        if missing:
            turn = replace(data.colour_turn(rng.choice(missing), shapes), kind="exact")
            return data.Sample([turn], template, image, shapes)


def prompt_for(sample: data.Sample) -> str:
    """The prompt a user of the public API would build for the last question of `sample`."""
    last = sample.turns[-1]
    if sample.template == "alpaca":
        return format_prompt({"instruction": last.question}, sys_name="alpaca")
    conv = default_conversation()
    conv.system = system_prompt(sample)
    conv.load_qas([[t.question, t.answer] for t in sample.turns[:-1]] + [[last.question, None]])
    return conv.get_prompt()


def is_correct(turn: data.Turn, answer: str) -> bool:
    import re

    if turn.kind in ("arithmetic", "followup", "image_count"):
        return re.search(rf"(?<!\d){turn.value}(?!\d)", answer.split(" is ")[-1]) is not None
    if turn.kind == "capital":
        return turn.value in answer
    if turn.kind == "image_color":  # about the shape asked, and only its colour
        asked = data.asked_shape(turn)
        return (
            re.findall("|".join(data.SHAPES), answer) == [asked]
            and answer.count(turn.value) == 1
            and not any(c in answer for c in data.COLORS if c != turn.value)
        )
    if turn.kind == "image_what":
        found = re.findall(rf"({'|'.join(data.COLORS)}) ({'|'.join(data.SHAPES)})", answer)
        return sorted(found) == turn.value
    if turn.kind == "identity":
        return "demo model" in answer and "--pretrained_path" in answer
    if turn.kind == "exact":
        return answer.strip() == turn.answer
    return True


def evaluate(model, seed: int, n: int, answer_tokens: int = 64) -> dict:
    """Greedy accuracy per skill, and how answers end (EOS for Alpaca, the separator in conversations), answers cut
    at `answer_tokens`."""
    held_out = data.held_out_pairs(seed)
    figures, endings_ok, endings = {}, 0, 0
    for name, samples in _eval_samples(seed, held_out, n).items():
        correct = 0
        for start in range(0, len(samples), 16):
            chunk = samples[start : start + 16]
            for template in ("alpaca", "conversation"):
                part = [s for s in chunk if s.template == template]
                if not part:
                    continue
                images = [s.image for s in part] if any(s.image is not None for s in part) else None
                stops = [] if template == "alpaca" else [SEPARATOR]
                results = model.generate(
                    [prompt_for(s) for s in part],
                    images=images,
                    max_gen_len=answer_tokens,
                    additional_stop_symbols=stops,
                    return_details=True,
                )
                for sample, result in zip(part, results):
                    correct += is_correct(sample.turns[-1], result["text"])
                    endings += 1
                    endings_ok += result["finish_reason"] == "stop"
        figures[name] = round(correct / len(samples), 3)
    figures["termination"] = round(endings_ok / endings, 3)
    return figures


BARS = {
    "arithmetic": 0.95,
    "capitals": 0.95,
    "image_what": 0.90,
    "image_color": 0.95,
    "image_count": 0.85,
    "arithmetic_turn6": 0.80,
    "followup": 0.80,
    "arithmetic_symbols": 0.90,
    "termination": 1.0,
}


def accuracy_table(figures: dict) -> str:
    rows = ["| skill | accuracy | bar |", "| --- | --- | --- |"]
    rows += [f"| {k} | {v:.1%} | {f'{BARS[k]:.0%}' if k in BARS else '-'} |" for k, v in figures.items()]
    return "\n".join(rows)
