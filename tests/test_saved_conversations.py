"""Saved conversations: the SQLite store (history/store.py), the chat's side of it (ui/history.py), and the page in
Chromium: reload, restart, two browsers, two logins, export and import, images reopened, kill -9, Send/Stop, a phone's
screen. Every app here keeps its conversations in a temporary place (conftest.py sets XDG_DATA_HOME)."""

import base64
import functools
import json
import os
import random
import signal
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_browser import ANSWERS, ARTIFACTS, READY, attach, browser, last_bot_text, open_page, send, wait_for_answer  # noqa: F401

from demo_model import data as demo_data
from fixtures.app_server import answer_of, launched, serve, submit
from local_chat.defaults import DEMO_MODEL
from local_chat.engine import End
from local_chat.errors import UserError
from local_chat.history import Store
from local_chat.history import store as store_module
from local_chat.history.store import SCHEMA_VERSION, Changed
from local_chat.launchers import browser as launchers
from local_chat.launchers.loading import free_port
from local_chat.model.meta import MetaModel
from local_chat.prompting import png_bytes
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_tab import ChatTab, edited_question
from local_chat.ui.history import SavedChats

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")


@pytest.fixture(scope="module")
def demo():
    # one token per forward pass: serve()'s delay paces the answers, and Stop counts passes (no guessed runs)
    return MetaModel.from_pretrained(str(DEMO_MODEL), speculative="off")


def chat_turn(tab: ChatTab, message, history, conversation, browser_id, session="s", username=None):
    """One Send through the chat's handler: its last (history, box, prompt, conversation, list)."""
    return submit(tab, message, history, None, conversation, browser_id, session, username)


# ----- the store -----


def test_conversations_round_trip_and_an_image_is_kept_once(tmp_path):
    store = Store(tmp_path / "chats.db")
    png = png_bytes(demo_data.shapes_image(random.Random(1), 1)[0])
    first, again = store.put_image(png), store.put_image(png)
    assert first == again and len(list(store.images.iterdir())) == 1  # never a second copy of the same bytes
    messages = [{"role": "user", "content": [{"type": "image", "sha256": first}, {"type": "text", "text": "Hi"}]}]
    older = store.save("alice", None, [{"role": "user", "content": "What is 2 plus 2?"}]).id
    newer = store.save("alice", None, messages).id
    assert store.titles("alice") == [("Hi", newer), ("What is 2 plus 2?", older)]  # newest first
    store.save(
        "alice", older, [{"role": "user", "content": "What is 2 plus 2?"}, {"role": "assistant", "content": "4"}]
    )
    assert [c for _, c in store.titles("alice")] == [older, newer]  # continuing a conversation moves it up
    store.rename("alice", older, "  Sums  ")
    assert store.get("alice", older).title == "Sums"
    store.delete("alice", older)
    assert store.titles("alice") == [("Hi", newer)]
    store.close()
    reopened = Store(tmp_path / "chats.db")  # a restart: the same conversations, the same browser secrets
    assert reopened.get("alice", newer).messages == messages and reopened.keys == store.keys
    reopened.close()


def test_an_owner_never_reaches_another_owners_conversation(tmp_path):
    store = Store(tmp_path / "chats.db")
    alices = store.save("user:alice", None, [{"role": "user", "content": "secret"}]).id
    for action in (
        lambda: store.get("user:bob", alices),
        lambda: store.rename("user:bob", alices, "mine"),
        lambda: store.delete("user:bob", alices),
        lambda: store.save("user:bob", alices, [{"role": "user", "content": "overwritten"}]),
    ):
        with pytest.raises(UserError, match="no such conversation among yours"):
            action()
    assert store.titles("user:bob") == [] and store.get("user:alice", alices).messages[0]["content"] == "secret"
    digest = store.put_image(png_bytes(demo_data.shapes_image(random.Random(2), 1)[0]))
    store.save("user:alice", alices, [{"role": "user", "content": [{"type": "image", "sha256": digest}]}])
    signed = store.image_signature("user:alice", alices, digest)
    assert store.image_for_owner_of(alices, digest, signed) is not None
    assert store.image_for_owner_of(alices, digest, store.image_signature("user:bob", alices, digest)) is None
    store.close()


