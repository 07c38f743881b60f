"""Conversations as trees (history/tree.py, history/store.py, ui/branches.py): regenerating and editing keep what
was there as sibling branches, "‹ 2/3 ›" shows them, fork, remove, search, pins, the schema's upgrade and exports of
the whole tree; on the demo model, through the chat tab's handlers and in Chromium."""

import json
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_browser import ARTIFACTS, READY, browser, send, wait_for_answer  # noqa: F401
from test_saved_conversations import only_owner

from fixtures.app_server import answer_of, last_of, serve_engine, submit
from local_chat.defaults import DEMO_MODEL
from local_chat.engine import Delta, End
from local_chat.errors import UserError
from local_chat.history import Store
from local_chat.history import store as store_module
from local_chat.model.meta import MetaModel
from local_chat.ui.branches import FORK_NOTE, NO_RESULT, STILL_LOADING
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_settings import ChatSettings
from local_chat.ui.chat_tab import ChatTab
from local_chat.ui.history import SavedChats
from local_chat.ui.turns import kind_of

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")
DATA = Path(__file__).resolve().parent / "data"
ME = "b" * 32
OWNER = "browser:" + ME
REQUEST = SimpleNamespace(session_hash="s", username=None)


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL))


class Numbered:
    """The demo model's engine, each answer starting with its number ("Answer 3. "), so that siblings differ; the
    prompts it was sent and its answers' last events are kept."""

    def __init__(self, engine):
        self.engine, self.count, self.prompts, self.ends = engine, 0, [], []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, request):
        self.count += 1
        self.prompts.append(request.prompt)
        first = True
        for event in self.engine.stream(request):
            if isinstance(event, Delta) and first:
                event, first = Delta(f"Answer {self.count}. " + event.text), False
            if isinstance(event, End):
                self.ends.append(event)
            yield event


@pytest.fixture
def chat(demo, tmp_path):
    store = Store(tmp_path / "chats.db")
    engine = Numbered(demo.engine)
    tab = ChatTab(engine, Cancels(), "default", "padded_resize", SavedChats(store))
    yield tab, store, engine
    store.close()


def settings(conversation) -> ChatSettings:
    return ChatSettings(conversation, ME, "default", None, "padded_resize", 64, 0.0, 0.75, 0, 1.0)


def ask(tab, text, history=(), conversation=None):
    history, _, _, conversation, _ = submit(tab, text, history, None, conversation, ME, "s")
    return history, conversation


def regenerate(tab, history, conversation) -> list[dict]:
    return last_of(tab.regenerate(REQUEST, history, settings(conversation)))[0]


def edit(tab, history, index, text, conversation) -> list[dict]:
    return last_of(tab.edit(REQUEST, SimpleNamespace(index=index, value=text), history, settings(conversation)))[0]


def click(tab, conversation, node, do="go"):
    """A click under a message (ui/branches.py's script): (entries, conversation, list, title, prompt, nav, note)."""
    return tab.sidebar.branches.on_branch({"action": {"do": do, "node": node}}, conversation, ME, REQUEST)


def texts(entries) -> list[str]:
    """The questions and answers of a branch, as the page shows them."""
    return [e["content"] for e in entries if kind_of(e) in ("question", "answer")]


def test_regenerate_twice_keeps_three_answers_and_the_next_question_follows_the_one_shown(chat):
    tab, store, _ = chat
    history, conversation = ask(tab, "What is the capital of Japan?")
    history = regenerate(tab, history, conversation)
    history = regenerate(tab, history, conversation)
    assert answer_of(history).startswith("Answer 3. The capital of Japan is Tokyo")
    *_, answers = store.get(OWNER, conversation).points  # the question's, then its answer's
    assert len(answers.siblings) == 3 and answers.at == 2  # "3/3"
    entries, _, _, _, _, nav, _ = click(tab, conversation, answers.siblings[0])  # ‹ twice
    assert texts(entries) == ["What is the capital of Japan?", "Answer 1. The capital of Japan is Tokyo."]
    assert nav["points"][-1] == {
        "index": len(entries) - 1,
        "node": answers.siblings[0],
        "siblings": [*answers.siblings],
    }
    history, _ = ask(tab, "What is the capital of Spain?", entries, conversation)
    assert texts(history)[1:] == ["Answer 1. The capital of Japan is Tokyo.", "What is the capital of Spain?",
                                  "Answer 4. The capital of Spain is Madrid."]  # fmt: skip
    entries, *_ = click(tab, conversation, answers.siblings[2])  # › to the third: its branch ends there
    assert texts(entries)[1:] == ["Answer 3. The capital of Japan is Tokyo."]
    entries, *_ = click(tab, conversation, answers.siblings[0])  # back: down to its newest message
    assert texts(entries)[-1] == "Answer 4. The capital of Spain is Madrid."
    assert texts(store.get(OWNER, conversation).messages) == texts(entries)  # reopened on the branch last shown


