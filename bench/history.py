"""Saved conversations at scale (history/store.py): the sidebar's search over many conversations
of one login, and opening a long conversation with branches.

Made here: `settings.history_conversations` conversations (10,000 in --quick) of three turns each, their words drawn
from a vocabulary of 5,000 made-up words (Zipf-like: a few common, most rare), one word found in one conversation
only. Search: the median milliseconds of each kind of query a user types (a rare word, its first letters as typed, a
common word, its first letters, two words), and the slowest kind's median as the figure. Open: a conversation of 200
messages (100 turns) with 20 regenerated answers beside its branch on screen; the milliseconds of the page's handler
(the store's read, the chat's entries and view, the list, the controls under the messages) and, where Chromium is
installed, of the page itself: from the click in the sidebar to the conversation's last message painted, and to all
of its messages painted (the app on the demo model, logged in; interleaved with opening a short conversation,
medians, measured in the page).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

OWNER = "user:bench"
RARE = "quetzalcoatlite"
CHROMIUM = "/usr/bin/chromium"


def chromium_path() -> str | None:
    """Where Chromium is, with Playwright to drive it (None: the page's figure is left out)."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return None
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


def vocabulary(size: int = 5000) -> tuple[list[str], list[float]]:
    """Made-up words, the most common first, with their Zipf weights (the same at every call)."""
    rng = random.Random(0)
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vo", "ni", "pe", "dra", "gul", "shi", "mo", "ter", "bix"]
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(size * 2)})
    rng.shuffle(words)  # the common words spread over the alphabet, as a language's are
    return words[:size], [1 / (rank + 1) for rank in range(size)]


def text(rng: random.Random, words, weights, count: int) -> str:
    return " ".join(rng.choices(words, weights, k=count)).capitalize() + "."


def turns(rng, words, weights, count: int) -> list[dict]:
    entries = []
    for _ in range(count):
        entries.append({"role": "user", "content": text(rng, words, weights, 12)})
        entries.append({"role": "assistant", "content": text(rng, words, weights, 60)})
    return entries


def fill(store, rng, count: int) -> str:
    """`count` conversations of three turns, one holding the rare word; the id of the one with 200 messages and 20
    branches, made last."""
    from local_chat.history.tree import Node

    words, weights = vocabulary()
    with_rare = rng.randrange(count)
    for number in range(count):
        entries = turns(rng, words, weights, 3)
        if number == with_rare:
            entries[3]["content"] += f" It is called {RARE}."
        store.save(OWNER, None, entries)
    entries = turns(rng, words, weights, 100)
    nodes = [Node(f"n{i}", f"n{i - 1}" if i else None, [entry]) for i, entry in enumerate(entries)]
    for at in range(20):  # a regenerated answer beside every fifth answer of the branch on screen
        question = nodes[10 * at]
        nodes.append(Node(f"again{at}", question.id, [{"role": "assistant", "content": text(rng, words, weights, 60)}]))
    return store.put_tree(OWNER, nodes, "A long conversation", leaf=nodes[len(entries) - 1].id)


def search_figures(store, repeats: int) -> dict[str, float]:
    words, _ = vocabulary()
    queries = {"rare word": RARE, "as typed": RARE[:5], "common word": words[0], "its first letters": words[0][:3],
               "two words": f"{words[0]} {words[1]}"}  # fmt: skip
    medians = {}
    for kind, query in queries.items():
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            found = store.search(OWNER, query)
            times.append(time.perf_counter() - started)
        assert found, kind
        medians[kind] = statistics.median(times) * 1000
    return {"history_search_ms": max(medians.values()), "history_search_rare_ms": medians["rare word"]}


def open_handler_ms(store, conversation: str, repeats: int) -> float:
    from local_chat.ui.branches import nav_value
    from local_chat.ui.history import SavedChats
    from local_chat.ui.turns import view

    saved = SavedChats(store)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        found = saved.opened("bench", OWNER, conversation)
        view(saved.shown(OWNER, found.id, found.messages)), saved.choices(OWNER), nav_value(found)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