def test_a_database_that_cannot_be_used_is_one_sentence_and_left_alone(tmp_path):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    with pytest.raises(UserError, match="cannot be read .* damaged or not a database. It was left as it is"):
        Store(corrupt)
    assert corrupt.read_bytes() == b"this is not a database" * 100

    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(UserError, match="written by a newer version of this app"):
        Store(newer)

    locked = tmp_path / "locked.db"
    Store(locked).close()
    holder = sqlite3.connect(locked, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(UserError, match="locked by another program"):
            Store(locked)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


V2_SQL = Path(__file__).resolve().parent / "data" / "conversations-v2.sql"  # a database the app wrote at schema 2
V2_OWNER = "browser:" + "b" * 32
HI = [{"role": "user", "content": "Hi"}]
HI_AND_HELLO = HI + [{"role": "assistant", "content": "Hello!"}]


def test_two_apps_share_one_database_and_a_stale_save_is_refused(tmp_path):
    one, two = Store(tmp_path / "chats.db"), Store(tmp_path / "chats.db")  # two apps: no lock between them
    saved = one.save("alice", None, HI)
    assert saved.revision == 0 and two.get("alice", saved.id).revision == 0
    assert one.save("alice", saved.id, HI_AND_HELLO, read=0).revision == 1
    with pytest.raises(Changed, match="changed in another window; reload it"):
        two.save("alice", saved.id, HI + [{"role": "assistant", "content": "Overwritten?"}], read=0)
    assert two.get("alice", saved.id).messages == HI_AND_HELLO  # not overwritten
    reread = two.get("alice", saved.id).revision  # a reload reads it again, and saves
    assert two.save("alice", saved.id, HI_AND_HELLO + HI, read=reread).revision == 2
    assert one.titles("alice") == [("Hi", saved.id)]
    one.close(), two.close()


def test_a_version_2_database_is_upgraded_once_by_two_apps_starting_together(tmp_path, monkeypatch):
    path = tmp_path / "conversations.db"
    with sqlite3.connect(path) as db:
        db.executescript(V2_SQL.read_text())
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 2
    with ThreadPoolExecutor(2) as pool:
        stores = list(pool.map(lambda _: Store(path), range(2)))
    found = stores[0].get(V2_OWNER, "conversation-two")
    assert found.revision == 0 and found.options == {"thinking": False} and found.messages[1]["content"] == "It is 4."
    assert stores[1].save(V2_OWNER, found.id, found.messages + HI, read=0).revision == 1
    for store in stores:
        store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [row[1] for row in db.execute("PRAGMA table_info(conversations)")].count("revision") == 1
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 2)  # the app before this schema
    with pytest.raises(UserError, match="was written by a newer version of this app"):
        Store(path)


V3_SQL = Path(__file__).resolve().parent / "data" / "conversations-v3.sql"  # a database the app wrote at schema 3


def test_a_version_3_database_is_upgraded_and_its_answers_then_name_their_models(tmp_path, monkeypatch):
    path = tmp_path / "conversations.db"
    with sqlite3.connect(path) as db:
        db.executescript(V3_SQL.read_text())
    store, owner = Store(path), "browser:" + "c" * 32
    found = store.get(owner, "conversation-three")
    assert found.model is None and found.messages[1]["content"] == "The capital of France is Paris."
    answered = [*found.messages, *HI, {"role": "assistant", "content": "Hello!", "model": "tiny-qwen"}]
    store.save(owner, found.id, answered, read=found.revision)
    assert store.get(owner, found.id).model == "tiny-qwen" and store.get(owner, found.id).messages == answered
    store.close()
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 3)  # the app before this schema: it would drop the models
    with pytest.raises(UserError, match="was written by a newer version of this app"):
        Store(path)


def test_a_page_that_read_an_older_revision_is_told_to_reload_and_keeps_its_turn(demo, tmp_path):
    saved = SavedChats(Store(tmp_path / "chats.db"))
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", saved)
    browser_id = saved.browser_id(None)
    first, _, _, conversation, _ = chat_turn(tab, "What is the capital of France?", [], None, browser_id, "A")
    owner = saved.owner(browser_id, SimpleNamespace(username=None))
    shown = saved.shown(owner, conversation, saved.opened("B", owner, conversation).messages)  # another window
    chat_turn(tab, "What is 23 plus 45?", first, conversation, browser_id, "A")  # the first window goes on
    stale, *_ = chat_turn(tab, "What is the capital of Peru?", shown, conversation, browser_id, "B")
    assert "changed in another window; reload it" in stale[-1]["content"]
    assert any("Peru" in str(entry["content"]) for entry in stale)  # the question stays on its page
    kept = saved.store.get(owner, conversation).messages
    assert "23 plus 45" in str(kept) and "Peru" not in str(kept)
    reopened = saved.shown(owner, conversation, saved.opened("B", owner, conversation).messages)  # a reload
    again, *_ = chat_turn(tab, "What is the capital of Peru?", reopened, conversation, browser_id, "B")
    assert again[-2]["content"].endswith("Lima.") and "Lima." in str(saved.store.get(owner, conversation).messages)


