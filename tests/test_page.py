"""The page as a new user meets it, in Chromium: nothing saved is lost or deleted by a control the user did not mean
for it, a bad attachment does not block the next message, a reload reopens the conversation, and at a phone's width
every control lies on the screen."""

import time

import pytest
from test_browser import ANSWERS, ARTIFACTS, READY, browser, open_page, send, wait_for_answer  # noqa: F401

from fixtures.app_server import serve
from local_chat.defaults import DEMO_MODEL
from local_chat.history import Store
from local_chat.model.meta import MetaModel

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")


@pytest.fixture(scope="module")
def demo():
    # one token per forward pass: serve()'s delay paces the answers, and Stop counts passes (no guessed runs)
    return MetaModel.from_pretrained(str(DEMO_MODEL), speculative="off")


def saved(store: Store) -> dict[str, list]:
    """Every saved conversation's messages (role and content), by title."""
    owners = [owner for (owner,) in store._db.execute("SELECT DISTINCT owner FROM conversations")]
    return {
        title: [(m["role"], m["content"]) for m in store.get(owner, cid).messages]
        for owner in owners
        for title, cid in store.titles(owner)
    }


def chat_list(page) -> list[str]:
    return page.locator(".chat-list label").all_inner_texts()


def user_texts(page) -> list[str]:
    return page.locator('[data-testid="user"]').all_inner_texts()


def wait_for_list(page, titles: list[str]) -> None:
    assert eventually(lambda: chat_list(page) == titles, timeout=15), chat_list(page)


def eventually(check, timeout: float = 10.0) -> bool:
    """Whether `check()` comes true within `timeout` seconds (the page updates after the server answers)."""
    deadline = time.time() + timeout
    while not check() and time.time() < deadline:
        time.sleep(0.1)
    return check()


def test_the_chats_clear_leaves_a_reopened_conversation_as_it_was(browser, demo, tmp_path):  # noqa: F811
    store = Store(tmp_path / "chats.db")
    with serve(demo, store=store) as (url, _):
        page = open_page(browser, url)
        send(page, "What is 23 plus 45?")
        wait_for_answer(page, lambda t: t.endswith("68."))
        page.reload()  # then reopened from the list, as a user coming back would
        page.wait_for_selector(READY)
        page.locator(".chat-list label").first.click()
        page.get_by_text("What is 23 plus 45?").first.wait_for()
        before = saved(store)
        clear = page.locator('.conversation button[aria-label="Clear"]')
        assert not clear.is_visible()  # New chat is the one way to start over
        clear.dispatch_event("click")  # Gradio's clear, pressed all the same: it means New chat
        page.wait_for_function("document.querySelectorAll('[data-testid=\"user\"]').length == 0")
        assert saved(store) == before
        send(page, "What is 2 plus 2?")
        wait_for_answer(page, lambda t: t.endswith("4."))
        after = saved(store)
        assert after["What is 23 plus 45?"] == before["What is 23 plus 45?"]  # untouched
        assert len(after) == 2  # the message after the clear started a conversation of its own


def test_a_delete_confirmation_never_deletes_another_conversation(browser, demo, tmp_path):  # noqa: F811
    store = Store(tmp_path / "chats.db")
    with serve(demo, store=store) as (url, _):
        page = open_page(browser, url)
        page.get_by_text("This conversation", exact=True).click()  # the accordion, not a note naming it
        actions = [page.get_by_role("button", name=name) for name in ("Rename", "Export JSON", "Delete")]
        assert all(action.is_disabled() for action in actions)  # nothing open: nothing to act on
        send(page, "What is the capital of France?")
        wait_for_answer(page, lambda t: t.endswith("Paris."))
        assert eventually(lambda: all(action.is_enabled() for action in actions))
        page.get_by_role("button", name="New chat").click()
        assert eventually(lambda: all(action.is_disabled() for action in actions))
        send(page, "What is the capital of Japan?")
        wait_for_answer(page, lambda t: t.endswith("Tokyo."))
        wait_for_list(page, ["What is the capital of Japan?", "What is the capital of France?"])

        page.get_by_role("button", name="Delete", exact=True).click()  # asked for Japan ...
        confirm = page.get_by_role("button", name="Yes, delete it")
        confirm.wait_for()
        page.locator(".chat-list label", has_text="France").click()  # ... then France opened
        page.get_by_text("The capital of France is Paris.").first.wait_for()
        confirm.wait_for(state="hidden")  # the confirmation went with the conversation it was asked for
        assert len(saved(store)) == 2

        page.get_by_role("button", name="Delete", exact=True).click()
        confirm.click()
        wait_for_list(page, ["What is the capital of Japan?"])
        assert list(saved(store)) == ["What is the capital of Japan?"]


