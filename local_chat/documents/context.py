"""What a question's documents put in the prompt: each document whole when they all fit the room left (the context,
less the answer's room and the conversation), else the passages that match the question best (BM25 with SQLite's
FTS5, `Shelf.search`), as many as fit; each in a block with its name and its source number, which the model is asked
to cite as [1], [2]. The `Shelf` keeps the documents' text and their passages, indexed once: in the conversations'
database (history/store.py's schema 6), or in memory where nothing is saved.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from dataclasses import dataclass, field

from local_chat.prompting.chat import message_text

from .extract import Document

ROOM_MARGIN = 16  # tokens kept free beside the documents, for the template's own
PASSAGE_CHARS = 1200  # a passage: about a paragraph or two
TABLES = [
    "CREATE TABLE IF NOT EXISTS documents (sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, paged INTEGER NOT NULL, "
    "pages TEXT NOT NULL)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS passages USING fts5(sha256 UNINDEXED, page UNINDEXED, text)",
    # with --embedding_model: each passage's vector, by the model that made it (documents/vectors.py)
    "CREATE TABLE IF NOT EXISTS passage_vectors (passage INTEGER NOT NULL, model TEXT NOT NULL, vector BLOB NOT NULL, "
    "PRIMARY KEY (passage, model))",
]
RERANKED = 20  # the fused passages a --reranker orders
INSTRUCTION = "Answer from these documents where they help, and cite them by number, as [1] or [2]."
# words a question's search leaves out (where it has others): they match every passage and rank none
COMMON_WORDS = set(
    "a an the and or but of to in on at for with by from as is are was were be been being do does did what which who "
    "whom whose when where why how can could should would will shall may might must i you we me my your our about "
    "tell more please also than then so if not no yes it its this that these those there".split()
)


@dataclass(frozen=True)
class Passage:
    sha256: str
    page: int  # 1-based
    text: str


def passages_of(document: Document) -> list[Passage]:
    """A document's pages cut into passages of about `PASSAGE_CHARS`, at paragraph ends where there are some."""
    out = []
    for number, page in enumerate(document.pages, 1):
        paragraphs, current = re.split(r"\n\s*\n", page), ""
        for paragraph in paragraphs:
            if current and len(current) + len(paragraph) > PASSAGE_CHARS:
                out.append(Passage(document.sha256, number, current.strip()))
                current = ""
            current += paragraph + "\n\n"
            while len(current) > 2 * PASSAGE_CHARS:  # one long paragraph: cut where it must
                out.append(Passage(document.sha256, number, current[:PASSAGE_CHARS].strip()))
                current = current[PASSAGE_CHARS:]
        if current.strip():
            out.append(Passage(document.sha256, number, current.strip()))
    return out