def test_a_launcher_refuses_a_corrupt_database_before_loading_the_model(tmp_path, capsys):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"garbage" * 100)
    with pytest.raises(SystemExit) as ended:
        launchers.app(["--history_db", str(corrupt)])
    assert ended.value.code == 1 and "damaged or not a database" in capsys.readouterr().err


# ----- the chat's side -----


def test_eight_sessions_at_once_lose_no_turn(demo, tmp_path):
    store = Store(tmp_path / "chats.db")
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(store))
    browsers = [SavedChats.browser_id(None) for _ in range(8)]
    countries = ["France", "Japan", "Peru", "Kenya", "Spain", "Italy", "Chile", "Egypt"]

    def conversation(number: int) -> str:
        history, conversation = [], None
        for turn in range(3):
            question = f"What is the capital of {countries[(number + turn) % 8]}?"
            history, _, _, conversation, _ = chat_turn(
                tab, question, history, conversation, browsers[number], str(number)
            )
        return conversation

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(conversation, range(8)))
    for number, conversation_id in enumerate(ids):
        saved = store.get("browser:" + browsers[number], conversation_id).messages
        questions = [m["content"] for m in saved if m["role"] == "user"]
        assert questions == [f"What is the capital of {countries[(number + t) % 8]}?" for t in range(3)]
        answers = [m["content"] for m in saved if m["role"] == "assistant" and not m.get("metadata")]
        assert len(answers) == 3 and all(a.startswith("The capital of") for a in answers)
    store.close()


def test_export_and_import_round_trip_with_images(demo, tmp_path):
    store = Store(tmp_path / "chats.db")
    saved = SavedChats(store)
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", saved)
    me = SavedChats.browser_id(None)
    image, [(colour, kind)] = demo_data.shapes_image(random.Random(4), 1)
    path = tmp_path / "shape.png"
    image.save(path)
    box = {"text": f"What color is the {kind}?", "files": [str(path)]}
    history, _, _, conversation, _ = chat_turn(tab, box, [], None, me)
    assert answer_of(history) == f"The {kind} is {colour}."
    owner = "browser:" + me
    exported = json.loads(open(saved.exports.export(owner, conversation, "json")).read())
    user = exported["messages"][0]
    assert user["role"] == "user" and user["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    markdown = open(saved.exports.export(owner, conversation, "md")).read()
    assert "## User\n\n![image](data:image/png;base64," in markdown and f"The {kind} is {colour}." in markdown
    file = tmp_path / "export.json"
    file.write_text(json.dumps(exported))
    imported = saved.exports.import_file(owner, str(file))
    before, after = store.get(owner, conversation), store.get(owner, imported)

    def strip(messages):  # figures are not exported, and a Markdown file holds no node ids (history/tree.py)
        return [{k: v for k, v in m.items() if k not in ("node", "reply")} for m in messages if not m.get("metadata")]

    assert strip(after.messages) == strip(before.messages) and after.title == before.title  # the same image digest
    assert len(list(store.images.iterdir())) == 1
    file = tmp_path / "export.md"
    file.write_text(markdown)
    from_markdown = store.get(owner, saved.exports.import_file(owner, str(file)))  # its image an image again, not text
    assert strip(from_markdown.messages) == strip(before.messages) and from_markdown.title == before.title
    reopened_md = saved.shown(owner, from_markdown.id, from_markdown.messages)
    again, *_ = chat_turn(tab, f"What color is the {kind}?", reopened_md, from_markdown.id, me)
    assert answer_of(again) == f"The {kind} is {colour}."  # the model sees the image, not its base64
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"messages": [{"role": "user", "content": "x" * int(2e6)}]}))
    with pytest.raises(UserError, match="import one under"):
        SavedChats(store, max_upload_mb=0.1).exports.import_file(owner, str(huge))
    store.close()


