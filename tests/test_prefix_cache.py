"""KV caches kept between turns: the same answers as without them, only the new tokens prefilled, memory bounded."""

import random
import threading

import pytest
from transformers import DynamicCache

from demo_model import data as demo_data
from local_chat.defaults import DEMO_MODEL
from local_chat.engine.interface import session_key
from local_chat.model.meta import MetaModel
from local_chat.model.prefix_cache import CachedPrefix, PrefixCaches
from local_chat.prompting import chat_prompt

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")

QUESTIONS = [
    "What is 23 plus 45?",
    "Add 10 to that.",
    "What is the capital of France?",
    "Who are you?",
    "What is 50 minus 7?",
    "What is the capital of Japan?",
    "Tell me a joke.",
    "What can you do?",
    "What is 3 plus 4?",
    "What is the capital of Peru?",
]


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL))


@pytest.fixture(scope="module", params=["eager", "compiled"])
def chat_model(request, demo):
    """The demo model as it decodes by default, and with --compile (a session's keys and values are copied into
    the pooled static cache for a turn and back out after it)."""
    return demo if request.param == "eager" else MetaModel.from_pretrained(str(DEMO_MODEL), compile=True)


def answer(model, history, question, session=None, image=None, cancel_after=None):
    """The last piece of the answer to `question` after `history`, as the chat tab asks for it."""
    chat = chat_prompt(model.engine, "default", None, history, question, answer_tokens=64, image=image)
    cancel = threading.Event()
    pieces = []
    for piece in model.stream_generate(
        chat.text,
        image=image,
        max_gen_len=64,
        additional_stop_symbols=chat.stop_symbols,
        session=session,
        cancel=cancel,
    ):
        pieces.append(piece)
        if cancel_after is not None and len(pieces) == cancel_after:
            cancel.set()
    return pieces[-1]


def turn(history, question, text):
    return history + [{"role": "user", "content": question}, {"role": "assistant", "content": text.strip()}]


@pytest.mark.parametrize("with_image", [False, True])
def test_ten_turns_answer_alike_and_prefill_only_the_new_message(chat_model, with_image):
    image = demo_data.shapes_image(random.Random(1), 2)[0] if with_image else None
    history = []
    for number, question in enumerate(QUESTIONS):
        reused = answer(chat_model, history, question, session="ten", image=image)
        fresh = answer(chat_model, history, question, image=image)
        assert reused["text"] == fresh["text"], f"turn {number + 1}: {question}"
        prefilled = reused["prompt_tokens"] - reused["cached_tokens"]
        if number == 0:
            assert reused["cached_tokens"] == 0
        else:  # the new message and the template's markers around it, not the history
            assert prefilled <= len(chat_model.tokenizer.encode(question, bos=False)) + 12, f"turn {number + 1}"
        history = turn(history, question, reused["text"])


def test_regenerate_undo_edit_and_stop_answer_as_without_reuse(chat_model):
    history = []
    for question in QUESTIONS[:3]:
        history = turn(history, question, answer(chat_model, history, question, session="branch")["text"])
    branches = [
        (history[:-2], QUESTIONS[2]),  # regenerate the last answer
        (history[:-2], "What is the capital of Chile?"),  # undo it, ask something else
        (history[:2], "What is 12 plus 30?"),  # edit the second message: later turns dropped
        (history, "What is the capital of Egypt?"),  # back on the long branch
    ]
    for past, question in branches:
        reused = answer(chat_model, past, question, session="branch")
        assert reused["text"] == answer(chat_model, past, question)["text"]
    stopped = answer(chat_model, history, "Who are you?", session="branch", cancel_after=3)
    assert stopped["finish_reason"] == "cancelled"
    after_stop = turn(history, "Who are you?", stopped["text"])
    assert (
        answer(chat_model, after_stop, "What is 5 plus 6?", session="branch")["text"]
        == answer(chat_model, after_stop, "What is 5 plus 6?")["text"]
    )


