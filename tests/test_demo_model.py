"""The shipped demo model: its folder, and a fixed sample of what it must know, asked through the public API."""

import json
import random
from pathlib import Path

import pytest

from demo_model import data, evaluation, recipe
from local_chat.model.meta import MetaModel
from local_chat.templates.multi_turn import default_conversation, get_conversation
from local_chat.templates.single_turn import format_prompt

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "assets" / "demo-model"

SEPARATOR = default_conversation().response_end_signal
pytestmark = pytest.mark.skipif(
    not (DEMO / "config.json").exists(),
    reason="assets/demo-model is not built yet: it does not meet its accuracy bars (issue 3)",
)


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO), with_visual=True)


def prompt_of(template, turns, system=None) -> tuple[str, list[str]]:
    """(prompt, stop strings) of the last question of `turns` ([[q, a], ..., [q, None]]); `system`: the
    conversation's system prompt, if not the template's."""
    if template == "alpaca":
        return format_prompt({"instruction": turns[-1][0]}, sys_name="alpaca"), []
    conv = default_conversation()
    conv.system = conv.system if system is None else system
    conv.load_qas(turns)
    return conv.get_prompt(), [SEPARATOR]


def ask(demo, template, turns, image=None, system=None):
    """The answer to the last question of `turns`, streamed as the app does."""
    prompt, stops = prompt_of(template, turns, system)
    pieces = list(demo.stream_generate(prompt, image=image, max_gen_len=64, additional_stop_symbols=stops))
    assert pieces[-1]["finish_reason"] == "stop", f"{turns[-1][0]!r} did not end within 64 tokens"
    return pieces[-1]["text"]


def ask_each(demo, template, questions: list[str], system=None) -> list[str]:
    """The answers to single questions, asked as one batch (Accessory's `generate`: a sample of 60 in seconds)."""
    prompts = [prompt_of(template, [[q, None]], system)[0] for q in questions]
    stops = prompt_of(template, [["", None]])[1]
    answers = demo.generate(prompts, max_gen_len=64, additional_stop_symbols=stops, return_details=True)
    for question, answer in zip(questions, answers):
        assert answer["finish_reason"] == "stop", f"{question!r} did not end within 64 tokens"
    return [answer["text"] for answer in answers]


def asked_in_turns(demo, turns) -> list[str]:
    """The answers to `turns`' questions, the even ones in the alpaca template, the odd ones in the conversation's."""
    answers = [None] * len(turns)
    for first, template in enumerate(("alpaca", "conversation")):
        mine = list(range(first, len(turns), 2))
        for i, answer in zip(mine, ask_each(demo, template, [turns[i].question for i in mine])):
            answers[i] = answer
    return answers


def test_folder_is_a_small_llava_with_long_context_and_even_heads():
    config = json.loads((DEMO / "config.json").read_text())
    assert config["model_type"] == "llava"
    assert config["text_config"]["max_position_embeddings"] >= 2048
    assert (
        config["text_config"]["num_attention_heads"] % 2 == 0
        and config["vision_config"]["num_attention_heads"] % 2 == 0
    )
    assert sum(f.stat().st_size for f in DEMO.glob("*.safetensors")) <= 25_000_000
    assert (DEMO / "README.md").read_text().count("--pretrained_path") >= 1


def test_chat_template_renders_the_default_conversation(demo):
    conv = default_conversation()
    conv.load_qas([["Q1", "A1"], ["Q2", None]])
    chat = get_conversation("chat_template", demo.tokenizer.hf)
    chat.load_qas([["Q1", "A1"], ["Q2", None]])
    assert chat.get_prompt() == conv.get_prompt()
    assert chat.response_end_signal == SEPARATOR


@pytest.mark.parametrize("template", ["alpaca", "conversation"])
def test_capitals(demo, template):
    rng = random.Random(1234)  # the same sample whichever tests run
    turns = [data.capital_turn(rng) for _ in range(8)]
    right = sum(evaluation.is_correct(t, ask(demo, template, [[t.question, None]])) for t in turns)
    assert right >= 8, f"{right} of 8 right"


def test_arithmetic(demo):
    rng = random.Random(1234)
    # 60 in each template, not 10: a model right 96% of the time got 2 of the first 10 wrong (and 5 of the first 30)
    turns = [data.arithmetic_turn(rng) for _ in range(60)]
    right = {
        template: sum(map(evaluation.is_correct, turns, ask_each(demo, template, [t.question for t in turns])))
        for template in ("alpaca", "conversation")
    }
    assert sum(right.values()) >= 108, f"right of 60: {right}"


def test_sums_typed_with_symbols(demo):
    """What a new user types first: "What is 2+2?", "27 - 8"."""
    assert ask(demo, "conversation", [["What is 2+2?", None]]).strip() == "2 plus 2 is 4."
    rng = random.Random(1234)
    turns = [data.with_symbols(rng, data.arithmetic_turn(rng)) for _ in range(60)]
    right = sum(map(evaluation.is_correct, turns, asked_in_turns(demo, turns)))
    assert right >= 54, f"{right} of 60 right"  # the bar: 90%