def test_each_answers_model_is_kept_in_exports_and_imports(tmp_path):
    store = Store(tmp_path / "chats.db")
    saved, owner = SavedChats(store), "user:alice"
    answered = [*HI, {"role": "assistant", "content": "Hello!", "model": "demo"}]
    answered += [{"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hi.", "model": "tiny-qwen"}]
    conversation = store.save(owner, None, answered).id
    exported = json.loads(open(saved.exports.export(owner, conversation, "json")).read())
    assert [m.get("model") for m in exported["messages"]] == [None, "demo", None, "tiny-qwen"]
    markdown = open(saved.exports.export(owner, conversation, "md")).read()
    assert "## Assistant · demo\n\nHello!" in markdown and "## Assistant · tiny-qwen\n\nHi." in markdown
    for kind, text in (("json", json.dumps(exported)), ("md", markdown)):
        file = tmp_path / f"export.{kind}"
        file.write_text(text)
        imported = store.get(owner, saved.exports.import_file(owner, str(file)))
        ids = ("node", "reply") if kind == "md" else ()  # a Markdown file holds no node ids (history/tree.py)
        unnamed = [[{k: v for k, v in m.items() if k not in ids} for m in ms] for ms in (imported.messages, answered)]
        assert unnamed[0] == unnamed[1] and imported.model == "tiny-qwen", kind
    store.close()


def test_a_request_naming_another_owners_conversation_is_refused(demo, tmp_path):
    store = Store(tmp_path / "chats.db")
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(store))
    history, _, _, alices, _ = chat_turn(tab, "What is the capital of Peru?", [], None, None, username="alice")
    shown, conversation, title, note, _ = tab.sidebar.open(
        alices, None, SimpleNamespace(session_hash="b", username="bob")
    )
    assert "no such conversation among yours" in note and conversation is not None  # nothing opened (a skip)
    history, *_ = chat_turn(tab, "Mine now?", history, alices, None, session="b", username="bob")
    assert "no such conversation among yours" in history[-1]["content"]
    assert "Mine now?" not in str(store.get("user:alice", alices).messages)
    store.close()


class Recording:
    """An engine whose answers' last events are kept (`ends`)."""

    def __init__(self, engine):
        self.engine, self.ends = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, request):
        for event in self.engine.stream(request):
            if isinstance(event, End):
                self.ends.append(event)
            yield event


def test_reopening_a_conversation_rebuilds_its_cache_once_then_reuses_it(demo, tmp_path):
    store = Store(tmp_path / "chats.db")
    engine = Recording(demo.engine)
    tab = ChatTab(engine, Cancels(), "default", "padded_resize", SavedChats(store))
    me = SavedChats.browser_id(None)
    _, _, _, conversation, _ = chat_turn(tab, "What is the capital of Peru?", [], None, me, session="one")
    reopened, conversation, _, _, prompt = tab.sidebar.open(
        conversation, me, SimpleNamespace(session_hash="two", username=None)
    )
    assert prompt.endswith("### Human: What is the capital of Peru?\n### Assistant:")  # its last, for the panel
    assert "Lima" in str(reopened)
    engine.ends.clear()
    for question in ("What is the capital of Spain?", "What is the capital of Kenya?"):
        reopened, *_ = chat_turn(tab, question, reopened, conversation, me, session="two")
        assert answer_of(reopened).startswith("The capital of")
    rebuilt, reused = engine.ends
    assert rebuilt.cached_tokens == 0  # another page: the conversation's keys and values computed once
    assert reused.cached_tokens >= rebuilt.prompt_tokens  # then kept: the next turn computes only what is new
    store.close()


def test_a_refused_message_is_not_the_conversations_title(demo, tmp_path):
    store = Store(tmp_path / "chats.db")
    saved = SavedChats(store)
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", saved)
    me = saved.browser_id(None)
    history, _, _, conversation, _ = chat_turn(tab, "word " * 20_000, [], None, me)  # too long for the model
    assert "but the model's context holds 2048" in history[-1]["content"]
    assert store.titles("browser:" + me) == [("New chat", conversation)]
    chat_turn(tab, "What is the capital of Peru?", history, conversation, me)
    assert store.titles("browser:" + me) == [("What is the capital of Peru?", conversation)]
    store.rename("browser:" + me, conversation, "Capitals")
    chat_turn(tab, "What is the capital of Japan?", history, conversation, me)
    assert store.titles("browser:" + me) == [("Capitals", conversation)]  # a title the user gave stays
    store.close()


