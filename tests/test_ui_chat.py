"""The chat logic under the Gradio app: prompts from messages (prompting/), upload checks, per-session cancel flags,
and an engine's stream read on a thread of its own (engine/threaded.py)."""

import asyncio
import time

import pytest
from PIL import Image

from local_chat.engine.interface import session_key
from local_chat.engine.threaded import in_own_thread
from local_chat.errors import UserError
from local_chat.prompting import history_pairs, merged_roles, open_upload
from local_chat.templates.multi_turn import default_conversation
from local_chat.ui.chat import Cancels


def test_history_pairs_read_gradio_messages_in_every_shape():
    history = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": [{"type": "text", "text": "A1"}]},
        {"role": "user", "content": {"text": "Q2"}},
    ]
    assert history_pairs(history) == [["Q1", "A1"], ["Q2", ""]]


def test_chat_prompt_is_the_template_prompt(byte_model):
    from local_chat.prompting import chat_prompt

    chat = chat_prompt(
        byte_model.engine,
        "default",
        None,
        [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}],
        "Q2",
    )
    conv = default_conversation()
    conv.load_qas([["Q1", "A1"], ["Q2", None]])
    assert chat.text == conv.get_prompt() and chat.stop_symbols == ["\n###"] and chat.dropped_turns == 0


def test_chat_prompt_takes_the_system_prompt_from_the_argument_else_the_history(byte_model):
    from local_chat.prompting import chat_prompt

    def system_of(system, history):
        return chat_prompt(byte_model.engine, "default", system, history, "Q").text.split("\n\n###")[0]

    in_history = [{"role": "system", "content": "From history."}]
    assert system_of(None, []) == default_conversation().system
    assert system_of(None, in_history) == "From history."
    assert system_of("From the argument.", in_history) == "From the argument."
    assert system_of("", in_history) == ""


def test_upload_checks_happen_before_decoding(tmp_path, monkeypatch):
    big = tmp_path / "big.png"
    Image.new("RGB", (7000, 7000), (250, 250, 250)).save(big)  # 49 megapixels, a small file
    decoded = []
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(1))
    with pytest.raises(UserError, match="megapixels"):
        open_upload(big)
    assert not decoded, "the image was decoded before its size was checked"


def test_upload_is_shrunk_and_bad_files_are_one_sentence(tmp_path):
    photo = tmp_path / "photo.jpg"
    Image.new("RGB", (3000, 1500), (10, 200, 30)).save(photo)
    assert open_upload(photo, max_side=1024).size == (1024, 512)
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(UserError, match="not an image this app can read"):
        open_upload(text)


def test_cancel_flags_are_per_session():
    cancels = Cancels()
    alice, bob = cancels.fresh("alice"), cancels.fresh("bob")
    cancels.cancel("alice")
    assert alice.is_set() and not bob.is_set()
    newer = cancels.fresh("bob")  # a new answer in the same session cancels the one before
    assert bob.is_set() and not newer.is_set()


def test_tabs_of_one_session_stop_alone_and_a_closed_page_stops_them_all():
    cancels = Cancels()
    keys = [session_key(*pair) for pair in (("s1", "chat"), ("s1", "chat_single"), ("s1", "single"), ("s2", "chat"))]
    chat, vision, single, other = (cancels.fresh(k) for k in keys)
    cancels.fresh(keys[1])  # a message sent in the other chat tab leaves the chat tab's answer alone
    assert vision.is_set() and not chat.is_set()
    cancels.cancel_session("s1")  # the page closed
    assert chat.is_set() and single.is_set() and not other.is_set()


def test_consecutive_messages_of_one_role_merge_into_one_turn():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    merged = merged_roles(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [image]},
            {"role": "user", "content": "What is it?"},
            {"role": "assistant", "content": "A circle."},
        ]
    )
    assert [m["role"] for m in merged] == ["system", "user", "assistant"]
    assert merged[1]["content"] == [image, {"type": "text", "text": "What is it?"}]
    with pytest.raises(UserError, match="role 'wizard'"):
        merged_roles([{"role": "wizard", "content": "hi"}])


def _stream_of(texts, then=None, pause=0.0):
    """A stream of items; `then` is raised after them."""
    for text in texts:
        time.sleep(pause)
        yield text
    if then is not None:
        raise then


def _collect(items, update_interval):
    async def consume():
        return [batch async for batch in in_own_thread(items, update_interval=update_interval)]

    return asyncio.run(consume())


def test_batches_hold_what_was_made_in_between_and_lose_none():
    texts = [f"word{i}" for i in range(2000)]
    batches = _collect(_stream_of(texts), update_interval=0.05)
    assert [item for batch in batches for item in batch] == texts  # every item, in order
    assert len(batches) < len(texts) / 10  # 2,000 items made far faster than one batch per 50 ms


def test_each_item_is_sent_when_the_consumer_keeps_up_and_errors_still_reach_it():
    slow = _collect(_stream_of(["a", "b", "c"], pause=0.05), update_interval=0.01)
    assert slow == [["a"], ["b"], ["c"]]
    with pytest.raises(RuntimeError, match="boom"):
        _collect(_stream_of(["a", "b"], then=RuntimeError("boom")), update_interval=0.05)
