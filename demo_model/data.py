"""The demo model's synthetic world: what it knows, the exact phrasings, shape images, and conversations.

Everything is drawn from a `random.Random`, so a seed decides the whole data set.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from PIL import Image, ImageDraw

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Portugal": "Lisbon",
    "Japan": "Tokyo",
    "China": "Beijing",
    "India": "New Delhi",
    "Canada": "Ottawa",
    "Brazil": "Brasilia",
    "Argentina": "Buenos Aires",
    "Mexico": "Mexico City",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Nigeria": "Abuja",
    "Russia": "Moscow",
    "Australia": "Canberra",
    "Greece": "Athens",
    "Turkey": "Ankara",
    "Sweden": "Stockholm",
    "Norway": "Oslo",
    "Finland": "Helsinki",
    "Poland": "Warsaw",
    "Austria": "Vienna",
    "Ireland": "Dublin",
    "Netherlands": "Amsterdam",
    "Belgium": "Brussels",
    "Switzerland": "Bern",
    "Peru": "Lima",
    "Chile": "Santiago",
}
COLORS = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (235, 210, 20),
    "purple": (140, 40, 170),
    "orange": (245, 130, 20),
}
SHAPES = ("circle", "square", "triangle")
NUMBER_WORDS = {1: "one", 2: "two", 3: "three"}

WHO_ARE_YOU = (
    "I am the built-in demo model of this app, trained on synthetic data. I can add and subtract "
    "numbers up to 99, name 30 capitals and describe shapes in an image. For a real model, start "
    "python app.py --pretrained_path /path/to/checkpoint."
)
WHAT_CAN_YOU_DO = (
    "I am only the built-in demo model: I can add and subtract numbers up to 99, name 30 capitals "
    "and describe shapes in an image. For a real model, start python app.py --pretrained_path "
    "/path/to/checkpoint."
)
DONT_KNOW = "Sorry, I am only a small demo model and cannot answer that."
ABSENT = "not"  # "The circle is not in the image."

_UNKNOWN_SUBJECTS = [
    "the weather",
    "music",
    "football",
    "the moon",
    "cooking",
    "history",
    "love",
    "the stock market",
    "python",
    "poetry",
    "dogs",
    "cats",
    "the ocean",
    "physics",
    "chess",
    "movies",
    "trains",
    "coffee",
    "the internet",
    "space travel",
    "gardening",
    "money",
    "sleep",
    "the news",
]
_UNKNOWN_FORMS = [
    "Tell me about {s}.",
    "What do you think about {s}?",
    "Can you write a poem about {s}?",
    "Explain {s} to me.",
    "Why is {s} important?",
    "How does {s} work?",
    "Give me advice on {s}.",
    "What is the best thing about {s}?",
    "Write a story about {s}.",
    "Do you like {s}?",
]
_UNKNOWN_PLACES = ["Atlantis", "Mars", "Narnia", "the Moon", "Gondor", "Texas", "Bavaria", "Wakanda", "Europe"]
_UNKNOWN_FIXED = [
    "Hello!",
    "Hi there.",
    "How are you?",
    "What time is it?",
    "What is your favourite color?",
    "Tell me a joke.",
    "What is the meaning of life?",
    "What is 5 times 6?",
    "What is 7 divided by 2?",
    "Translate hello into French.",
    "Thanks!",
    "What day is it today?",
    "Who won the last world cup?",
]

# Asked after the first training steps only (`Shares.decline`): what users try first that the demo model cannot do.
# Before, it read "What is 3*4?" as a sum ("34 plus 24: ...") and answered "Good morning!" with one.
_UNSUPPORTED_MATH = [
    "What is {a} times {b}?",
    "What is {a}*{b}?",
    "{a}*{b}",
    "{a} * {b}",
    "What is {a} x {b}?",
    "{a}x{b}",
    "{a} times {b}",
    "What is {a} divided by {b}?",
    "What is {a}/{b}?",
    "{a}/{b}",
    "{a} / {b}",
    "What is {a} plus {b} plus {c}?",
    "What is {a}+{b}+{c}?",
    "{a}+{b}+{c}",
    "{a} + {b} - {c}",
    "What is {a} minus {b} minus {c}?",
    "What is {a} squared?",
    "What is {a} to the power of {b}?",
    "What is the square root of {a}?",
    "What is {a}% of {b}?",
    "What is {a}%?",
    "What is {a} mod {b}?",
    # sums of three numbers spaced as people type them, and numbers it was never taught: over 99,
    # with decimals, negative (before, "2 + 3 + 4" was "2 plus 34", "150 plus 20" "14 plus 20")
    "{a} + {b} + {c}",
    "What is {a} + {b} + {c}?",
    "{a} - {b} - {c}",
    "{a} + {b} + {c} =",
    "What is {big} plus {b}?",
    "What is {a} minus {big}?",
    "{big} + {b}",
    "{big}+{b}",
    "{a} + {big}",
    "What is {big} - {b}?",
    "What is {a}.{d} plus {b}?",
    "{a}.{d} + {b}",
    "What is {a} plus {b}.{d}?",
    "What is -{a} plus {b}?",
    "-{a} + {b}",
    "What is {a} plus -{b}?",
]
_SMALL_TALK = [
    "Good morning!",
    "Good morning",
    "Good evening.",
    "Good night!",
    "hello",
    "hi",
    "Hey!",
    "Hey there",
    "Thank you",
    "Thank you!",
    "Thanks a lot.",
    "Bye!",
    "Goodbye.",
    "How old are you?",
    "Are you there?",
    "Can you help me?",
    "Write me a haiku.",
    "Summarize this text.",
    "Nice to meet you.",
    "What should I eat today?",
    "ok",
    "Yes",
    "No",
    "Why?",
    "Tell me something.",
    "What is new?",
]


@dataclass
class Turn:
    question: str
    answer: str
    # arithmetic, capital, identity, unknown, followup, image_what, image_color, image_count; in the evaluation
    # also exact: right only if the answer is `answer`, word for word
    kind: str
    value: object = None  # what an evaluation checks: the number, the capital, the shapes...
    stopped: bool = False  # cut short by Stop: context for the turns after it, never a target


@dataclass(frozen=True)
class Shares:
    """The mix of the steps after the first ones: `symbol` of the sums asked with symbols ("2+2"), `one_digit` of
    them of two one-digit numbers, `decline` of the text questions `decline_turn`s, `decline_one_digit` of those
    of one-digit numbers, `no_system` of the conversations with the system prompt cleared. Each is drawn only when
    it is not 0, so that with the default a seed draws the same samples as before they existed."""

    symbol: float = 0.0
    one_digit: float = 0.0
    decline: float = 0.0
    decline_one_digit: float = 0.0
    no_system: float = 0.0


@dataclass
class Sample:
    turns: list[Turn]
    template: str  # "alpaca" (one turn) or "conversation"
    image: Image.Image | None = None
    shapes: list = field(default_factory=list)
    system: str | None = None  # the conversation template's system prompt; None: its own


# ----- questions -----


def arithmetic_turn(
    rng: random.Random, held_out: set | None = None, keep_held_out: bool = False, largest: int = 99
) -> Turn:
    """A plus/minus question of numbers up to `largest`; `held_out` pairs are kept out of training and are the
    evaluation's."""
    while True:
        op, a, b = _pair(rng, largest)
        if held_out is None or ((op, a, b) in held_out) == keep_held_out:
            break
    return Turn(f"What is {a} {op} {b}?", worked_answer(a, op, b), "arithmetic", calculate(a, op, b))


