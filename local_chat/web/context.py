"""What a web search puts before a question: the question made a standalone query (`standalone_query`: a follow-up
takes the words of the question before it), searched (web/search.py), its first pages fetched at once
(web/pages.py), cut into passages and ranked against the question with the documents' BM25 (documents/context.py's
`Shelf`, ordered by `--reranker` where given), the best ones put in within a token budget, each page a numbered
source that the answer is asked to cite as [1], [2]. What failed (the provider, a page) is one sentence each in
the Sources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from local_chat.documents import Document, Shelf
from local_chat.documents.context import COMMON_WORDS
from local_chat.errors import UserError

from .pages import FetchLimits, Page, PageFailure, address_name, fetch_pages
from .search import SearchHit, SearchProvider

PAGES = 5  # the search's first pages fetched
WEB_TOKENS = 2048  # the passages' budget, at most, in the room the conversation and the answer leave
PASSAGES_A_PAGE = 4  # at most, so that several pages are heard
INSTRUCTION = "Answer from these web pages where they help, and cite them by number, as [1] or [2]."
FOLLOW_UP_WORDS = 8  # a question of at most this many words, or one that points back ("it", "they"...), follows up
POINTING_BACK = set("it its it's they them their theirs this that these those he him his she her there one".split())
QUERY_CHARS = 200


def standalone_query(messages: list[dict]) -> str:
    """The last question as a query that stands alone: a follow-up (short, or pointing back) with the words of the
    question before it that it lacks."""
    from local_chat.prompting import message_text

    asked = [message_text(m["content"]).strip() for m in messages if m.get("role") == "user"]
    asked = [text for text in asked if text]
    if not asked:
        return ""
    last = " ".join(asked[-1].split())
    words = re.findall(r"[\w'-]+", last.lower())
    if len(asked) > 1 and (len(words) <= FOLLOW_UP_WORDS or POINTING_BACK & set(words)):
        before = re.findall(r"[\w'-]+", asked[-2])
        extra = [w for w in dict.fromkeys(before) if w.lower() not in COMMON_WORDS and w.lower() not in words]
        last = " ".join([last, *extra])
    return last[:QUERY_CHARS]


@dataclass
class WebFindings:
    """A search's outcome: its query, hits and pages read, and the sentences of what failed."""

    query: str
    hits: list[SearchHit] = field(default_factory=list)
    pages: list[Page] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # the provider's, then each page's


@dataclass(frozen=True)
class WebResearch:
    """A provider and how pages are fetched: what the page's switch, /v1's `web_search_options` and the model's
    tools use."""

    provider: SearchProvider
    limits: FetchLimits = FetchLimits()
    pages: int = PAGES
    reranker: object = None  # documents/vectors.py's, with --reranker

    async def search(self, query: str) -> WebFindings:
        """`query` searched, and its first pages fetched at once."""
        findings = WebFindings(query)
        if not query:
            findings.failures.append("There was no question to search the web for.")
            return findings
        try:
            findings.hits = await self.provider.search(query, self.pages)
        except UserError as error:
            findings.failures.append(str(error))
            return findings
        if not findings.hits:
            findings.failures.append(f"The web search ({self.provider.name}) found nothing for “{query}”.")
        for hit, read in zip(findings.hits, await fetch_pages([hit.url for hit in findings.hits], self.limits)):
            if isinstance(read, PageFailure):
                findings.failures.append(read.sentence)
            elif read.title == address_name(read.url) and hit.title:  # named by its address (a PDF): the search's title
                findings.pages.append(replace(read, title=hit.title))
            else:
                findings.pages.append(read)
        return findings


@dataclass
class WebContext:
    """The web's part of a question: the text that goes before it, and the sources the answer shows."""

    text: str
    sources: list[dict]  # {"number", "name" (the title), "url", "passages": [...], "whole": False}
    note: str = ""  # what failed, and the query searched


def web_context(findings: WebFindings, question: str, room: int, count, first: int = 1, reranker=None) -> WebContext:
    """The best passages of `findings`' pages for `question` in at most `room` tokens (and `WEB_TOKENS`; `count`:
    a text's tokens), their pages numbered from `first`."""
    budget = min(room, WEB_TOKENS) - count(INSTRUCTION) - 8
    by_sha = {page.sha256: page for page in findings.pages}
    shelf = Shelf(reranker=reranker)
    for page in findings.pages:
        shelf.put(Document(page.title, page.sha256, (page.text,)))
    chosen: dict[str, list[str]] = {}
    used = 0
    for passage in shelf.ranked(list(by_sha), question) if budget > 0 else []:
        page = by_sha[passage.sha256]
        taken = chosen.get(page.sha256, [])
        cost = count(passage.text) + (0 if taken else count(_header(0, page)) + 4)
        if len(taken) >= PASSAGES_A_PAGE or used + cost > budget:
            continue
        chosen[page.sha256] = [*taken, passage.text]
        used += cost
    shelf.close()
    pages = [page for page in findings.pages if page.sha256 in chosen]  # in the search's order
    sources = [{"number": first + n, "name": page.title, "url": page.url, "passages": chosen[page.sha256],
                "whole": False} for n, page in enumerate(pages)]  # fmt: skip
    blocks = [_header(first + n, page) + "\n" + "\n\n".join(chosen[page.sha256]) + "\n</page>"
              for n, page in enumerate(pages)]  # fmt: skip
    note = " ".join([f"Searched the web for “{findings.query}”.", *findings.failures])
    if findings.pages and not pages:
        note += " None of the pages read matches the question's words, so none went in."
    return WebContext(INSTRUCTION + "\n\n" + "\n\n".join(blocks) if blocks else "", sources, note)


def _header(number: int, page: Page) -> str:
    title = page.title.replace('"', "'")
    return f'<page source="{number}" title="{title}" url="{page.url}">'


def put_web_in_prompt(
    engine, messages: list[dict], answer_tokens: int, findings: WebFindings, first: int = 1, reranker=None
) -> tuple[list[dict], WebContext]:
    """`messages` with the best passages of `findings` for the last question before it, in the room the rest leaves
    (at most half the context, and `WEB_TOKENS`), their pages numbered from `first`; and what went in."""
    from local_chat.documents import room_left, token_counter, with_text_before
    from local_chat.prompting import message_text

    question = messages[-1]
    room = min(room_left(engine, messages, answer_tokens), engine.max_seq_len // 2)
    context = web_context(findings, message_text(question["content"]), room, token_counter(engine), first, reranker)
    if not context.text:
        return messages, context
    return [*messages[:-1], with_text_before(question, context.text)], context