def test_an_edited_question_is_a_sibling_and_the_old_branch_comes_back_whole(chat):
    tab, store, _ = chat
    history, conversation = ask(tab, "What is the capital of Japan?")
    history, _ = ask(tab, "What is the capital of Spain?", history, conversation)
    old = texts(history)
    history = edit(tab, history, 0, "What is the capital of Italy?", conversation)
    assert texts(history) == ["What is the capital of Italy?", "Answer 3. The capital of Italy is Rome."]
    first, *_ = store.get(OWNER, conversation).points
    assert len(first.siblings) == 2 and first.at == 1  # "2/2" under the first question
    assert store.titles(OWNER) == [("What is the capital of Italy?", conversation)]  # a title never set follows
    entries, *_ = click(tab, conversation, first.siblings[0])
    assert texts(entries) == old  # the old branch, with its second turn
    assert store.titles(OWNER) == [("What is the capital of Japan?", conversation)]  # ... the branch shown


def test_switching_branches_reuses_the_cache_up_to_where_they_part(chat):
    tab, store, engine = chat
    history, conversation = ask(tab, "What is the capital of Japan?")
    history = regenerate(tab, history, conversation)
    *_, answers = store.get(OWNER, conversation).points
    entries, *_ = click(tab, conversation, answers.siblings[0])  # Answer 1, while the cache holds Answer 2's turn
    ask(tab, "What is the capital of Spain?", entries, conversation)
    end, prompt = engine.ends[-1], engine.prompts[-1]
    tokenize = engine.engine.tokenizer.hf
    fork = prompt.index("Answer 1.")  # where the two branches part (the numbers are not the model's own tokens)
    shared, whole = len(tokenize(prompt[:fork])["input_ids"]), len(tokenize(prompt)["input_ids"])
    assert whole - 2 <= end.prompt_tokens <= whole + 2
    assert end.cached_tokens >= shared - 2  # everything before the fork came from the cache ...
    assert end.prompt_tokens - end.cached_tokens <= whole - shared + 2  # ... and only what follows it was prefilled
    figures = [e for e in tab.saved.store.get(OWNER, conversation).messages if kind_of(e) == "stats"][-1]
    assert f"{end.cached_tokens} from the cache" in figures["metadata"]["title"]


def test_fork_remove_and_undo(chat):
    tab, store, _ = chat
    history, conversation = ask(tab, "What is the capital of Japan?")
    history, _ = ask(tab, "What is the capital of Spain?", history, conversation)
    question, answer, *_ = store.get(OWNER, conversation).points
    entries, forked, listed, title, _, _, note = click(tab, conversation, answer.node, do="fork")
    assert forked != conversation and title == "What is the capital of Japan? (fork)" and note.startswith("Forked")
    assert entries[0]["content"] == FORK_NOTE.format("What is the capital of Japan?")
    assert texts(entries) == ["What is the capital of Japan?", "Answer 1. The capital of Japan is Tokyo."]
    assert [c for _, c in listed["choices"]] == [forked, conversation]
    history, _ = ask(tab, "What is the capital of Kenya?", entries, forked)  # the fork goes on by itself
    assert texts(store.get(OWNER, conversation).messages)[-1] == "Answer 2. The capital of Spain is Madrid."

    history = regenerate(tab, store.get(OWNER, conversation).messages, conversation)
    *_, answers = store.get(OWNER, conversation).points
    entries, *_ = click(tab, conversation, answers.siblings[1], do="delete")
    assert texts(entries)[-1] == "Answer 2. The capital of Spain is Madrid."  # the sibling left is shown
    assert len(store.get(OWNER, conversation).points[-1].siblings) == 1
    _, _, _, _, _, _, note = click(tab, conversation, answers.siblings[1])
    assert "no longer in this conversation" in note

    shown = tab.saved.shown(OWNER, conversation, store.get(OWNER, conversation).messages)
    entries, box, *_ = tab.undo(shown, conversation, ME, REQUEST)
    assert box["text"] == "What is the capital of Spain?" and texts(entries)[-1].endswith("Tokyo.")
    nodes, _ = store.tree(OWNER, conversation)
    assert "What is the capital of Spain?" not in json.dumps([n.entries for n in nodes])  # undone: gone