def test_a_bad_attachment_does_not_block_the_next_message(browser, demo, tmp_path):  # noqa: F811
    fake = tmp_path / "fake.png"
    fake.write_text("this is a text file named .png")
    with serve(demo, store=Store(tmp_path / "chats.db")) as (url, _):
        page = open_page(browser, url)
        page.locator(".message input[type=file]").set_input_files(str(fake))
        time.sleep(1)
        send(page, "What is the capital of France?")
        page.get_by_text("fake.png is not an image this app can read").first.wait_for(timeout=15000)
        assert page.locator(".message textarea").input_value() == "What is the capital of France?"
        assert user_texts(page) == []  # the question waits in the box, not as a failed turn in the chat
        page.locator(".message textarea").press("Enter")
        assert wait_for_answer(page, lambda t: t.endswith("Paris.")) == "The capital of France is Paris."
        assert user_texts(page) == ["What is the capital of France?"]


def test_the_single_turn_example_fills_the_instruction(browser, demo):  # noqa: F811
    with serve(demo) as (url, _):
        page = open_page(browser, url)
        page.get_by_role("tab", name="Single-turn").click()
        stop = page.get_by_role("button", name="Stop", exact=True)
        assert not stop.is_visible()  # Stop only while an answer streams
        page.get_by_role("button", name="Who are you?").last.click()
        instruction = page.get_by_label("Instruction")
        page.wait_for_function("(el) => el.value !== ''", arg=instruction.element_handle())
        assert instruction.input_value() == "Who are you?"


def test_a_reload_reopens_the_conversation_that_was_open(browser, demo, tmp_path):  # noqa: F811
    store = Store(tmp_path / "chats.db")
    with serve(demo, store=store) as (url, _):
        page = open_page(browser, url)
        send(page, "What is 23 plus 45?")
        wait_for_answer(page, lambda t: t.endswith("68."))
        page.reload()
        page.wait_for_selector(READY)
        page.get_by_text("What is 23 plus 45?").nth(1).wait_for()  # in the list and in the chat
        assert user_texts(page) == ["What is 23 plus 45?"]
        assert page.locator(".chat-list input:checked").count() == 1  # and marked as open in the list
        send(page, "Add 10 to that.")
        assert wait_for_answer(page, lambda t: t.endswith("78.")).startswith("68 plus 10")
        [messages] = saved(store).values()
        assert [content for role, content in messages if role == "user"] == ["What is 23 plus 45?", "Add 10 to that."]
        page.get_by_role("button", name="New chat").click()
        page.get_by_text("This conversation", exact=True).click()  # the accordion, not a note naming it
        delete = page.get_by_role("button", name="Delete", exact=True)
        assert eventually(lambda: delete.is_disabled())  # no conversation open
        page.reload()  # after New chat, a reload shows the new, empty chat
        page.wait_for_selector(READY)
        time.sleep(1.5)
        assert user_texts(page) == []


# every control a person could press or type into, with its box on the screen
CONTROLS = """() => Array.from(document.querySelectorAll(
    'button, textarea, select, input:not([type=file]):not([type=hidden]), [role=button]'))
  .filter(e => e.getClientRects().length && getComputedStyle(e).visibility !== 'hidden')
  .filter(e => !e.closest('.sidebar:not(.open) .sidebar-content'))  // a closed sidebar's, away by design
  .map(e => { const r = e.getBoundingClientRect();
              return {name: (e.getAttribute('aria-label') || e.innerText || e.tagName).trim().slice(0, 40),
                      left: r.left, right: r.right, width: r.width}; })
  .filter(b => b.width > 0)"""


def test_at_a_phones_width_every_control_lies_on_the_screen(browser, demo, tmp_path):  # noqa: F811
    with serve(demo, store=Store(tmp_path / "chats.db")) as (url, _):
        page = browser.new_page(viewport={"width": 390, "height": 844})
        page.goto(url)
        page.wait_for_selector(READY)
        send(page, "What is the capital of France?")
        wait_for_answer(page, lambda t: t.endswith("Paris."))
        toggle = page.locator(".sidebar.conversations .toggle-button")
        for state in ("closed", "open"):
            time.sleep(1)  # the sidebar slides
            page.screenshot(path=str(ARTIFACTS / f"phone-sidebar-{state}.png"))
            off = [c for c in page.evaluate(CONTROLS) if c["left"] < 0 or c["right"] > 390]
            assert off == [], (state, off)
            box = toggle.bounding_box()  # the sidebar's arrow: whole, clear of the screen's edges
            assert box["x"] >= 2 and box["x"] + box["width"] <= 388, (state, box)
            toggle.click()
