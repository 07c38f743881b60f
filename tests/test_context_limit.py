"""The context limit: the oldest turns of a long conversation are left out whole, the system prompt and the image
stay, the user is told, and a message that cannot fit is one sentence (on the demo model with a 256-token context)."""

import random

import pytest

from demo_model import data as demo_data
from fixtures.app_server import answer_of, submit
from local_chat.defaults import DEMO_MODEL
from local_chat.errors import UserError
from local_chat.model.meta import MetaModel
from local_chat.prompting import chat_prompt, history_pairs
from local_chat.templates.multi_turn import get_conversation
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_tab import ChatTab
from local_chat.ui.history import SavedChats
from local_chat.ui.turns import DROPPED_TITLE, ERROR_MARK, is_note, kind_of

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")

CONTEXT = 256
ANSWER = 64
COUNTRIES = {
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
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Chile": "Santiago",
}


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL), max_seq_len=CONTEXT)


def converse(model, questions, image=None):
    """Ask `questions` in one session; yields (chat prompt, last piece) per turn."""
    history = []
    for question in questions:
        chat = chat_prompt(model.engine, "default", None, history, question, ANSWER, image)
        *_, last = model.stream_generate(
            chat.text, image=image, max_gen_len=ANSWER, additional_stop_symbols=chat.stop_symbols, session="s"
        )
        yield chat, last
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": last["text"].strip()}]


def test_oldest_turns_drop_in_blocks_and_answers_stay_right(demo):
    questions = [f"What is the capital of {country}?" for country in COUNTRIES]
    turns = list(converse(demo, questions))
    dropped = [chat.dropped_turns for chat, _ in turns]
    assert dropped == sorted(dropped) and dropped[-1] > 0
    for (chat, last), (country, capital) in zip(turns, COUNTRIES.items()):
        assert last["text"].strip() == f"The capital of {country} is {capital}."
        assert last["prompt_tokens"] + ANSWER <= CONTEXT
        # What the model saw is the template's own rendering of the turns it kept: system prompt first, whole turns.
        index = questions.index(f"What is the capital of {country}?")
        conv = get_conversation("default")
        past = [[q, f"The capital of {c} is {COUNTRIES[c]}."] for q, c in zip(questions[:index], COUNTRIES)]
        conv.load_qas(past[chat.dropped_turns :] + [[questions[index], None]])
        assert chat.text == conv.get_prompt() and chat.text.startswith(conv.system)
    # Turns are dropped a block at a time: the turns in between keep their cache and prefill only the new message.
    cuts = [i for i in range(1, len(turns)) if dropped[i] != dropped[i - 1]]
    assert 0 < len(cuts) <= len(turns) // 3
    for i, (_, last) in enumerate(turns[1:], start=1):
        if i not in cuts:
            assert last["prompt_tokens"] - last["cached_tokens"] <= 25


def test_the_image_stays_when_turns_drop():
    model = MetaModel.from_pretrained(str(DEMO_MODEL), with_visual=True, max_seq_len=CONTEXT)
    image, _ = demo_data.shapes_image(random.Random(3), 1)
    image_tokens = model.engine.prompt_length("Hi", image) - model.engine.prompt_length("Hi")
    questions = [f"What is the capital of {country}?" for country in COUNTRIES]
    turns = list(converse(model, questions, image))
    assert turns[-1][0].dropped_turns > 0
    for chat, last in turns:
        assert last["prompt_tokens"] == model.engine.prompt_length(
            chat.text, image
        )  # the image tokens are in the prompt
        assert last["prompt_tokens"] + ANSWER <= CONTEXT and image_tokens > 10


def test_a_message_longer_than_the_context_is_one_sentence(demo):
    with pytest.raises(
        UserError,
        match=rf"This message needs \d+ tokens .* the model's context holds {CONTEXT}; "
        "shorten it",
    ):
        chat_prompt(demo.engine, "default", None, [], "word " * 300, ANSWER)


def test_an_answer_longer_than_half_the_context_keeps_the_history(demo):
    """A user who asks for answers as long as the context still gets a conversation: history keeps half of it."""
    history = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ]
    assert (
        chat_prompt(demo.engine, "default", None, history, "What is the capital of Peru?", CONTEXT).dropped_turns == 0
    )


def run_submit(tab, message, history):
    return submit(tab, message, history, max_gen_len=ANSWER)


def test_the_chat_says_once_that_old_turns_were_left_out_and_keeps_a_message_too_long(demo):
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None))
    history = []
    for country in COUNTRIES:
        history, *_ = run_submit(tab, f"What is the capital of {country}?", history)
        assert answer_of(history) == f"The capital of {country} is {COUNTRIES[country]}."
    notices = [m for m in history if kind_of(m) == "notice" and m["metadata"]["title"] == DROPPED_TITLE]
    assert (
        notices
        and "no longer sees the" in notices[0]["content"]
        and f"{CONTEXT}-token context" in notices[0]["content"]
    )
    assert len({n["content"] for n in notices}) == len(notices)  # each cut is told once, not at every turn
    assert [q for q, _ in history_pairs([m for m in history if not is_note(m)])] == [
        f"What is the capital of {c}?" for c in COUNTRIES
    ]  # the notes never reach the model as answers

    long_message = "word " * 300
    after, box, *_ = run_submit(tab, long_message, history)
    assert box["text"] == long_message  # what the user typed stays in the message box
    assert after[-1]["content"].startswith(ERROR_MARK + "This message needs")
    after, *_ = run_submit(tab, "What is the capital of Chile?", after)
    assert answer_of(after) == "The capital of Chile is Santiago."