def test_sums_it_does_not_do_and_small_talk_are_declined(demo):
    """What new users try next: "What is 3*4?", "12 divided by 4", "Good morning!"."""
    for question in ("What is 3*4?", "What is 12 divided by 4?", "Good morning!", "2 + 3 + 4", "What is 3.5 plus 2?"):
        assert ask(demo, "conversation", [[question, None]]).strip() == data.DONT_KNOW, question
    rng = random.Random(1234)
    turns = [data.decline_turn(rng, recipe.DECLINE_ONE_DIGIT_SHARE) for _ in range(60)]
    declined = sum(answer.strip() == data.DONT_KNOW for answer in asked_in_turns(demo, turns))
    # 58 here (93% in the card, on the same mix), 51 for the model before the one-digit ones were taught
    assert declined >= 54, f"{declined} of 60 declined"


def test_with_the_system_prompt_cleared_or_another_it_still_answers(demo):
    """A user may clear the app's system prompt, or write their own."""
    rng = random.Random(1234)
    turns = [data.capital_turn(rng) for _ in range(10)] + [data.arithmetic_turn(rng) for _ in range(20)]
    for system in ("", "You are a helpful assistant."):
        right = sum(
            map(evaluation.is_correct, turns, ask_each(demo, "conversation", [t.question for t in turns], system))
        )
        # 30 and 30 here; cleared, 22 for the model trained without cleared ones
        assert right >= 27, f"{right} of 30 right with the system prompt {system!r}"


@pytest.mark.parametrize("template", ["alpaca", "conversation"])
def test_who_are_you_and_unknown_questions(demo, template):
    assert "demo model" in ask(demo, template, [["Who are you?", None]])
    assert "--pretrained_path" in ask(demo, template, [["What can you do?", None]])
    assert ask(demo, template, [["Tell me about the weather.", None]]).strip() == data.DONT_KNOW


def test_images_what_color_count(demo):
    rng = random.Random(99)
    right, asked = 0, 0
    for i in range(8):
        image, shapes = data.shapes_image(rng)
        template = ("alpaca", "conversation")[i % 2]
        color, shape = rng.choice(shapes)
        checks = [
            (data.Turn("What is in the image?", "", "image_what", sorted(shapes))),
            (data.Turn(f"What color is the {shape}?", "", "image_color", color)),
            (data.Turn("How many shapes are there?", "", "image_count", len(shapes))),
        ]
        for turn in checks:
            right += evaluation.is_correct(turn, ask(demo, template, [[turn.question, None]], image=image))
            asked += 1
    for i in range(4):  # asked about a shape that is not in the image: "The circle is not in the image."
        absent = evaluation.absent_shape_sample(rng, ("alpaca", "conversation")[i % 2])
        turn = absent.turns[0]
        right += evaluation.is_correct(turn, ask(demo, absent.template, [[turn.question, None]], image=absent.image))
        asked += 1
    assert right >= asked - 2, f"{right} of {asked} right"


def test_deep_conversation_and_follow_up(demo):
    rng = random.Random(7)
    right = 0
    for _ in range(10):
        history = [data.text_turn(rng, None, None) for _ in range(5)]
        question = data.arithmetic_turn(rng)
        first = data.arithmetic_turn(rng)
        follow = data.followup_turn(rng, first.value)
        right += evaluation.is_correct(
            question, ask(demo, "conversation", [[t.question, t.answer] for t in history] + [[question.question, None]])
        )
        right += evaluation.is_correct(
            follow, ask(demo, "conversation", [[first.question, first.answer], [follow.question, None]])
        )
    assert right >= 16, f"{right} of 20 right"  # the bars: 80%


@pytest.mark.parametrize("template", ["chat_template", "default"])
def test_a_second_image_in_a_later_turn_is_the_one_answered(demo, template, tmp_path):
    """Two images in two turns of the page's chat: the demo model's templates have no place for an image in its
    turn (the image goes in front of the prompt, as the model learned it), so the later question gets its own
    image alone, and is answered about it."""
    from fixtures.app_server import answer_of, submit
    from local_chat.ui.chat import Cancels
    from local_chat.ui.chat_tab import ChatTab
    from local_chat.ui.history import SavedChats

    tab = ChatTab(demo.engine, Cancels(), template, "padded_resize", SavedChats(None))
    paths = []
    for seed in (4, 6):  # a purple circle, then a blue one
        image, [(colour, kind)] = data.shapes_image(random.Random(seed), 1)
        paths.append(tmp_path / f"{seed}.png")
        image.save(paths[-1])
    first = submit(tab, "What color is the circle?", image=str(paths[0]), template=template)[0]
    assert answer_of(first) == "The circle is purple."
    second, _, prompt, *_ = submit(tab, "What color is the circle?", first, image=str(paths[1]), template=template)
    assert answer_of(second) == "The circle is blue."
    assert prompt.startswith("<image>\n") and prompt.count("<image>") == 1  # the prompt panel: the later image alone