def test_search_finds_a_word_of_an_old_branch_and_opens_it_there_but_not_anothers(chat):
    tab, store, _ = chat
    history, peru = ask(tab, "What is the capital of Peru?")
    edit(tab, history, 0, "What is the capital of Kenya?", peru)  # the Lima answer is off screen now
    ask(tab, "Who are you?")
    found, listed = tab.sidebar.branches.search("lim", ME, REQUEST)  # as typed: the last word a prefix
    assert listed["visible"] is False and found["visible"] is True
    [(label, choice)] = found["choices"]
    assert label == "What is the capital of Kenya? — Answer 1. The capital of Peru is [Lima]."  # the title follows
    entries, opened, *_, note = tab.sidebar.branches.open_found(choice, ME, REQUEST)
    assert opened == peru and note == "" and texts(entries)[-1] == "Answer 1. The capital of Peru is Lima."
    found, _ = tab.sidebar.branches.search("capital peru", ME, REQUEST)  # its title followed the branch opened
    assert [c for _, c in found["choices"]] == [f"{peru}/"]  # the title matched: the conversation, once
    assert (
        tab.sidebar.branches.search("Lima", "c" * 32, REQUEST)[0]["choices"] == []
    )  # another login's page finds nothing
    assert tab.sidebar.branches.search("Lima", "c" * 32, REQUEST)[0]["info"] == NO_RESULT
    # typed before the page's first load gave it its id: it is searched once the load ends, not refused
    assert tab.sidebar.branches.search("Lima", None, REQUEST)[0]["info"] == STILL_LOADING
    assert tab.sidebar.branches.search("", ME, REQUEST)[1]["visible"] is True  # an empty box: the list again


def test_a_pinned_conversation_is_listed_first(chat):
    tab, store, _ = chat
    _, older = ask(tab, "What is the capital of Japan?")
    _, newer = ask(tab, "What is the capital of Spain?")
    assert [c for _, c in tab.saved.choices(OWNER)] == [newer, older]
    listed, _ = tab.sidebar.branches.pin(True, older, ME, REQUEST)
    assert listed["choices"] == [("★ What is the capital of Japan?", older), ("What is the capital of Spain?", newer)]
    assert (
        tab.sidebar.branches.pinned_of(older, ME, REQUEST) is True
        and tab.sidebar.branches.pinned_of(newer, ME, REQUEST) is False
    )
    tab.sidebar.branches.pin(False, older, ME, REQUEST)
    assert [c for _, c in tab.saved.choices(OWNER)] == [newer, older]


def test_an_export_of_the_tree_imports_as_the_same_tree_and_a_broken_one_is_a_sentence(chat, tmp_path):
    tab, store, _ = chat
    history, conversation = ask(tab, "What is the capital of Japan?")
    history = regenerate(tab, history, conversation)
    edit(tab, history, 0, "What is the capital of Italy?", conversation)
    exported = json.loads(Path(tab.saved.exports.export(OWNER, conversation, "json")).read_text())
    assert [m["content"] for m in exported["messages"]] == texts(store.get(OWNER, conversation).messages)
    assert len(exported["tree"]["nodes"]) == 5  # two questions, three answers
    imported = tab.saved.exports.import_file(OWNER, tab.saved.exports.export(OWNER, conversation, "json"))
    (before, leaf), (after, leaf_after) = store.tree(OWNER, conversation), store.tree(OWNER, imported)
    strip = lambda nodes: [(n.id, n.parent, [e for e in n.entries if kind_of(e) != "stats"]) for n in nodes]  # noqa: E731
    assert strip(after) == strip(before) and leaf_after == leaf
    siblings = [[(p.node, p.siblings) for p in store.get(OWNER, c).points] for c in (imported, conversation)]
    assert siblings[0] == siblings[1]  # the same branch on screen, the same versions under it
    exported["tree"]["nodes"][1]["parent"] = "nowhere"
    file = tmp_path / "broken.json"
    file.write_text(json.dumps(exported))
    with pytest.raises(UserError, match='remove the "tree" key'):
        tab.saved.exports.import_file(OWNER, str(file))


def test_a_version_6_database_is_upgraded_and_the_old_app_refuses_the_new_one(tmp_path, monkeypatch):
    path = tmp_path / "conversations.db"
    with sqlite3.connect(path) as db:
        db.executescript((DATA / "conversations-v6.sql").read_text())
        (data,) = db.execute("SELECT messages FROM conversations WHERE id = 'conversation-six'").fetchone()
    store, owner = Store(path), "browser:" + "f" * 32
    found = store.get(owner, "conversation-six")
    unnamed = [{k: v for k, v in m.items() if k not in ("node", "reply")} for m in found.messages]
    assert unnamed == json.loads(data)  # one straight branch, as it was
    assert [len(p.siblings) for p in found.points] == [1, 1, 1, 1]  # two questions and their answers
    assert [f.conversation for f in store.search(owner, "kyoto")] == ["conversation-six"]  # its text is indexed
    assert [f.node for f in store.search(owner, "greetings")] == [None]  # and its titles
    store.close()
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 6)
    with pytest.raises(UserError, match="was written by a newer version of this app"):
        Store(path)