class Shelf:
    """The documents' text and their passages' full-text index, in `path`'s SQLite database (":memory:": this
    process only)."""

    def __init__(self, path: str = ":memory:", embedder=None, reranker=None):
        self.embedder, self.reranker = embedder, reranker  # documents/vectors.py's, where the flags give them
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        if path == ":memory:":
            for statement in TABLES:
                self._db.execute(statement)

    def put(self, document: Document) -> None:
        """Keep `document` and index its passages, once whoever sends it again."""
        with self._lock:
            if self._db.execute("SELECT 1 FROM documents WHERE sha256 = ?", (document.sha256,)).fetchone():
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT OR IGNORE INTO documents (sha256, name, paged, pages) VALUES (?, ?, ?, ?)",
                    (document.sha256, document.name, int(document.paged), json.dumps(list(document.pages))),
                )
                self._db.executemany(
                    "INSERT INTO passages (sha256, page, text) VALUES (?, ?, ?)",
                    [(p.sha256, p.page, p.text) for p in passages_of(document)],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def get(self, sha256: str) -> Document | None:
        row = next(iter(self._query("SELECT name, paged, pages FROM documents WHERE sha256 = ?", (sha256,))), None)
        return Document(row[0], sha256, tuple(json.loads(row[2])), bool(row[1])) if row else None

    def ranked(self, shas: list[str], question: str, limit: int = 50) -> list[Passage]:
        """The passages of those documents for the question, the best first: BM25's, fused with the embedding
        model's nearest (reciprocal rank), the first of them ordered by the reranker, where the flags give them."""
        from .vectors import fused, nearest

        found = self._rows(shas, question, limit)
        if self.embedder is None and self.reranker is None:
            return [row[1] for row in found]
        by_id = dict(found)
        rankings = [[row_id for row_id, _ in found]]
        if self.embedder is not None:
            vectors = self._vectors(shas)
            close = nearest(self.embedder.embed([question])[0], vectors, limit)
            by_id |= {row_id: passage for row_id, passage in self._passages(close)}
            rankings.append(close)
        order = fused(rankings)[:limit]
        if self.reranker is not None:
            head = order[:RERANKED]
            scores = self.reranker.scores(question, [by_id[i].text for i in head])
            order = [i for _, i in sorted(zip(scores, head), key=lambda pair: -pair[0])] + order[RERANKED:]
        return [by_id[i] for i in order]

    def _vectors(self, shas: list[str]) -> list[tuple[int, bytes]]:
        """The embedding model's vector of each passage of those documents, made now where missing."""
        marks, model = ",".join("?" * len(shas)), self.embedder.name
        missing = self._query(
            f"SELECT rowid, text FROM passages WHERE sha256 IN ({marks}) AND rowid NOT IN "
            "(SELECT passage FROM passage_vectors WHERE model = ?)",
            (*shas, model),
        )
        if missing:
            made = self.embedder.embed([text for _, text in missing])
            with self._lock:
                self._db.executemany(
                    "INSERT OR IGNORE INTO passage_vectors (passage, model, vector) VALUES (?, ?, ?)",
                    [(row_id, model, vector) for (row_id, _), vector in zip(missing, made)],
                )
        return self._query(
            f"SELECT v.passage, v.vector FROM passage_vectors v JOIN passages p ON p.rowid = v.passage "
            f"WHERE p.sha256 IN ({marks}) AND v.model = ?",
            (*shas, model),
        )

    def _passages(self, ids: list[int]) -> list[tuple[int, Passage]]:
        rows = [
            next(iter(self._query("SELECT sha256, page, text FROM passages WHERE rowid = ?", (i,))), None) for i in ids
        ]
        return [(i, Passage(row[0], int(row[1]), row[2])) for i, row in zip(ids, rows) if row is not None]

    def search(self, shas: list[str], question: str, limit: int = 50) -> list[Passage]:
        """The passages of those documents that match the question's words, the best (BM25) first."""
        return [passage for _, passage in self._rows(shas, question, limit)]

    def _rows(self, shas: list[str], question: str, limit: int) -> list[tuple[int, Passage]]:
        words = {w.lower() for w in re.findall(r"\w+", question) if len(w) > 1}
        words = (words - COMMON_WORDS) or words  # a question of common words only keeps them
        if not words or not shas:
            return []
        match = " OR ".join('"' + w.replace('"', "") + '"' for w in sorted(words))
        marks = ",".join("?" * len(shas))
        rows = self._query(
            f"SELECT rowid, sha256, page, text FROM passages WHERE passages MATCH ? AND sha256 IN ({marks}) "
            "ORDER BY bm25(passages) LIMIT ?",
            (match, *shas, limit),
        )
        return [(row_id, Passage(sha, int(page), text)) for row_id, sha, page, text in rows]

    def _query(self, statement: str, values: tuple) -> list[tuple]:
        """Rows read under the lock: one connection, shared by the page's threads."""
        with self._lock:
            return self._db.execute(statement, values).fetchall()

    def close(self) -> None:
        self._db.close()


@dataclass
class Context:
    """The documents' part of a question: the text that goes before it, and the sources the answer shows."""

    text: str
    sources: list[dict]  # {"number", "name", "pages": [..], "passages": [..], "whole": bool}
    searched: bool
    note: str = ""  # where they did not fit whole: how much went in
    blocks: dict[str, str] = field(default_factory=dict)  # whole: each document's block, by its SHA-256

    @property
    def last_number(self) -> int:
        """The last source number it gave (0: none), after which other sources (the web's) are numbered."""
        return max((source["number"] for source in self.sources), default=0)


def document_context(documents: list[Document], question: str, room: int, count, shelf: Shelf) -> Context:
    """`documents` for `question` in at most `room` tokens (`count(text)`: its tokens): whole where they all fit,
    else the best passages that fit."""
    whole = [_block(n, d.name, list(enumerate(d.pages, 1)), d.paged) for n, d in enumerate(documents, 1)]
    text = _framed(whole)
    if (whole_tokens := count(text)) <= room:
        sources = [{"number": n, "name": d.name, "pages": list(range(1, len(d.pages) + 1)), "whole": True,
                    "paged": d.paged} for n, d in enumerate(documents, 1)]  # fmt: skip
        blocks = {d.sha256: block for d, block in zip(documents, whole)}
        return Context(text, sources, searched=False, blocks=blocks)
    number = {d.sha256: n for n, d in enumerate(documents, 1)}
    chosen: dict[str, list[Passage]] = {}
    for passage in shelf.ranked(list(number), question):
        trial = {**chosen, passage.sha256: [*chosen.get(passage.sha256, []), passage]}
        if count(_passages_text(documents, trial)) > room:
            break
        chosen = trial
    sources = [
        {"number": number[d.sha256], "name": d.name, "pages": sorted({p.page for p in chosen[d.sha256]}),
         "passages": [p.text for p in chosen[d.sha256]], "whole": False, "paged": d.paged}
        for d in documents if d.sha256 in chosen
    ]  # fmt: skip
    names = ", ".join(d.name for d in documents)
    passages = sum(len(found) for found in chosen.values())
    note = (
        f"{names} did not fit whole beside the conversation ({whole_tokens:,} tokens, {max(room, 0):,} left), so the "
        f"{passages} passage{'s' if passages != 1 else ''} that best match the question went in."
        if chosen
        else f"{names} did not fit beside the conversation ({max(room, 0):,} tokens left), so none of it went in; "
        "start a new chat with it, or ask with a model of a longer context."
    )
    return Context(_passages_text(documents, chosen) if chosen else "", sources, searched=True, note=note)


def _passages_text(documents: list[Document], chosen: dict[str, list[Passage]]) -> str:
    blocks = []
    for n, d in enumerate(documents, 1):
        if d.sha256 in chosen:
            pages = sorted(chosen[d.sha256], key=lambda p: p.page)
            blocks.append(_block(n, d.name, [(p.page, p.text) for p in pages], d.paged))
    return _framed(blocks)


def _block(number: int, name: str, pages: list[tuple[int, str]], paged: bool) -> str:
    unit = "page" if paged else "part"
    body = "\n\n".join(f"[{unit} {page}]\n{text.strip()}" for page, text in pages)
    return f'<document source="{number}" name="{name}">\n{body}\n</document>'


def _framed(blocks: list[str]) -> str:
    return INSTRUCTION + "\n\n" + "\n\n".join(blocks)


def conversation_documents(messages: list[dict], shelf: Shelf) -> list[Document]:
    """The documents attached to the conversation's questions so far, each once, in order."""
    found: dict[str, Document] = {}
    for message in messages:
        for named in message.get("documents") or []:
            if named["sha256"] not in found and (document := shelf.get(named["sha256"])) is not None:
                found[named["sha256"]] = document
    return list(found.values())


def put_in_prompt(engine, messages: list[dict], answer_tokens: int, shelf: Shelf) -> tuple[list[dict], Context | None]:
    """`messages` with the conversation's documents in the room the rest leaves: whole, each before the question it
    came with; else the passages that best match the last question, before it. And what went in (None: no
    documents); messages without documents as they were."""
    documents = conversation_documents(messages, shelf)
    attached = [m.get("documents") or [] for m in messages]
    messages = [{k: v for k, v in m.items() if k != "documents"} for m in messages]
    if not documents:
        return messages, None
    question = messages[-1]
    asked = message_text(question["content"])
    room = room_left(engine, messages, answer_tokens)
    context = document_context(documents, asked, room, token_counter(engine), shelf)
    if not context.text:
        return messages, context
    if context.searched:  # the passages for this question, before it
        return [*messages[:-1], with_text_before(question, context.text)], context
    # whole: each document before the question it came with, so that the conversation's start stays as it was (its
    # KV cache kept from turn to turn)
    placed, first = [], True
    for message, named in zip(messages, attached):
        blocks = [context.blocks.pop(n["sha256"]) for n in named if n["sha256"] in context.blocks]
        if blocks:
            message = with_text_before(message, (INSTRUCTION + "\n\n" if first else "") + "\n\n".join(blocks))
            first = False
        placed.append(message)
    return placed, context


def token_counter(engine):
    """A text's tokens by the engine's tokenizer, as a function."""
    tokenizer = engine.tokenizer
    return lambda text: len(tokenizer.encode(text))


def room_left(engine, messages: list[dict], answer_tokens: int) -> int:
    """The tokens left beside `messages` and the answer's room (at most half the context) in the engine's context."""
    count = token_counter(engine)
    used = sum(count(message_text(m["content"])) for m in messages)
    return engine.max_seq_len - min(answer_tokens, engine.max_seq_len // 2) - used - ROOM_MARGIN


def with_text_before(message: dict, text: str) -> dict:
    """`message` with `text` before its own (its images, where it has some, still first)."""
    content = message["content"]
    if not isinstance(content, list):
        return {**message, "content": f"{text}\n\n{content}"}
    kept = [p for p in content if not (isinstance(p, dict) and p.get("type") == "text")]
    return {**message, "content": [*kept, {"type": "text", "text": f"{text}\n\n{message_text(content)}"}]}