def roles(messages: list[dict]) -> list[str]:
    """The saved conversation's turns: "user" and "assistant" of its questions and answers (notes left out)."""
    return [m["role"] for m in messages if m.get("kind") not in ("stats", "stopped", "notice")]


def test_an_edit_cut_before_its_answer_keeps_the_conversation_and_a_cut_answer_is_kept(demo, tmp_path):
    """An edit (or a regeneration) is saved only with its answer: cut before one comes (a closed tab), the
    conversation keeps its earlier turns; cut in its middle, it is saved as far as it went, marked stopped."""
    import asyncio

    from local_chat.ui.chat_tab import ChatSettings

    store = Store(tmp_path / "chats.db")
    saved = SavedChats(store)
    tab = ChatTab(demo.engine, Cancels(), "default", "auto", saved)
    browser_id = saved.browser_id(None)
    history, _, _, conversation, _ = chat_turn(tab, "What is the capital of Japan?", [], None, browser_id)
    owner = only_owner(store)
    before = store.get(owner, conversation).messages
    settings = ChatSettings(conversation, browser_id, "default", None, "auto", 64, 0.0, 1.0, 0, 1.0)
    edit = SimpleNamespace(index=0, value="What is the capital of Spain?")
    request = SimpleNamespace(session_hash="s", username=None)

    async def cut_after(pieces: int) -> None:
        updates = tab.edit(request, edit, history, settings)
        for _ in range(pieces):
            await anext(updates)
        await updates.aclose()  # the tab closed: Gradio closes the handler

    asyncio.run(cut_after(1))  # before any of its answer
    assert store.get(owner, conversation).messages == before
    asyncio.run(cut_after(3))  # in the middle of it
    messages = store.get(owner, conversation).messages
    assert messages[0]["content"] == "What is the capital of Spain?" and roles(messages) == ["user", "assistant"]
    assert messages[-1]["kind"] == "stopped"
    store.close()


def reopened(db) -> Store:
    """The store of a killed app, once its last process has ended (and so released the database)."""
    deadline = time.time() + 30
    while True:
        try:
            return Store(db)
        except UserError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def only_owner(store: Store) -> str:
    [(owner,)] = store._db.execute("SELECT DISTINCT owner FROM conversations").fetchall()
    return owner


# ----- the page -----


def chat_list(page) -> list[str]:
    return page.locator(".chat-list label").all_inner_texts()


def test_a_message_typed_while_the_page_loads_waits_for_its_id_and_is_saved(browser, demo, tmp_path, monkeypatch):  # noqa: F811
    """A slow first load (a busy server): the message box takes text only once the page has its browser id, so
    the first message is saved, not refused with "no browser id yet"."""
    from local_chat.ui.conversations import Sidebar

    first_load = Sidebar.first_load

    @functools.wraps(first_load)  # its signature: Gradio passes the request to it
    def slow_first_load(self, *args, **kwargs):
        time.sleep(2)
        return first_load(self, *args, **kwargs)

    monkeypatch.setattr(Sidebar, "first_load", slow_first_load)
    with serve(demo, store=Store(tmp_path / "chats.db")) as (url, _):
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(url)
        page.wait_for_selector(".message textarea[disabled]")  # loading: no text taken yet
        send(page, "What is the capital of France?")  # waits for the box, as a user's typing does
        assert wait_for_answer(page, lambda t: t.endswith("Paris.")) == "The capital of France is Paris."
        page.locator(".chat-list label").first.wait_for()
        assert chat_list(page) == ["What is the capital of France?"]


def test_a_first_load_that_fails_still_takes_a_message_and_says_what_to_do(browser, demo, tmp_path, monkeypatch):  # noqa: F811
    from local_chat.ui.conversations import Sidebar

    @functools.wraps(Sidebar.first_load)
    def failing_first_load(self, *args, **kwargs):
        raise RuntimeError("the database could not be read")

    monkeypatch.setattr(Sidebar, "first_load", failing_first_load)
    with serve(demo, store=Store(tmp_path / "chats.db")) as (url, _):
        page = open_page(browser, url)  # its message box takes text
        send(page, "What is the capital of France?")
        assert wait_for_answer(page, lambda t: "reload" in t).endswith("This page has no browser id yet; reload it.")