SYMBOLS = {"plus": "+", "minus": "-"}
_SYMBOL_FORMS = [
    "What is {a}{s}{b}?",
    "What is {a} {s} {b}?",
    "{a}{s}{b}",
    "{a} {s} {b}",
    "{a}{s}{b}=",
    "{a} {s} {b} =",
    "{a}{s}{b}=?",
    "Calculate {a} {s} {b}",
    "What's {a} {s} {b}?",
]


def with_symbols(rng: random.Random, turn: Turn) -> Turn:
    """An arithmetic turn asked as people type it ("What is 2+2?", "27 - 8"), answered in words as before."""
    a, op, b = turn.question.rstrip("?").split()[-3:]
    return replace(turn, question=rng.choice(_SYMBOL_FORMS).format(a=a, s=SYMBOLS[op], b=b))


def followup_turn(rng: random.Random, previous: int) -> Turn:
    c = rng.randint(0, 99)
    return Turn(f"Add {c} to that.", worked_answer(previous, "plus", c), "followup", previous + c)


def worked_answer(a: int, op: str, b: int) -> str:
    """The sum worked out digit by digit, ones first, as on paper: "27 plus 48: 7 plus 8 is 15, 2 plus 4 plus 1
    is 7, so 27 plus 48 is 75." A small model learns these far sooner than the whole sum written in one go: in
    the full mix (untied, bf16), 88% of held-out sums after 1,200 steps against 7.5% after 1,550."""
    final = f"{a} {op} {b} is {calculate(a, op, b)}."
    if a < 10 and b < 10:
        return final
    steps, carry = [], 0
    for i in range(max(len(str(a)), len(str(b)))):
        x, y = a // 10**i % 10, b // 10**i % 10
        if op == "plus":
            steps.append(f"{x} plus {y}{' plus 1' if carry else ''} is {x + y + carry}")
            carry = (x + y + carry) // 10
        else:
            borrow = int(x - carry < y)
            steps.append(f"{x + 10 * borrow} minus {y}{' minus 1' if carry else ''} is {x + 10 * borrow - y - carry}")
            carry = borrow
    return f"{a} {op} {b}: " + ", ".join(steps) + ", so " + final