# ----- in Chromium -----


def bar_texts(page) -> list[str]:
    """The "n/m" of each message's controls that has siblings, in the page's order."""
    return page.eval_on_selector_all(".branch-bar span", "spans => spans.map(s => s.textContent)")


def wait_for(condition, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("the page did not get there in time")


def test_arrows_fork_search_and_pin_in_the_browser(browser, demo, tmp_path):  # noqa: F811
    store = Store(tmp_path / "chats.db")
    with serve_engine(Numbered(demo.engine), store=store) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(url)
        page.wait_for_selector(READY)
        send(page, "What is the capital of Japan?")
        wait_for_answer(page, lambda t: "Tokyo" in t)
        for number in (2, 3):  # regenerate twice
            time.sleep(0.5)
            page.locator('[data-testid="bot"]').last.hover()
            page.get_by_label("Retry").last.click()
            wait_for_answer(page, lambda t, n=number: t.startswith(f"Answer {n}."))
        wait_for(lambda: bar_texts(page) == ["3/3"])
        page.screenshot(path=str(ARTIFACTS / "branches-arrows.png"))
        for label, shown, number in (("Previous", "2/3", 2), ("Previous", "1/3", 1), ("Next", "2/3", 2)):
            page.get_by_label(f"{label} version").click()
            wait_for(lambda s=shown: bar_texts(page) == [s])
            wait_for_answer(page, lambda t, n=number: t.startswith(f"Answer {n}."))
        page.get_by_label("Previous version").click()
        wait_for_answer(page, lambda t: t.startswith("Answer 1."))
        send(page, "What is the capital of Spain?")  # follows the answer shown
        wait_for_answer(page, lambda t: t.startswith("Answer 4.") and "Madrid" in t)
        bots = page.locator('[data-testid="bot"]').all_inner_texts()
        assert any(t.startswith("Answer 1.") for t in bots) and not any(t.startswith("Answer 3.") for t in bots)
        wait_for(lambda: bar_texts(page) == ["1/3"])
        figures = page.get_by_text("from the cache").last.inner_text()  # the start of the branch was cached
        cached, prompt = int(figures.split(", ")[-1].split()[0]), int(figures.split("prompt ")[1].split()[0])
        assert 0 < cached < prompt
        page.screenshot(path=str(ARTIFACTS / "branches-next-question.png"))

        page.locator('[data-testid="user"]').first.hover()  # edit the first question: a sibling of it
        page.get_by_label("Edit").first.click()
        page.locator("textarea.edit-textarea").fill("What is the capital of Italy?")
        page.get_by_label("Submit").first.click()
        wait_for_answer(page, lambda t: t.startswith("Answer 5.") and "Rome" in t)
        wait_for(lambda: bar_texts(page) == ["2/2"])  # under the question; its one answer has no sibling
        page.get_by_label("Previous version").click()  # back to the old question: its branch whole
        wait_for_answer(page, lambda t: t.startswith("Answer 4.") and "Madrid" in t)
        wait_for(lambda: bar_texts(page) == ["1/2", "1/3"])

        page.locator('[data-testid="bot"]').first.hover()  # fork at the first answer (its bar, under the figures)
        page.locator(".bot-row .branch-bar").first.get_by_label("Fork: a new conversation down to this message").click()
        page.get_by_text("Forked from “What is the capital of").wait_for(state="attached")
        wait_for_answer(page, lambda t: t.startswith("Answer 1."))  # the fork holds the branch down to that answer
        wait_for(lambda: "(fork)" in page.locator(".chat-list").inner_text())
        page.screenshot(path=str(ARTIFACTS / "branches-fork.png"))

        search = page.get_by_placeholder("Search conversations")
        search.press_sequentially("madr", delay=30)  # as a user types (a fill sends no input event Gradio hears)
        result = page.locator(".found label").first
        result.wait_for()
        assert "[Madr" in result.inner_text()
        page.screenshot(path=str(ARTIFACTS / "branches-search.png"))
        result.click()
        wait_for_answer(page, lambda t: "Madrid" in t)
        search.press("Control+a")
        search.press("Backspace")  # an empty box: the list again
        page.locator(".chat-list label", has_text="(fork)").click()
        page.get_by_text("This conversation", exact=True).click()  # the accordion, not a note naming it
        page.get_by_label("Pinned to the top of the list").check()
        wait_for(lambda: page.locator(".chat-list label").first.inner_text().startswith("★"))
        assert store.titles(only_owner(store))[0][0].endswith("(fork)")
        page.screenshot(path=str(ARTIFACTS / "branches-pinned.png"))
        page.close()
    store.close()