def test_reload_restart_two_browsers_and_delete(browser, demo, tmp_path):  # noqa: F811
    db, port = tmp_path / "chats.db", free_port()  # a restart keeps its port (the browser's storage is per address)
    alice = browser.new_context(viewport={"width": 1280, "height": 1000}).new_page()
    first = Store(db)
    with serve(demo, store=first, port=port) as (url, _):
        alice.goto(url)
        alice.wait_for_selector(READY)
        send(alice, "What is the capital of France?")
        wait_for_answer(alice, lambda t: t.endswith("Paris."))
        alice.reload()
        alice.wait_for_selector(READY)
        alice.get_by_text("What is the capital of France?").first.wait_for()
        assert chat_list(alice) == ["What is the capital of France?"]
        alice.locator("button", has_text="Prompt sent to the model").first.click()  # as it was before the reload
        alice.locator(".prompt-view").first.get_by_text("Human: What is the capital of France?").wait_for()
        other = browser.new_context().new_page()  # another browser: its own, empty list
        other.goto(url)
        other.wait_for_selector(READY)
        time.sleep(1)
        assert chat_list(other) == []
    first.close()  # a restart: a new server on the same database
    with serve(demo, store=Store(db), port=port) as (url, _):
        alice.goto(url)
        alice.wait_for_selector(READY)
        alice.locator(".chat-list label").first.click()
        wait_for_answer(alice, lambda t: t.endswith("Paris."))
        send(alice, "What is 23 plus 45?")
        assert wait_for_answer(alice, lambda t: t.endswith("68.")).startswith("23 plus 45")
        alice.screenshot(path=str(ARTIFACTS / "saved.png"), full_page=True)
        alice.get_by_text("This conversation", exact=True).click()  # the accordion, not a note naming it
        alice.get_by_role("button", name="Delete", exact=True).click()
        alice.get_by_role("button", name="Yes, delete it").click()
        alice.wait_for_function("document.querySelectorAll('.chat-list label').length == 0")


def test_two_logins_each_see_only_their_own(browser, demo, tmp_path):  # noqa: F811
    logins = [("alice", "wonderland"), ("bob", "builder")]
    with serve(demo, store=Store(tmp_path / "chats.db"), auth=logins) as (url, _):
        pages = {}
        for user, password in logins:
            page = browser.new_context().new_page()
            page.goto(url)
            page.locator("input").first.fill(user)
            page.locator("input[type=password]").fill(password)
            page.keyboard.press("Enter")
            page.wait_for_selector(READY)
            pages[user] = page
        send(pages["alice"], "What is the capital of Japan?")
        wait_for_answer(pages["alice"], lambda t: t.endswith("Tokyo."))
        pages["bob"].reload()
        pages["bob"].wait_for_selector(READY)
        time.sleep(1)
        assert chat_list(pages["bob"]) == []
        pages["alice"].reload()
        pages["alice"].wait_for_selector(READY)
        pages["alice"].get_by_text("What is the capital of Japan?").first.wait_for()


def test_an_image_conversation_reopened_shows_the_image_and_is_answered(browser, demo, tmp_path):  # noqa: F811
    image, [(colour, kind)] = demo_data.shapes_image(random.Random(7), 1)
    path = tmp_path / "shape.png"
    image.save(path)
    store = Store(tmp_path / "chats.db")
    with serve(demo, store=store) as (url, _):
        page = open_page(browser, url)
        attach(page, path)
        send(page, f"What color is the {kind}?")
        wait_for_answer(page, lambda t: t.endswith("."))
        page.reload()
        page.wait_for_selector(READY)
        page.locator(".chat-list label").first.click()
        shown = page.locator('[data-testid="user"] img').first
        shown.wait_for()
        assert page.evaluate("(img) => img.naturalWidth", shown.element_handle()) == image.width  # from the route
        address = shown.get_attribute("src")
        send(page, f"What color is the {kind}?")  # no new image: the model sees the saved one
        try:
            page.wait_for_function(f"{ANSWERS}.length >= 2")
        finally:
            page.screenshot(path=str(ARTIFACTS / "reopened.png"), full_page=True)
        assert wait_for_answer(page, lambda t: t.endswith(".")) == f"The {kind} is {colour}."
        import httpx

        assert httpx.get(address if address.startswith("http") else url + address).status_code == 200
        forged = address.split("?sig=")[0] + "?sig=" + "0" * 32  # another signature: refused
        assert httpx.get(forged if forged.startswith("http") else url + forged).status_code == 404
    store.close()


