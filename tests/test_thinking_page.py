"""The page and a reasoning model, through the chat tab's handlers in-process: the thought is its own entry
(ui/turns.py) above the answer and goes back to the model as the answer's `reasoning_content`; the thinking switch
(shown where the template reads `enable_thinking` or `reasoning_effort`) changes the prompt as the template does;
saved conversations keep the thought and the switch (schema 2 upgrades a schema-1 database kept in tests/data);
export then import gives the same messages. tests/test_browser.py shows it in Chromium."""

import json
import shutil
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures import text_families
from fixtures.app_server import submit
from local_chat.defaults import DEMO_MODEL
from local_chat.errors import UserError
from local_chat.history import Store
from local_chat.history import store as store_module
from local_chat.model.meta import MetaModel
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_tab import ChatTab
from local_chat.ui.history import SavedChats
from local_chat.ui.thinking import thinking_switch
from local_chat.ui.turns import kind_of, model_view

END = "<|im_end|>"
THOUGHT_AND_ANSWER = "<think>\nThe user greets me. I greet back.\n</think>\n\nHello! How can I help?"
V1_DB = Path(__file__).resolve().parent / "data" / "conversations-v1.db"  # written by the app at schema 1
V1_OWNER = "browser:" + "a" * 32


def chat_tab(model, store=None) -> ChatTab:
    return ChatTab(model.engine, Cancels(), "chat_template", "padded_resize", SavedChats(store))


def ask(tab, text, history=(), thinking=None, conversation=None, browser_id=None):
    """The chat tab's Send: (entries, box, prompt, conversation, list)."""
    chat = dict(conversation=conversation, browser_id=browser_id, thinking=thinking, template="chat_template")
    return submit(tab, text, history, **chat)


def test_the_thought_is_its_own_entry_and_goes_back_as_reasoning(qwen3):
    model, forced = qwen3
    tab = chat_tab(model)
    forced.again(THOUGHT_AND_ANSWER, model.tokenizer.hf, END)
    entries, _, prompt, _, _ = ask(tab, "Hello there!")
    kinds = [kind_of(e) for e in entries]
    assert kinds == ["question", "thinking", "answer", "stats"], entries
    thought, answer = entries[1], entries[2]
    assert thought["content"] == "The user greets me. I greet back." and answer["content"] == "Hello! How can I help?"
    assert thought["metadata"]["title"] == "Thinking" and thought["metadata"]["status"] == "done"
    assert thought["metadata"]["duration"] >= 0

    # the next turn: the thought goes back as the answer's reasoning_content, and the prompt is the template's
    forced.again("Fine, thanks.", model.tokenizer.hf, END)
    entries, _, prompt, _, _ = ask(tab, "How are you?", entries)
    sent = model_view(entries[:-2])  # up to the new question
    assert sent[1] == {"role": "assistant", "content": "Hello! How can I help?",
                       "reasoning_content": "The user greets me. I greet back."}  # fmt: skip
    assert prompt == model.tokenizer.hf.apply_chat_template(sent, tokenize=False, add_generation_prompt=True)
    assert [kind_of(e) for e in entries][-3:] == ["question", "answer", "stats"]  # no thought this time


def test_the_next_turn_renders_the_parsed_reply_as_the_template_does(qwen3):
    from local_chat.engine import ChatOptions, Rendered, Request, Sampling
    from local_chat.engine.chats import ChatEngine

    model, forced = qwen3
    tab = chat_tab(model)
    forced.again(THOUGHT_AND_ANSWER, model.tokenizer.hf, END)
    entries, *_ = ask(tab, "Hello there!")
    entries = entries + [{"role": "user", "content": "And you?"}]
    messages = model_view(entries)
    request = Request(messages=messages, sampling=Sampling(max_new_tokens=1), chat=ChatOptions())
    rendered = next(iter(ChatEngine(model.engine, "chat_template").stream(request)))
    assert isinstance(rendered, Rendered)
    assert rendered.text == model.tokenizer.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_the_switch_is_shown_where_the_template_reads_it_and_changes_the_prompt(qwen3, tmp_path):
    model, forced = qwen3
    assert thinking_switch(model.engine) == ("enable_thinking", True)  # Qwen3 thinks with the variable unset
    gpt_oss = MetaModel.from_pretrained(str(text_families.build("gpt_oss", tmp_path / "gpt_oss")))
    assert thinking_switch(gpt_oss.engine) == ("reasoning_effort", "medium")
    demo = MetaModel.from_pretrained(str(DEMO_MODEL))
    assert thinking_switch(demo.engine) == (None, None)

    tab = chat_tab(model)
    forced.again("Hi.", model.tokenizer.hf, END)
    _, _, off, _, _ = ask(tab, "Hello there!", thinking=False)
    forced.again("Hi.", model.tokenizer.hf, END)
    _, _, on, _, _ = ask(tab, "Hello there!", thinking=True)
    assert off.endswith("<think>\n\n</think>\n\n") and "<think>" not in on

    tab = chat_tab(gpt_oss)
    _, _, high, _, _ = ask(tab, "Hello there!", thinking="high")
    assert "Reasoning: high" in high