def calculate(a: int, op: str, b: int) -> int:
    return a + b if op == "plus" else a - b


def capital_turn(rng: random.Random) -> Turn:
    country = rng.choice(list(CAPITALS))
    return Turn(
        f"What is the capital of {country}?",
        f"The capital of {country} is {CAPITALS[country]}.",
        "capital",
        CAPITALS[country],
    )


def identity_turn(rng: random.Random) -> Turn:
    if rng.random() < 0.5:
        return Turn(rng.choice(["Who are you?", "Who are you", "who are you?"]), WHO_ARE_YOU, "identity")
    return Turn(rng.choice(["What can you do?", "What can you do", "what can you do?"]), WHAT_CAN_YOU_DO, "identity")


def unknown_turn(rng: random.Random) -> Turn:
    roll = rng.random()
    if roll < 0.4:
        question = rng.choice(_UNKNOWN_FORMS).format(s=rng.choice(_UNKNOWN_SUBJECTS))
    elif roll < 0.6:
        question = f"What is the capital of {rng.choice(_UNKNOWN_PLACES)}?"
    elif roll < 0.8:
        question = rng.choice(_UNKNOWN_FIXED)
    else:
        words = rng.sample(_UNKNOWN_SUBJECTS + ["why", "how", "where", "please", "explain", "tell"], 3)
        question = " ".join(words).capitalize() + "?"
    return Turn(question, DONT_KNOW, "unknown")


def decline_turn(rng: random.Random, one_digit: float = 0.0) -> Turn:
    """Arithmetic the demo model does not do ("3*4", "2+3+4") or small talk, declined like any other question;
    `one_digit` of the arithmetic of one-digit numbers besides the one over 99."""
    if rng.random() < 0.8:
        largest = 9 if one_digit and rng.random() < one_digit else 99
        question = rng.choice(_UNSUPPORTED_MATH).format(
            a=rng.randint(0, largest),
            b=rng.randint(1, largest),
            c=rng.randint(0, largest),
            big=rng.randint(100, 999),
            d=rng.randint(1, 9),
        )
    else:
        question = rng.choice(_SMALL_TALK)
    return Turn(question, DONT_KNOW, "unknown")


# ----- images -----


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple, color: tuple) -> None:
    left, top, right, bottom = box
    if shape == "circle":
        draw.ellipse(box, fill=color)
    elif shape == "square":
        draw.rectangle(box, fill=color)
    else:
        draw.polygon([((left + right) / 2, top), (right, bottom), (left, bottom)], fill=color)


def shapes_image(rng: random.Random, count: int | None = None) -> tuple[Image.Image, list[tuple[str, str]]]:
    """1-3 non-overlapping shapes of distinct kinds, each 15-50% of the side, on a plain light or dark
    background; returns the image and its (color, shape) pairs, circle first, then square, then triangle
    (the order in which the model describes them)."""
    image, shapes, _ = shapes_image_and_map(rng, count)
    return image, shapes


def shapes_image_and_map(rng: random.Random, count: int | None = None) -> tuple[Image.Image, list, Image.Image]:
    """shapes_image, with the same draws, and its kinds map: a greyscale image of the same size, 0 on the
    background and 1, 2, 3 where the circle, square or triangle is (for the build's per-patch shape loss)."""
    width = rng.randint(48, 320)
    height = max(48, min(320, int(width * rng.uniform(0.6, 1.6))))
    side = min(width, height)
    light = rng.random() < 0.5
    grey = rng.randint(215, 255) if light else rng.randint(0, 45)
    image = Image.new("RGB", (width, height), (grey, grey, grey))
    count = count or rng.randint(1, 3)
    kinds = rng.sample(SHAPES, count)
    placed: list[tuple] = []
    for kind in kinds:
        for _ in range(200):
            size = int(side * rng.uniform(0.15, 0.5 if count == 1 else 0.4))
            left, top = rng.randint(0, width - size), rng.randint(0, height - size)
            box = (left, top, left + size, top + size)
            if all(
                box[2] + 2 < b[0] or b[2] + 2 < box[0] or box[3] + 2 < b[1] or b[3] + 2 < box[1] for b, _, _ in placed
            ):
                placed.append((box, kind, rng.choice(list(COLORS))))
                break
    kinds_map = Image.new("L", (width, height), 0)
    draw, draw_kind = ImageDraw.Draw(image), ImageDraw.Draw(kinds_map)
    for box, kind, color in placed:
        _draw_shape(draw, kind, box, COLORS[color])
        _draw_shape(draw_kind, kind, box, SHAPES.index(kind) + 1)
    placed.sort(key=lambda p: SHAPES.index(p[1]))
    return image, [(color, kind) for _, kind, color in placed], kinds_map


