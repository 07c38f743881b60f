"""Tools on the page (--mcp_config): MCP servers written here with the official SDK (tests/mcp_server.py, over stdio
and over Streamable HTTP) and a real third-party one from PyPI (mcp-server-time, over stdio); a tiny random Qwen3 of
the real class with Qwen3's published template, made to call them (tiny_models.ForcedAnswer), through the chat tab's
handlers in-process: the card, Allow once / Always / Deny, the result folded, the answer going on, --max_tool_rounds,
Stop during a slow call, saving and export. tests/test_browser.py shows the same in Chromium."""

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures.app_server import last_of
from local_chat.errors import UserError
from local_chat.history import Store
from local_chat.launchers.loading import free_port
from local_chat.model.meta import MetaModel
from local_chat.tools import ServerSpec, ToolServers, read_config
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_settings import ChatSettings
from local_chat.ui.chat_tab import ChatTab
from local_chat.ui.history import SavedChats
from local_chat.ui.tool_rounds import DECLINED, ROUNDS_TITLE
from local_chat.ui.turns import kind_of, model_view

SERVER = str(Path(__file__).resolve().parent / "mcp_server.py")
END = "<|im_end|>"
BROWSER = "b" * 40
OWNER = "browser:" + BROWSER


def call(name: str, **arguments) -> str:
    """A Qwen3 tool call as the model writes it."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


@pytest.fixture(scope="module")
def http_server():
    """tests/mcp_server.py over Streamable HTTP on 127.0.0.1: its URL."""
    port = free_port()
    server = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            import httpx

            httpx.get(url, timeout=1)
            break
        except Exception:
            time.sleep(0.2)
    yield url
    server.kill()


@pytest.fixture(scope="module")
def servers(http_server):
    """The weather server over stdio, the same over HTTP, mcp-server-time, and one that cannot start."""
    specs = [
        ServerSpec("weather", command=sys.executable, args=(SERVER,)),
        ServerSpec("remote", url=http_server),
        ServerSpec("time", command=sys.executable, args=("-m", "mcp_server_time", "--local-timezone", "UTC")),
        ServerSpec("broken", command="no-such-mcp-server"),
    ]
    servers = ToolServers(specs, timeout_s=3)
    yield servers
    servers.close()


@pytest.fixture
def page(qwen3_roomy, servers, tmp_path):
    """(the chat tab with the servers' tools and saved conversations, its forced answers, the store)."""
    model, forced = qwen3_roomy
    store = Store(tmp_path / "conversations.db")
    tab = ChatTab(model.engine, Cancels(), "chat_template", "padded_resize", SavedChats(store), tool_servers=servers,
                  max_tool_rounds=2)  # fmt: skip
    yield tab, forced, store
    store.close()


REQUEST = SimpleNamespace(session_hash="tab", username=None)


def settings(conversation=None, tools=None) -> ChatSettings:
    return ChatSettings(conversation, BROWSER, "chat_template", None, "padded_resize", 300, 0.0, 0.75, 0, 1.0, None,
                        None, tools)  # fmt: skip


def ask(tab, text, history=(), conversation=None, tools=None) -> tuple[list, str | None]:
    """Send `text`: (entries, conversation id)."""
    box = {"text": text, "files": []}
    entries, _, _, conversation, _ = last_of(tab.submit(REQUEST, box, list(history), settings(conversation, tools)))
    return entries, conversation


def choose(tab, choice: str, history, conversation, tools=None) -> tuple[list, str]:
    """Press a card's button ("allow", "always" or "deny"): (entries, prompt of the answer after it)."""
    chosen = SimpleNamespace(value=choice, index=0)
    entries, prompt, _, _ = last_of(tab.decide(REQUEST, chosen, history, settings(conversation, tools)))
    return entries, prompt


def without_figures(entries) -> list[dict]:
    return [e for e in entries if kind_of(e) != "stats"]


def kinds(entries) -> list[str]:
    return [kind_of(e) + (f":{e['approval']}" if e.get("approval") else "") for e in entries if kind_of(e) != "stats"]


# ----- the servers -----


def test_the_servers_tools_are_listed_and_called_over_stdio_http_and_a_third_party_server(servers):
    keys = [tool.key for tool in servers.tools]
    assert {"weather/get_weather", "remote/get_weather", "time/get_current_time", "time/convert_time"} <= set(keys)
    assert servers.tool("weather_get_weather").server == "weather"  # two servers share the name: prefixed
    assert servers.tool("get_current_time").description.startswith("Get current time")
    assert "no-such-mcp-server" in servers.problems["broken"] and "could not start" in servers.problems["broken"]

    async def calls():
        weather = await servers.call(servers.tool("remote_get_weather"), {"city": "Oslo"})
        now = await servers.call(servers.tool("get_current_time"), {"timezone": "Europe/Paris"})
        image = await servers.call(servers.tool("weather_red_square"), {})
        slow = await servers.call(servers.tool("weather_wait"), {"seconds": 10})
        crashed = await servers.call(servers.tool("weather_crash"), {})
        again = await servers.call(servers.tool("weather_get_weather"), {"city": "Rome"})  # its session reopened
        return weather, now, image, slow, crashed, again

    weather, now, image, slow, crashed, again = asyncio.run(calls())
    assert weather.text == "Sunny and 21 °C in Oslo." and not weather.failed
    assert json.loads(now.text)["timezone"] == "Europe/Paris"
    assert image.images[0][0] == "image/png" and image.images[0][1].startswith(b"\x89PNG")
    assert (
        slow.failed
        and slow.text == "The tool weather_wait did not answer within 3 s (--tool_timeout); it was cancelled."
    )
    assert crashed.failed and "failed during the call" in crashed.text and "started again" in crashed.text
    assert again.text == "Sunny and 21 °C in Rome."


@pytest.mark.parametrize(
    "config, sentence",
    [
        ("{", "is not JSON"),
        ('{"servers": {}}', 'has no "mcpServers" object'),
        ('{"mcpServers": {"w": {"args": ["x"]}}}', 'mcpServers.w needs "command"'),
        ('{"mcpServers": {"w": {"command": "x", "args": "y"}}}', "mcpServers.w.args must be a list of strings"),
        ('{"mcpServers": {"w": {"url": "ftp://x"}}}', "mcpServers.w.url must be the server's http://"),
        ('{"mcpServers": {"w": {"type": "sse", "url": "http://x"}}}', '"sse" is the old HTTP transport'),
        ('{"mcpServers": {"w": {"command": "x", "env": {"A": 1}}}}', "mcpServers.w.env must be an object of strings"),
    ],
)
def test_a_malformed_config_is_one_sentence_naming_the_key(tmp_path, config, sentence):
    path = tmp_path / "mcp.json"
    path.write_text(config)
    with pytest.raises(UserError, match=re.escape(sentence)):
        read_config(path)


def test_the_config_format_of_claude_desktop_reads_and_a_disabled_server_is_left_out(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
        "web": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
        "off": {"command": "x", "disabled": True},
    }}))  # fmt: skip
    time_server, web = read_config(path)
    assert time_server == ServerSpec("time", command="uvx", args=("mcp-server-time",), env=(("TZ", "UTC"),))
    assert web.url == "https://example.com/mcp" and web.headers == (("Authorization", "Bearer x"),)