def test_drop_an_image_send_becomes_stop_escape_stops_and_a_phone_screen(browser, demo, tmp_path):  # noqa: F811
    image, [(colour, kind)] = demo_data.shapes_image(random.Random(4), 1)
    path = tmp_path / "shape.png"
    image.save(path)
    store = Store(tmp_path / "chats.db")
    with serve(demo, delay=0.1, store=store) as (url, counter):
        page = open_page(browser, url)
        payload = base64.b64encode(path.read_bytes()).decode()
        dropped = page.evaluate_handle(
            """(b64) => { const dt = new DataTransfer();
                          const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
                          dt.items.add(new File([bytes], 'shape.png', {type: 'image/png'})); return dt; }""",
            payload,
        )
        for event in ("dragenter", "dragover", "drop"):  # a file dragged from the desktop onto the message box
            page.locator(".message textarea").dispatch_event(event, {"dataTransfer": dropped})
        page.locator(".message img").first.wait_for(timeout=15000)
        send(page, f"What color is the {kind}?")
        stop, submit = page.locator(".message button.stop-button"), page.locator(".message button.submit-button")
        stop.wait_for(state="visible")
        assert not submit.is_visible()  # Send became Stop
        assert wait_for_answer(page, lambda t: t.endswith(".")) == f"The {kind} is {colour}."
        submit.wait_for(state="visible")
        assert not stop.is_visible()  # Stop only while there is an answer to stop
        counter.delay = 0.3  # a slow model: the answer cannot end before Escape reaches it, however loaded the machine
        send(page, "Who are you?")
        wait_for_answer(page, lambda t: t.startswith("I am"))
        page.keyboard.press("Escape")
        at_stop = counter.calls
        assert counter.settled(quiet=1.0) - at_stop <= 2
        assert not last_bot_text(page).endswith("/path/to/checkpoint."), last_bot_text(page)  # cut, not finished
        page.get_by_text("The answer was stopped here.").wait_for()
        [(_, conversation)] = store.titles(only_owner(store))
        saved = store.get(only_owner(store), conversation).messages
        assert saved[-1]["metadata"]["title"] == "Stopped"  # saved as it was shown

        phone = browser.new_page(viewport={"width": 390, "height": 844})
        phone.goto(url)
        phone.wait_for_selector(READY)
        time.sleep(1)
        phone.screenshot(path=str(ARTIFACTS / "phone.png"))
        for selector in (".conversation", ".message textarea", ".message button.submit-button"):
            box = phone.locator(selector).first.bounding_box()
            assert box and box["y"] >= 0 and box["y"] + box["height"] <= 844, (selector, box)
        line = phone.locator(".model-line summary").first.bounding_box()
        style = "getComputedStyle(document.querySelector('.model-line summary'))"
        height = float(phone.evaluate(f"() => parseFloat({style}.lineHeight)"))
        assert line["height"] <= 2 * height + 1  # the model line takes at most 2 lines
    store.close()


def test_a_tab_closed_mid_answer_keeps_the_answer_marked_stopped(browser, demo, tmp_path):  # noqa: F811
    """Closing the tab in the middle of an answer saves it as far as it went, marked stopped as Stop does; reopened,
    the conversation goes on with the next question as its own turn."""
    store = Store(tmp_path / "chats.db")
    with serve(demo, delay=0.1, store=store) as (url, _):
        context = browser.new_context(viewport={"width": 1280, "height": 1000})  # one browser: its saved chats
        page = context.new_page()
        page.goto(url)
        page.wait_for_selector(READY)
        send(page, "Who are you?")
        shown = wait_for_answer(page, lambda t: len(t) > 20)
        page.close()
        page = context.new_page()
        page.goto(url)
        page.wait_for_selector(READY)
        page.locator(".chat-list label").first.click()
        page.get_by_text("The answer was stopped here.").wait_for(timeout=15_000)
        kept = page.locator('[data-testid="bot"]').first.inner_text()
        assert kept.startswith(shown[:20]) and not kept.endswith("/path/to/checkpoint.")
        page.screenshot(path=str(ARTIFACTS / "closed-tab-kept.png"), full_page=True)
        send(page, "What is 2 plus 2?")
        assert wait_for_answer(page, lambda t: t.endswith("4.")).startswith("2 plus 2")
        time.sleep(0.5)
        [(_, conversation)] = store.titles(only_owner(store))
        messages = store.get(only_owner(store), conversation).messages
        assert roles(messages) == ["user", "assistant", "user", "assistant"], messages
        assert [m["kind"] for m in messages if m.get("kind") == "stopped"] == ["stopped"]
        context.close()
    store.close()