def describe(shapes: list[tuple[str, str]]) -> str:
    parts = [f"a {color} {kind}" for color, kind in shapes]
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return text[0].upper() + text[1:] + "."


def colour_turn(kind: str, shapes: list[tuple[str, str]]) -> Turn:
    """ "What color is the circle?" about the image of `shapes`: its colour, or ABSENT where there is no circle."""
    present = {k: c for c, k in shapes}
    # Both answers start "The circle is", so that one word, after it, decides: the colour or ABSENT. The build
    # teaches the language model where to look for it (demo_model.training.lookup_loss).
    if kind in present:
        return Turn(f"What color is the {kind}?", f"The {kind} is {present[kind]}.", "image_color", present[kind])
    return Turn(f"What color is the {kind}?", f"The {kind} is {ABSENT} in the image.", "image_color", None)


def asked_shape(turn: Turn) -> str:
    """The shape a colour_turn asks about: "circle" in "What color is the circle?"."""
    return turn.question.rstrip("?").split()[-1]


def image_turn(rng: random.Random, shapes: list[tuple[str, str]]) -> Turn:
    roll = rng.random()
    if roll < 0.4:
        question = rng.choice(
            ["What is in the image?", "What is in this image?", "Describe the image.", "What do you see?"]
        )
        return Turn(question, describe(shapes), "image_what", sorted(shapes))
    if roll < 0.75:
        return colour_turn(rng.choice(SHAPES), shapes)
    n = len(shapes)
    answer = "There is 1 shape." if n == 1 else f"There are {n} shapes."
    return Turn(
        rng.choice(["How many shapes are there?", "How many shapes are in the image?"]), answer, "image_count", n
    )


# ----- samples -----


def text_turn(rng: random.Random, held_out: set | None, previous: Turn | None, shares: Shares = Shares()) -> Turn:
    """A question without an image, with `shares.decline` and `shares.one_digit` of `Shares`."""
    if shares.decline and rng.random() < shares.decline:
        return decline_turn(rng, shares.decline_one_digit)
    roll = rng.random()
    if previous is not None and previous.kind in ("arithmetic", "followup") and roll < 0.35:
        return followup_turn(rng, previous.value)
    if roll < 0.73:  # the sums are the slowest skill to learn; the capitals (0.12) come early
        one_digit = shares.one_digit and rng.random() < shares.one_digit
        return arithmetic_turn(rng, held_out, largest=9 if one_digit else 99)
    if roll < 0.85:
        return capital_turn(rng)
    if roll < 0.91:
        return identity_turn(rng)
    return unknown_turn(rng)


def training_sample(rng: random.Random, held_out: set, image_share: float = 0.3, shares: Shares = Shares()) -> Sample:
    """One training example: a mix of templates, turn counts and images, and the `Shares` of the later steps."""
    with_image = rng.random() < image_share
    template = "alpaca" if rng.random() < 0.25 else "conversation"
    image, shapes = shapes_image(rng) if with_image else (None, [])
    n_turns = 1 if template == "alpaca" else rng.choice([1, 2, 3, 4, 5, 6, 6, 7, 8, 8, 9, 10])
    turns: list[Turn] = []
    for i in range(n_turns):
        if with_image and (i == 0 or rng.random() < 0.5):
            turns.append(image_turn(rng, shapes))
        else:
            turns.append(text_turn(rng, held_out, turns[-1] if turns else None, shares))
    if shares.symbol:
        turns = [with_symbols(rng, t) if t.kind == "arithmetic" and rng.random() < shares.symbol else t for t in turns]
    # a user may clear the app's system prompt: "" (before, such a prompt got "The capital of France a small demo...")
    cleared = template == "conversation" and shares.no_system and rng.random() < shares.no_system
    return Sample(turns, template, image, shapes, "" if cleared else None)


def stopped(rng: random.Random, turn: Turn) -> Turn:
    """The turn as the chat keeps it after Stop: its answer cut after a random word."""
    words = turn.answer.split()
    return replace(turn, answer=" ".join(words[: rng.randint(1, max(1, len(words) - 1))]), stopped=True)


HELD_OUT_PAIRS = 400


def held_out_pairs(seed: int, count: int = HELD_OUT_PAIRS) -> set:
    """Arithmetic questions never shown in training, for the evaluation."""
    rng = random.Random(seed + 1)
    pairs = set()
    while len(pairs) < count:
        pairs.add(_pair(rng))
    return pairs


def _pair(rng: random.Random, largest: int = 99) -> tuple:
    op = rng.choice(("plus", "minus"))
    a, b = rng.randint(0, largest), rng.randint(0, largest)
    if op == "minus" and a < b:
        a, b = b, a
    return (op, a, b)