def test_the_app_refuses_a_malformed_config_at_launch_in_one_sentence(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {"w": {}}}')
    app = Path(__file__).resolve().parent.parent / "app.py"
    done = subprocess.run([sys.executable, str(app), "--mcp_config", str(path), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert f'error: --mcp_config {path}: mcpServers.w needs "command"' in done.stderr


# ----- the page's rounds -----


def test_allow_once_runs_the_call_then_the_answer_goes_on_in_the_same_turn(page):
    tab, forced, store = page
    forced.in_turn([call("weather_get_weather", city="Paris"), "It is sunny in Paris."], tab.engine.tokenizer.hf, END)
    entries, conversation = ask(tab, "What is the weather in Paris?")
    card = entries[-1]
    assert kinds(entries) == ["question", "tool_call:ask"]  # nothing ran yet
    asked, arguments = card["content"].split("\n\n", 1)
    assert (
        asked == "The model asks to call **weather_get_weather** of the server weather with:" and "metadata" not in card
    )
    assert json.loads(arguments.removeprefix("```json\n").removesuffix("\n```")) == {"city": "Paris"}
    assert [o["value"] for o in card["options"]] == ["allow", "always", "deny"]
    assert store.get(OWNER, conversation).messages[-1]["approval"] == "ask"  # saved while it waits

    entries, prompt = choose(tab, "allow", entries, conversation)
    assert kinds(entries) == ["question", "tool_call:done", "tool_result", "answer"]
    _, card, result, answer = without_figures(entries)
    assert card["metadata"] == {"title": "Called weather_get_weather · weather", "status": "done"}
    assert result["result"] == "Sunny and 21 °C in Paris." and result["metadata"]["status"] == "done"
    assert answer["content"] == "It is sunny in Paris."
    assert "<tool_response>\nSunny and 21 °C in Paris.\n</tool_response>" in prompt
    assert store.get(OWNER, conversation).messages == entries  # saved as shown


def test_deny_sends_the_refusal_and_the_model_answers(page):
    tab, forced, _ = page
    forced.in_turn([call("get_current_time", timezone="UTC"), "I may not look."], tab.engine.tokenizer.hf, END)
    entries, conversation = ask(tab, "What time is it?")
    entries, prompt = choose(tab, "deny", entries, conversation)
    assert kinds(entries) == ["question", "tool_call:denied", "tool_result", "answer"]
    assert without_figures(entries)[2]["result"] == DECLINED
    assert f"<tool_response>\n{DECLINED}\n</tool_response>" in prompt
    assert without_figures(entries)[-1]["content"] == "I may not look."


def test_always_allow_runs_the_next_call_without_a_card_until_it_is_revoked(page):
    tab, forced, store = page
    hf = tab.engine.tokenizer.hf
    forced.in_turn([call("get_current_time", timezone="UTC"), "Noon."], hf, END)
    entries, conversation = ask(tab, "What time is it?")
    entries, _ = choose(tab, "always", entries, conversation)
    assert kinds(entries)[-3:] == ["tool_call:done", "tool_result", "answer"]
    assert store.always_allowed(OWNER) == ["time/get_current_time"]

    forced.in_turn([call("get_current_time", timezone="Asia/Tokyo"), "Evening in Tokyo."], hf, END)
    entries, _ = ask(tab, "And in Tokyo?", entries, conversation)  # no card waits: it ran at once
    assert kinds(entries)[-3:] == ["tool_call:done", "tool_result", "answer"]
    assert json.loads(without_figures(entries)[-2]["result"])["timezone"] == "Asia/Tokyo"

    tab.tools.revoke([], BROWSER, REQUEST)  # unticked in the Tools control: asked again
    forced.in_turn([call("get_current_time", timezone="UTC"), "Noon."], hf, END)
    entries, _ = ask(tab, "Once more?", entries, conversation)
    assert kinds(entries)[-1] == "tool_call:ask" and store.always_allowed(OWNER) == []


def test_max_tool_rounds_ends_the_answer_with_its_sentence(page):
    tab, forced, _ = page  # --max_tool_rounds 2
    tab.tools.approvals.set(OWNER, ["weather/weather_get_weather", "weather/get_weather"])
    forced.in_turn([call("weather_get_weather", city="Paris")] * 4, tab.engine.tokenizer.hf, END)
    entries, _ = ask(tab, "Loop forever.")
    assert kinds(entries).count("tool_call:done") == 2 and kinds(entries)[-3:] == ["tool_call:not_run", "tool_result",
                                                                                   "notice"]  # fmt: skip
    assert entries[-1]["metadata"]["title"] == ROUNDS_TITLE and "more than 2 rounds" in entries[-1]["content"]
    assert model_view(entries)[-1]["role"] == "tool"  # the conversation stays one the model can go on with


def test_stop_during_a_slow_call_ends_within_a_second_and_keeps_the_conversation(page):
    tab, forced, store = page
    hf = tab.engine.tokenizer.hf
    forced.in_turn([call("remote_wait", seconds=30)], hf, END)
    entries, conversation = ask(tab, "Wait for me.")
    shown = []

    async def stopped_mid_call():
        async def run():
            async for update in tab.decide(REQUEST, SimpleNamespace(value="allow"), entries, settings(conversation)):
                shown.append(update[0])

        task = asyncio.ensure_future(run())
        while not (shown and shown[-1][-1].get("approval") == "running"):
            await asyncio.sleep(0.02)
        started = time.perf_counter()
        task.cancel()  # what Gradio does to the handler on Stop
        await asyncio.gather(task, return_exceptions=True)
        return time.perf_counter() - started

    took = asyncio.run(stopped_mid_call())
    assert took < 1.0, f"the call took {took:.2f} s to stop"
    marked, *_ = tab.mark_stopped(shown[-1], conversation, BROWSER, REQUEST)  # Stop's own save
    assert kinds(marked) == ["question", "tool_call:stopped", "tool_result", "stopped"]
    assert store.get(OWNER, conversation).messages == marked
    forced.in_turn(["Fine."], hf, END)
    entries, _ = ask(tab, "Never mind.", marked, conversation)  # the conversation goes on
    assert without_figures(entries)[-1]["content"] == "Fine." and kinds(entries)[:3] == kinds(marked)[:3]


def test_a_saved_conversation_with_calls_reopens_goes_on_and_exports_and_imports_equal(page):
    tab, forced, store = page
    hf = tab.engine.tokenizer.hf
    forced.in_turn([call("weather_get_weather", city="Paris"), "Sunny."], hf, END)
    entries, conversation = ask(tab, "Weather?")
    entries, _ = choose(tab, "allow", entries, conversation)
    reopened = tab.saved.shown(OWNER, conversation, store.get(OWNER, conversation).messages)
    assert reopened == entries
    forced.in_turn(["Still sunny."], hf, END)
    entries, _ = ask(tab, "And now?", reopened, conversation)
    assert "<tool_response>\nSunny and 21 °C in Paris.\n</tool_response>" in store.get(OWNER, conversation).options[
        "prompt"]  # fmt: skip
    exported = tab.saved.exports.export(OWNER, conversation, "json")
    messages = json.loads(Path(exported).read_text())["messages"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "weather_get_weather" and messages[2]["role"] == "tool"
    imported = tab.saved.exports.import_file(OWNER, exported)
    assert model_view(store.get(OWNER, imported).messages) == model_view(entries)
    markdown = Path(tab.saved.exports.export(OWNER, conversation, "md")).read_text()
    assert "**Called `weather_get_weather`**" in markdown and "## Tool\n\nSunny and 21 °C in Paris." in markdown


def test_tools_switched_off_are_not_offered_and_the_choice_is_kept_with_the_conversation(page):
    tab, forced, store = page
    forced.in_turn(["No tools needed."], tab.engine.tokenizer.hf, END)
    on = ["time/get_current_time"]
    entries, conversation = ask(tab, "Hi", tools=on)
    prompt = store.get(OWNER, conversation).options["prompt"]
    assert '"name": "get_current_time"' in prompt and "weather_get_weather" not in prompt
    assert tab.tools.tools_of(conversation, BROWSER, REQUEST) == on  # reopened: as this conversation left it
    assert set(tab.tools.tools_of(None, BROWSER, REQUEST)) == {
        t.key for t in tab.tools.servers.tools
    }  # a new one: all on


def test_a_model_whose_template_takes_no_tools_is_told_and_gets_none(servers):
    from local_chat.defaults import DEMO_MODEL
    from local_chat.engine.chats import ChatEngine

    if not (DEMO_MODEL / "config.json").exists():
        pytest.skip("the demo model is not built")
    demo = ChatEngine(MetaModel.from_pretrained(str(DEMO_MODEL)).engine, "default")
    assert "template has no tool messages" in demo.why_no_tools()


def test_a_version_4_database_is_upgraded_and_the_old_app_refuses_the_new_one(tmp_path, monkeypatch):
    import sqlite3

    from local_chat.history import store as store_module

    path = tmp_path / "conversations.db"
    with sqlite3.connect(path) as db:
        db.executescript((Path(__file__).resolve().parent / "data" / "conversations-v4.sql").read_text())
    store, owner = Store(path), "browser:" + "d" * 32
    found = store.get(owner, "conversation-four")
    assert [kind_of(m) for m in found.messages] == ["question", "tool_call", "tool_result", "answer"]
    assert model_view(found.messages)[2] == {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."}
    store.allow_always(owner, ["time/get_current_time"])
    assert store.always_allowed(owner) == ["time/get_current_time"]
    store.close()
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 4)
    with pytest.raises(UserError, match="was written by a newer version of this app"):
        Store(path)


def test_in_front_of_an_engine_the_page_runs_the_calls_the_engine_returns(qwen3_roomy, servers, tmp_path):
    """--api_base: the engine (here this app's own /v1, over the same model) renders the tools and returns the
    calls; the page shows, runs and answers them the same way."""
    from fixtures.app_server import serve
    from local_chat.engine.remote import RemoteEngine

    model, forced = qwen3_roomy
    with serve(model) as (url, _):
        store = Store(tmp_path / "conversations.db")
        front = ChatTab(RemoteEngine(url + "/v1"), Cancels(), "chat_template", "padded_resize", SavedChats(store),
                        tool_servers=servers)  # fmt: skip
        assert front.engine.why_no_tools("chat_template") is None
        forced.in_turn([call("remote_get_weather", city="Lima"), "Warm in Lima."], model.tokenizer.hf, END)
        entries, conversation = ask(front, "Weather in Lima?")
        assert kinds(entries) == ["question", "tool_call:ask"]
        entries, _ = choose(front, "allow", entries, conversation)
        store.close()
    assert kinds(entries) == ["question", "tool_call:done", "tool_result", "answer"]
    assert without_figures(entries)[2]["result"] == "Sunny and 21 °C in Lima."
    assert without_figures(entries)[-1]["content"] == "Warm in Lima."


def test_each_login_has_its_own_always_list(page):
    tab, _, store = page
    alice, bob = SimpleNamespace(session_hash="a", username="alice"), SimpleNamespace(session_hash="b", username="bob")
    tab.tools.approvals.set(tab.tools.owner(None, alice), ["time/get_current_time"])
    assert tab.tools.approvals.of(tab.tools.owner(None, alice)) == ["time/get_current_time"]
    assert tab.tools.approvals.of(tab.tools.owner(None, bob)) == [] and store.always_allowed("user:alice") == [
        "time/get_current_time"]  # fmt: skip