def test_stop_while_thinking_keeps_the_thought_marked_stopped():
    from local_chat.ui.turns import marked_stopped, thinking

    entries = [{"role": "user", "content": "Hi"}, thinking("I am still thin", done=False, seconds=0.4)]
    marked = marked_stopped(entries)
    assert [kind_of(e) for e in marked] == ["question", "thinking", "stopped"]
    assert marked[1]["content"] == "I am still thin"
    assert marked[1]["metadata"] == {"title": "Thinking", "status": "done", "duration": 0.4, "log": "stopped"}


def test_a_saved_conversation_keeps_the_thought_and_the_switch_and_exports_and_imports_it(qwen3, tmp_path):
    model, forced = qwen3
    store = Store(tmp_path / "c.db")
    tab = chat_tab(model, store)
    me = "x" * 32
    request = SimpleNamespace(session_hash="s", username=None)
    forced.again(THOUGHT_AND_ANSWER, model.tokenizer.hf, END)
    entries, _, _, conversation, _ = ask(tab, "Hello there!", thinking=False, browser_id=me)
    shown, reopened, _, _, _ = tab.sidebar.open(conversation, me, request)
    assert reopened == conversation and [kind_of(e) for e in shown] == ["question", "thinking", "answer", "stats"]
    assert tab.thinking_of(conversation, me, None, request) is False  # the switch as this conversation left it
    store.close()  # the app restarts on the same database: the thought is there again
    store = Store(tmp_path / "c.db")
    tab = chat_tab(model, store)
    shown, _, _, _, _ = tab.sidebar.open(conversation, me, request)
    assert [kind_of(e) for e in shown] == ["question", "thinking", "answer", "stats"]

    saved = tab.saved
    owner = "browser:" + me
    exported = json.loads(Path(saved.exports.export(owner, conversation, "json")).read_text())
    assert exported["messages"] == [
        {"role": "user", "content": "Hello there!"},
        {"role": "assistant", "content": "Hello! How can I help?",
         "reasoning_content": "The user greets me. I greet back."},
    ]  # fmt: skip
    markdown = Path(saved.exports.export(owner, conversation, "md")).read_text()
    assert "<details><summary>Thinking</summary>\n\nThe user greets me. I greet back.\n\n</details>" in markdown
    for kind in ("json", "md"):
        imported = saved.exports.import_file(owner, saved.exports.export(owner, conversation, kind))
        left_out = ("metadata", "node", "reply") if kind == "md" else ("metadata",)  # Markdown keeps no node ids
        messages = [{k: v for k, v in m.items() if k not in left_out} for m in store.get(owner, imported).messages]
        without_figures = [{k: v for k, v in m.items() if k not in left_out} for m in entries if kind_of(m) != "stats"]
        assert messages == without_figures, kind
    store.close()


def test_an_imported_conversation_shows_tool_calls_and_results_folded(tmp_path):
    store = Store(tmp_path / "c.db")
    saved = SavedChats(store)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    conversation = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "I need the weather."},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"weather": "sunny"}'},
        {"role": "assistant", "content": "It is sunny."},
    ]
    file = tmp_path / "tools.json"
    file.write_text(json.dumps({"title": "Tools", "messages": conversation}))
    imported = store.get("o", saved.exports.import_file("o", str(file))).messages
    assert [kind_of(m) for m in imported] == ["question", "thinking", "tool_call", "tool_result", "answer"]
    assert imported[2]["metadata"]["title"] == "Called get_weather"
    assert imported[3]["metadata"]["title"] == "Result of get_weather"
    assert model_view(imported) == [
        conversation[0],
        {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": "I need the weather."},
        conversation[2],
        conversation[3],
    ]
    store.close()


def test_a_version_1_database_is_upgraded_and_the_old_app_refuses_the_new_one(tmp_path, monkeypatch):
    path = tmp_path / "conversations.db"
    shutil.copy(V1_DB, path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 1
    store = Store(path)
    messages = store.get(V1_OWNER, "conversation-one").messages
    store.close()
    assert [kind_of(m) for m in messages] == [
        "question", "thinking", "answer", "stats", "question", "error", "question", "notice", "thinking", "answer",
        "stopped",
    ]  # fmt: skip
    assert messages[1]["content"] == "The user greets me. I greet back."
    assert messages[2]["content"] == "Hello! How can I help?" and messages[9]["content"] == "It is 4."
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == store_module.SCHEMA_VERSION

    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 1)  # the app before this schema
    with pytest.raises(UserError, match="was written by a newer version of this app"):
        Store(path)
