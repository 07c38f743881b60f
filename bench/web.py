"""The web in the chat, on a local web (fixtures/web_pages.py: real HTML pages behind a local SearXNG API): the app's
own time from Send to the first token with Search the web on, beyond the search and the fetches themselves and
beyond the model's prefill of the passages (the same prompt with the passages typed in, answered side by side:
medians of interleaved repeats, the demo model); and the time to rank 50 fetched pages' passages for a question and
keep the best within the budget (web/context.py's `web_context`, the demo model's tokenizer counting).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from types import SimpleNamespace

QUESTION = "How does rustdoc document private items?"


def run(settings, demo) -> dict[str, float]:
    from fixtures.web_pages import WebSite
    from local_chat.web import FetchLimits, SearchProvider, WebResearch

    repeats = max(3, settings.api_repeats)
    with WebSite() as site:
        research = WebResearch(SearchProvider("searxng", site.url("/searxng")), FetchLimits(allow_private=True))
        results = _send_to_first_token(demo, research, repeats)
        results["web_rank_50_pages_ms"] = _ranking(demo, research, repeats) * 1000
    return results


class Timed:
    """A `WebResearch` whose searches (the provider and the fetches) are timed."""

    def __init__(self, research):
        self.research, self.reranker, self.times = research, research.reranker, []

    async def search(self, query: str):
        started = time.perf_counter()
        findings = await self.research.search(query)
        self.times.append(time.perf_counter() - started)
        return findings


def _send_to_first_token(demo, research, repeats: int) -> dict[str, float]:
    from local_chat.ui.chat import Cancels
    from local_chat.ui.chat_settings import ChatSettings
    from local_chat.ui.chat_tab import ChatTab
    from local_chat.ui.history import SavedChats
    from local_chat.ui.turns import kind_of
    from local_chat.web import put_web_in_prompt

    timed = Timed(research)
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None), web=timed)
    searching = ChatSettings(None, None, "default", None, "padded_resize", 8, 0.0, 0.75, 0, 1.0, web_search=True)
    plain = dataclasses.replace(searching, web_search=False)
    findings = asyncio.run(research.search(QUESTION))
    typed = put_web_in_prompt(tab.engine, [{"role": "user", "content": QUESTION}], 8, findings)[0][-1]["content"]

    sessions = iter(range(10**6))  # each answer a session of its own: no KV cache shared between them

    async def first_piece(text: str, chosen) -> float:
        started = time.perf_counter()
        box = {"text": text, "files": []}
        request = SimpleNamespace(session_hash=f"b{next(sessions)}", username=None)
        async for history, *_ in tab.submit(request, box, [], chosen):
            if isinstance(history, list) and kind_of(history[-1]) == "answer" and history[-1]["content"]:
                return time.perf_counter() - started
        raise AssertionError(f"no answer: {history[-1]}")

    on, typed_in, own = [], [], []
    for round_ in range(repeats + 1):
        order = ("on", "typed") if round_ % 2 == 0 else ("typed", "on")
        seconds = {kind: asyncio.run(first_piece(QUESTION if kind == "on" else typed,
                                                 searching if kind == "on" else plain)) for kind in order}  # fmt: skip
        if round_:  # the first round warms up
            on.append(seconds["on"])
            typed_in.append(seconds["typed"])
            own.append(seconds["on"] - timed.times[-1] - seconds["typed"])
    return {
        "web_send_to_first_token_s": statistics.median(on),
        "web_search_and_fetch_s": statistics.median(timed.times[1:]),
        "web_typed_to_first_token_s": statistics.median(typed_in),
        "web_own_ms": statistics.median(own) * 1000,
    }


def _ranking(demo, research, repeats: int) -> float:
    """Seconds (median) to rank 50 fetched pages' passages for the question and keep the best within the budget."""
    from local_chat.documents import token_counter
    from local_chat.web import Page, WebFindings, web_context

    read = asyncio.run(research.search(QUESTION)).pages
    pages = [Page(f"{page.url}?copy={n}", f"{page.title} ({n})", page.text) for n in range(25) for page in read[:2]]
    findings = WebFindings(QUESTION, pages=pages)
    count = token_counter(demo.engine)
    times = []
    for _ in range(repeats * 3):
        started = time.perf_counter()
        context = web_context(findings, QUESTION, 4096, count)
        times.append(time.perf_counter() - started)
    assert context.sources, "nothing ranked"
    return statistics.median(times)