# In the page: click a conversation in the sidebar, then (ms since the click) when its last message is first in a
# painted frame, and when all its answers are (a frame is painted after each requestAnimationFrame callback).
OPEN_AND_PAINT = """async ([title, last, count]) => {
  const label = [...document.querySelectorAll('.chat-list label')].find(l => l.innerText.includes(title));
  const bots = () => document.querySelectorAll('[data-testid="bot"]');
  const shown = () => { const b = bots(); return b.length && b[b.length - 1].innerText.includes(last); };
  const frame = () => new Promise(requestAnimationFrame);
  const started = performance.now();
  label.click();
  let first = null;
  while (performance.now() - started < 30000) {
    await frame();
    if (first === null && shown()) first = performance.now() - started;
    if (first !== null && bots().length === count) return [first, performance.now() - started];
  }
  throw new Error(`the conversation did not open: ${bots().length} answers shown, ${count} wanted, ${shown()}`);
}"""


def open_paint_ms(store, demo, conversation: str, short: str, repeats: int) -> tuple[float, float] | None:
    """In Chromium, from the click on the long conversation in the sidebar: ms to its last message painted, and to
    all of its messages painted."""
    if chromium_path() is None:
        return None
    from playwright.sync_api import sync_playwright

    from local_chat.engine.in_order import InArrivalOrder
    from local_chat.launchers.loading import free_port
    from local_chat.ui import build_app
    from local_chat.ui.history import SavedChats
    from local_chat.ui.layout import PAGE

    def ends(conversation_id: str) -> tuple[str, int]:  # (its last message's start, how many answers)
        messages = store.get(OWNER, conversation_id).messages
        return messages[-1]["content"][:40], sum(m["role"] == "assistant" for m in messages)

    titles = dict((id_, title) for title, id_ in store.titles(OWNER))
    app = build_app(InArrivalOrder(demo.engine, 1), ("chat",), store=store)
    app.queue()
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
               auth=[("bench", "bench")], app_kwargs={"routes": [SavedChats(store).route()]}, **PAGE)  # fmt: skip
    times = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}")
            page.get_by_label("username").fill("bench")
            page.get_by_label("password").fill("bench")
            page.get_by_role("button", name="Login").click()
            page.wait_for_selector(".message textarea:not([disabled])", timeout=60_000)
            for _ in range(repeats + 1):
                for target in (short, conversation):
                    times.append(page.evaluate(OPEN_AND_PAINT, [titles[target][:40], *ends(target)]))
                    page.wait_for_timeout(500)  # the page's steps after the paint (its switches) end
            browser.close()
    finally:
        app.close()
    first, whole = zip(*times[3::2])  # the long conversation's, after a first round
    return statistics.median(first), statistics.median(whole)


def run(settings, demo) -> dict[str, float]:
    from local_chat.history import Store

    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        store = Store(Path(tmp) / "conversations.db")
        rng = random.Random(1)
        started = time.perf_counter()
        long = fill(store, rng, settings.history_conversations)
        short = store.titles(OWNER)[1][1]  # the latest before the long one: three turns, in the sidebar
        results = {"history_fill_s": time.perf_counter() - started}
        repeats = max(5, settings.api_repeats * 3)
        results |= search_figures(store, repeats)
        results["history_open_200_handler_ms"] = open_handler_ms(store, long, repeats)
        painted = open_paint_ms(store, demo, long, short, max(2, settings.api_repeats))
        if painted is not None:
            results["history_open_200_paint_ms"], results["history_open_200_all_ms"] = painted
        store.close()
    return results


if __name__ == "__main__":  # python -m bench.history: the quick settings alone
    from bench.settings import QUICK
    from local_chat.defaults import DEMO_MODEL
    from local_chat.model.meta import MetaModel

    print(run(QUICK, MetaModel.from_pretrained(str(DEMO_MODEL))))
