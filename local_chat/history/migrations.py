"""The saved conversations' schema steps (history/store.py runs them): the steps that bring a database from version
N-1 to N, each SQL statements or functions of the connection, run in one transaction per version."""

from __future__ import annotations

import json
import re
import sqlite3

from local_chat.documents.context import TABLES as DOCUMENT_TABLES

from .kinds import Kind
from .tree import path_nodes, searchable

# schema 1's page conventions, which schema 2 turns into kinds
V1_ERROR_MARK, V1_TITLES = "⚠️ ", {"Stopped": Kind.STOPPED, "Older turns left out": Kind.NOTICE}
V1_THOUGHT = re.compile(r"\A\s*<think>(.*?)</think>\s*", re.DOTALL)


def typed_v1_messages(db: sqlite3.Connection) -> None:
    """Schema 2: every saved message gets its kind (from schema 1's titles and error mark), and an answer's leading
    <think>...</think> becomes its own thinking message before it."""
    for conversation_id, data in db.execute("SELECT id, messages FROM conversations").fetchall():
        typed = []
        for message in json.loads(data):
            typed.extend(_typed_v1(message))
        db.execute("UPDATE conversations SET messages = ? WHERE id = ?", (json.dumps(typed, ensure_ascii=False),
                                                                           conversation_id))  # fmt: skip


def _typed_v1(message: dict) -> list[dict]:
    title = (message.get("metadata") or {}).get("title")
    content = message.get("content")
    if message.get("role") != "assistant":
        return [message]
    if title:
        return [{**message, "kind": V1_TITLES.get(title, Kind.STATS)}]
    if isinstance(content, str) and content.startswith(V1_ERROR_MARK):
        return [{**message, "kind": Kind.ERROR}]
    thought = V1_THOUGHT.match(content) if isinstance(content, str) else None
    if thought is None:
        return [message]
    thinking = {"role": "assistant", "content": thought[1].strip(), "kind": Kind.THINKING,
                "metadata": {"title": "Thinking", "status": "done"}}  # fmt: skip
    return [thinking, {**message, "content": content[thought.end() :]}]


def branches_of_messages(db: sqlite3.Connection) -> None:
    """Schema 7: each conversation's messages become one straight branch of nodes, its last the leaf on screen."""
    rows = db.execute("SELECT id, messages, created FROM conversations").fetchall()
    for conversation_id, data, created in rows:
        nodes = path_nodes(json.loads(data))
        for order, node in enumerate(nodes):
            db.execute(
                "INSERT INTO nodes (conversation, id, parent, made, entries, text) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, node.id, node.parent, created + order * 1e-3,
                 json.dumps(node.entries, ensure_ascii=False), searchable(node.entries)),
            )  # fmt: skip
        db.execute("UPDATE conversations SET leaf = ? WHERE id = ?", (nodes[-1].id if nodes else None, conversation_id))


# the full-text index (FTS5) of the messages' text (over `nodes`, by its `number`) and of the titles, kept by
# triggers as rows change
# (prefix indexes: a word's first 2 to 4 letters, as the user types them, are found without a scan of every word)
TOKENS = "tokenize = 'unicode61 remove_diacritics 2', prefix = '2 3 4'"
INDEXES = [
    f"CREATE VIRTUAL TABLE node_text USING fts5(text, content = 'nodes', content_rowid = 'number', {TOKENS})",
    "INSERT INTO node_text (node_text) VALUES ('rebuild')",
    "CREATE TRIGGER node_added AFTER INSERT ON nodes BEGIN "
    "INSERT INTO node_text (rowid, text) VALUES (new.number, new.text); END",
    "CREATE TRIGGER node_deleted AFTER DELETE ON nodes BEGIN "
    "INSERT INTO node_text (node_text, rowid, text) VALUES ('delete', old.number, old.text); END",
    "CREATE TRIGGER node_changed AFTER UPDATE OF text ON nodes WHEN old.text IS NOT new.text BEGIN "
    "INSERT INTO node_text (node_text, rowid, text) VALUES ('delete', old.number, old.text); "
    "INSERT INTO node_text (rowid, text) VALUES (new.number, new.text); END",
    f"CREATE VIRTUAL TABLE title_text USING fts5(title, conversation UNINDEXED, {TOKENS})",
    "INSERT INTO title_text (title, conversation) SELECT title, id FROM conversations",
    "CREATE TRIGGER title_added AFTER INSERT ON conversations BEGIN "
    "INSERT INTO title_text (title, conversation) VALUES (new.title, new.id); END",
    "CREATE TRIGGER title_deleted AFTER DELETE ON conversations BEGIN "
    "DELETE FROM title_text WHERE conversation = old.id; END",
    "CREATE TRIGGER title_changed AFTER UPDATE OF title ON conversations WHEN old.title IS NOT new.title BEGIN "
    "DELETE FROM title_text WHERE conversation = old.id; "
    "INSERT INTO title_text (title, conversation) VALUES (new.title, new.id); END",
]


MIGRATIONS: dict[int, list] = {
    1: [
        "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE conversations (id TEXT PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL, "
        "created REAL NOT NULL, updated REAL NOT NULL, messages TEXT NOT NULL)",
        "CREATE INDEX conversations_by_owner ON conversations (owner, updated DESC)",
    ],
    2: ["ALTER TABLE conversations ADD COLUMN options TEXT NOT NULL DEFAULT '{}'", typed_v1_messages],
    3: ["ALTER TABLE conversations ADD COLUMN revision INTEGER NOT NULL DEFAULT 0"],
    # answers carry their "model" (nothing to change in the tables): an app of schema 3, which would drop it when it
    # saves the conversation again, refuses the database instead
    4: [],
    # the tools each owner always allows (the page's tool calls, ui/tool_rounds.py); tool calls saved with their
    # approvals, which an app of schema 4 would show as plain calls
    5: ["CREATE TABLE tool_approvals (owner TEXT NOT NULL, tool TEXT NOT NULL, PRIMARY KEY (owner, tool))"],
    # the documents attached to questions (their text, stored once by SHA-256) and their passages' full-text index
    # (documents/context.py); a question names its documents, which an app of schema 5 would drop
    6: DOCUMENT_TABLES,
    # each conversation a tree of messages (history/tree.py): its nodes, the leaf of the branch on screen, pinned
    # conversations first, and the full-text index of titles and messages that the sidebar's search reads
    7: [
        "CREATE TABLE nodes (number INTEGER PRIMARY KEY, conversation TEXT NOT NULL, id TEXT NOT NULL, parent TEXT, "
        "made REAL NOT NULL, entries TEXT NOT NULL, text TEXT NOT NULL, UNIQUE (conversation, id))",
        "ALTER TABLE conversations ADD COLUMN leaf TEXT",
        "ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX conversations_pinned ON conversations (owner, pinned DESC, updated DESC)",
        branches_of_messages,
        "ALTER TABLE conversations DROP COLUMN messages",
        "CREATE TRIGGER conversation_deleted AFTER DELETE ON conversations BEGIN "
        "DELETE FROM nodes WHERE conversation = old.id; END",
        *INDEXES,
    ],
    # a question may carry the recordings a model that hears was given ({"type": "audio", "sha256"}, WAV files beside
    # the images; nothing to change in the tables): an app of schema 7, which would drop them when it saves the
    # conversation again, refuses the database instead
    8: [],
}