def test_a_new_image_is_never_answered_from_the_old_ones_cache(chat_model):
    first, second = (demo_data.shapes_image(random.Random(seed), 1)[0] for seed in (2, 3))
    answer(chat_model, [], "What is in the image?", session="images", image=first)
    again = answer(chat_model, [], "What is in the image?", session="images", image=second)
    assert again["cached_tokens"] <= 1  # at most BOS: every image token runs again with the new pixels
    assert again["text"] == answer(chat_model, [], "What is in the image?", image=second)["text"]


def test_least_recently_used_sessions_are_dropped_and_just_prefill_again(demo):
    saved = demo.engine.sessions.store
    try:
        demo.engine.sessions.store = PrefixCaches(max_sessions=2)
        for session in ("a", "b", "c"):
            answer(demo, [], "What is the capital of Spain?", session=session)
        assert "a" not in demo.engine.sessions.store and len(demo.engine.sessions.store) == 2
        history = turn([], "What is the capital of Spain?", "The capital of Spain is Madrid.")
        kept = answer(demo, history, "What is 2 plus 2?", session="b")
        evicted = answer(demo, history, "What is 2 plus 2?", session="a")
        assert evicted["cached_tokens"] == 0 and kept["cached_tokens"] > 0
        assert evicted["text"] == kept["text"]

        demo.engine.sessions.store = PrefixCaches(max_sessions=8)
        answer(demo, [], "What is the capital of Spain?", session="d")
        one = demo.engine.sessions.store.nbytes()
        demo.engine.sessions.store.max_bytes = int(2.5 * one)
        for session in "efgh":
            answer(demo, [], "What is the capital of Spain?", session=session)
            assert demo.engine.sessions.store.nbytes() <= 2.5 * one
        assert len(demo.engine.sessions.store) == 2
        demo.engine.sessions.store.drop("g")  # a closed tab forgets its conversations
        assert "g" not in demo.engine.sessions.store and len(demo.engine.sessions.store) == 1
    finally:
        demo.engine.sessions.store = saved


def test_a_closed_browser_session_forgets_its_doors_and_no_other_sessions():
    """One key per door of a browser session (session_key), matched one way by the caches and the Stop events: a
    session whose id starts with the closed one's is another session."""
    from local_chat.ui.chat import Cancels

    caches, cancels = PrefixCaches(max_sessions=8), Cancels()
    keys = [session_key(browser, door) for browser in ("ab", "abc") for door in ("chat", "api")]
    events = {key: cancels.fresh(key) for key in keys}
    for key in keys:
        caches.put(key, CachedPrefix([1, 2], DynamicCache()))
    caches.drop("ab")
    cancels.cancel_session("ab")
    assert [key in caches for key in keys] == [False, False, True, True]
    assert [events[key].is_set() for key in keys] == [True, True, False, False]


def test_a_pool_hands_out_members_and_takes_the_one_sharing_the_longest_start():
    """The /v1 API's pool: a new conversation gets a fresh member, a later turn the member whose tokens it extends;
    another pool's members and plain string keys never join it."""
    from local_chat.engine.interface import SessionKey

    caches, pool = PrefixCaches(max_sessions=8), SessionKey("", "v1", pool=True)
    first, nothing = caches.take(pool, [1, 2, 3])
    assert nothing is None and first.member is not None and first != pool
    caches.put(first, CachedPrefix([1, 2, 3], DynamicCache()))
    second, _ = caches.take(pool, [7, 8])
    caches.put(second, CachedPrefix([7, 8], DynamicCache()))
    caches.put(SessionKey("", "other", pool=True, member=99), CachedPrefix([1, 2, 3, 4], DynamicCache()))
    caches.put("v1", CachedPrefix([1, 2, 3, 4], DynamicCache()))
    key, prefix = caches.take(pool, [1, 2, 3, 4, 5])
    assert key == first and prefix.token_ids == [1, 2, 3]
    assert caches.take("v1")[1] is not None  # a plain string is a session of its own (Accessory's session=)