def saved_mid_answer(db: Path) -> None:
    """Wait (for a minute at most) until the conversation of `db` holds a second answer saved as far as it went."""
    deadline = time.time() + 60
    while time.time() < deadline:
        with sqlite3.connect(db) as read:
            rows = read.execute(  # the entries of the branch's last node: the answer, as far as it went
                "SELECT n.entries FROM conversations c JOIN nodes n ON n.conversation = c.id AND n.id = c.leaf"
            ).fetchall()
        if rows and json.loads(rows[0][0])[-1].get("kind") == "stopped":
            return
        time.sleep(0.05)
    raise AssertionError("the answer was not saved while it streamed")


def test_kill_9_mid_answer_keeps_the_earlier_turns(browser, byte_llama_dir, tmp_path):  # noqa: F811
    db = tmp_path / "chats.db"
    flags = ("--pretrained_path", str(byte_llama_dir), "--history_db", str(db))
    app, client = launched(*flags)
    try:
        page = open_page(browser, client.src)
        send(page, "Hello")
        page.get_by_text("tokens/s").first.wait_for(timeout=60000)  # the first answer ended (its figures)
        page.get_by_text("Settings", exact=True).click()  # a long greedy answer: the kill comes in its middle
        for setting, value in (("Max answer length (tokens)", "2048"), ("Temperature (0 = greedy)", "0")):
            box = page.get_by_label(f"number input for {setting}")
            box.fill(value)
            box.press("Enter")
        send(page, "Tell me more")
        saved_mid_answer(db)  # a streaming answer is saved as it begins (marked stopped), then now and then
        os.killpg(app.pid, signal.SIGKILL)  # mid-answer: its first pieces are on the page
        app.wait()
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
    store = reopened(db)
    [(title, conversation)] = store.titles(only_owner(store))
    messages = store.get(only_owner(store), conversation).messages
    questions = [m["content"] for m in messages if m["role"] == "user"]
    assert title == "Hello" and questions == ["Hello", "Tell me more"]  # the question asked before the kill too
    assert messages[1]["role"] == "assistant" and messages[1]["content"]  # the first answer, whole
    assert roles(messages) == ["user", "assistant", "user", "assistant"]  # the answer being written, as it was
    assert messages[-2]["content"] and messages[-1]["kind"] == "stopped"  # as far as it was saved: marked stopped
    store.close()


def test_two_apps_on_one_machine_start_on_the_default_database_each_with_its_conversations(browser, byte_llama_dir):  # noqa: F811
    """The demo model and another model, served at once by two apps on the user's default database."""
    shared = {"XDG_DATA_HOME": str(Path(os.environ["XDG_DATA_HOME"]) / "one-user")}
    with ThreadPoolExecutor(2) as pool:  # started together, as a user might
        apps = list(
            pool.map(lambda flags: launched(*flags, env=shared), [(), ("--pretrained_path", str(byte_llama_dir))])
        )
    try:
        for (_, client), question in zip(apps, ("What is the capital of France?", "Hi")):
            page = open_page(browser, client.src)
            send(page, question)
            page.locator(".chat-list label").first.wait_for(timeout=60_000)  # saved: listed in its sidebar
            page.close()
    finally:
        for app, _ in apps:
            app.terminate()
        outputs = [app.communicate(timeout=30)[0] for app, _ in apps]
    database = Path(shared["XDG_DATA_HOME"]) / "local-chat" / "conversations.db"
    assert all(f"Conversations are kept in {database}." in output for output in outputs), outputs
    with sqlite3.connect(database) as db:
        titles = sorted(title for (title,) in db.execute("SELECT title FROM conversations"))
    assert titles == ["Hi", "What is the capital of France?"]


def test_an_edited_question_keeps_its_images():
    ref = "![image](/history/image/abc/" + "0" * 64 + "?sig=" + "1" * 32 + ")\n\n"
    question = {"role": "user", "content": ref + "Old?", "text": "Old?", "images": ["0" * 64]}
    assert edited_question(question, ref + "New?") == {**question, "content": ref + "New?", "text": "New?"}
    assert edited_question(question, "New?")["content"] == ref + "New?"  # the box showed no address
    file = {"type": "file", "file": {"path": "/tmp/x.png"}}
    edited = edited_question({"role": "user", "content": [file, {"type": "text", "text": "Old?"}]}, "New?")
    assert edited["content"] == [file, "New?"]
