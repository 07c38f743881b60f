"""Saved conversations: one SQLite database (standard library, WAL mode) at --history_db, the images beside it.

- Each conversation belongs to an owner (the login name with --auth, else an unguessable id kept in the browser);
  every read and write names its owner, and a conversation of another owner is refused whatever id is asked for.
- Messages are stored as the page keeps them (ui/turns.py): {"role", "content", "metadata"?, "kind"?}, content a
  string or a list of parts, `{"type": "text", "text"}`, `{"type": "image", "sha256"}` or (schema 8) a recording a
  model that hears was given, `{"type": "audio", "sha256"}`; a reasoning model's thought
  is its own "thinking" message before its answer (schema 2; schema 1 kept it in the answer's text, and kinds in
  titles and text). An answer carries the "model" that gave it where the page picks among models (schema 4): the
  latest one is the conversation's model, which reopening it offers. A conversation's page options
  (its thinking switch) are kept beside its messages.
- A conversation is a tree of messages (schema 7, history/tree.py): a regenerated answer or an edited question is a
  sibling of the one before, and the page shows one branch, from the first message to the conversation's `leaf`.
  `save` writes the branch on screen (its nodes added or changed, the others kept); `switch` shows another branch
  (down to its newest message), `delete_branch` deletes a message with everything under it, `fork` makes a new
  conversation of the branch down to a message, `put_tree` writes a whole tree (an import).
- `search` finds an owner's conversations by the words of their titles and messages (SQLite FTS5, kept by triggers,
  history/migrations.py): the last word as a prefix (results as the user types), titles first, then messages, each
  newest first (the index's own order: no sort of every match), one result per conversation, each with the message
  that matched and its words in their context. Conversations can be pinned to the top of their owner's list.
- Images are PNG files (recordings WAV files) named by the SHA-256 of their bytes, in a folder beside the database:
  the same image is never stored twice. The page gets them only through `image_url`'s signed addresses
  (ui/history.py's route checks them against the conversation's owner), never through Gradio's file serving.
- The schema has a version (`PRAGMA user_version`) and migrations from the first version on. A database that is
  corrupt, locked by another process or of a newer schema is one sentence (`UserError`), never replaced or
  overwritten. Apps starting together migrate it once: each step re-reads the version inside its transaction.
- Several apps on one machine may use one database at once (WAL mode, no lock of their own): each conversation has a
  revision, one more at each save, and a page's save names the revision that page read; a conversation changed
  since (in another window, or another app) is not overwritten: the save is refused (`Changed`) and the page says
  to reload it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from local_chat.errors import UserError

from .kinds import Kind
from .migrations import MIGRATIONS
from .tree import START, Node, Point, Shape, flat_entries, path_nodes, searchable, text_of

APP_NAME = "local-chat"
SCHEMA_VERSION = 8
TITLE_CHARS = 60
LOCK_TIMEOUT_S = 5.0
NO_SUCH = "There is no such conversation among yours; it may have been deleted."
GONE = "That message is no longer in this conversation (deleted in another window?); reopen the conversation."
SEARCHED_ROWS = 200  # the newest matching messages looked at, at most, for one search
SNIPPET_WORDS = 12


class Found(NamedTuple):
    conversation: str
    title: str
    node: str | None  # the message that matched; None: the title did
    snippet: str  # the matching words in their context, each between `marks`


def match_query(text: str) -> str | None:
    """An FTS5 query for what the user typed: every word, the last one as a prefix; None where it holds no word."""
    words = re.findall(r"\w+", text)
    if not words:
        return None
    return " ".join(f'"{word}"' for word in words) + "*"


def default_db_path() -> Path:
    """Where conversations are kept by default: $XDG_DATA_HOME/local-chat/ (else ~/.local/share/local-chat/)."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / APP_NAME / "conversations.db"


@dataclass
class SavedConversation:
    """One saved conversation as the store returns it (not Accessory's template class `Conversation`, templates/;
    the page keeps only its `id`)."""

    id: str
    title: str
    updated: float
    messages: list[dict]
    options: dict = field(default_factory=dict)  # the page's choices for it (its thinking switch)
    revision: int = 0  # one more at each save: a page that read an older one saves nothing (`Changed`)
    model: str | None = None  # its latest answer's model, where the answers name theirs (a page with a picker)
    points: list[Point] = field(default_factory=list)  # the nodes of the branch on screen, with their siblings


class Saved(NamedTuple):
    id: str
    revision: int


class Changed(UserError):
    """A save refused: the conversation changed (in another window or app) after the saving page read it."""

    def __init__(self):
        super().__init__("This conversation changed in another window; reload it (your message is kept here).")


def latest_model(messages: list[dict]) -> str | None:
    """The model of the latest answer that names one."""
    return next((m["model"] for m in reversed(messages) if isinstance(m.get("model"), str)), None)


def title_of(messages: list[dict]) -> str:
    """A conversation's default title: the start of its first user message's text, but for a message refused with
    an error (a message too long for the model, say)."""
    for index, message in enumerate(messages):
        after = next((m for m in messages[index + 1 :] if m.get("kind") not in (Kind.NOTICE, Kind.STATS)), {})
        if message.get("role") == "user" and after.get("kind") != Kind.ERROR:
            text = " ".join((message.get("text") or text_of(message["content"])).split())  # without its attachments
            if text:
                return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"
    return "New chat"


def media_hashes(messages: list[dict]) -> set[str]:
    """The digests of the images and recordings among `messages`' parts."""
    return {
        part["sha256"]
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") in ("image", "audio")
    }


class Store:
    """The conversations of every owner, in one SQLite file that several apps on one machine may share (WAL mode;
    each save checks the revision its page read)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.images = self.path.with_name(self.path.stem + "-images")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.images.mkdir(exist_ok=True)
        except OSError as error:
            raise UserError(f"The history folder {self.path.parent} cannot be created ({error.strerror}); pass "
                            "--history_db with a writable place, or --no_history.")  # fmt: skip
        self._write = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, timeout=LOCK_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            self._use_wal()
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives the app's crash
            self._migrate()
            if self._db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("quick_check failed")
            self.keys = self._keys()
        except sqlite3.OperationalError as error:
            if "locked" in str(error) or "busy" in str(error):
                raise UserError(
                    f"The history database {self.path} is locked by another program; close it, or pass "
                    "--history_db with another file (or --no_history)."
                )
            raise self._damaged(error)
        except sqlite3.DatabaseError as error:
            raise self._damaged(error)

    def _use_wal(self) -> None:
        """WAL mode, which stays with the file once set. Two apps opening a database not yet in it at once (a first
        start, or one an older SQLite wrote) may find it locked while the other switches it: SQLite waits for no
        busy timeout there, so this does, as long as for any other lock."""
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _damaged(self, error: Exception) -> UserError:
        return UserError(
            f"The history database {self.path} cannot be read ({error}): it is damaged or not a database. It was "
            "left as it is; move it away to start a new one, or pass --history_db with another file (or --no_history)."
        )

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise UserError(
                f"The history database {self.path} was written by a newer version of this app (schema {version}; "
                f"this one reads up to {SCHEMA_VERSION}); update the app, or pass --history_db with another file."
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self._transaction():
                if self._db.execute("PRAGMA user_version").fetchone()[0] >= target:
                    continue  # another app upgraded it meanwhile
                for step in MIGRATIONS[target]:
                    step(self._db) if callable(step) else self._db.execute(step)
                self._db.execute(f"PRAGMA user_version = {target}")

    def _transaction(self):
        store = self

        class Transaction:
            def __enter__(self):
                store._write.acquire()
                store._db.execute("BEGIN IMMEDIATE")

            def __exit__(self, kind, error, trace):
                try:
                    store._db.execute("COMMIT" if kind is None else "ROLLBACK")
                finally:
                    store._write.release()

        return Transaction()

    def _keys(self) -> dict[str, str]:
        """The database's own secrets, made once: the browser id's storage key and its encryption secret (kept here,
        so a restart does not orphan every browser's conversations), and the key that signs image addresses."""
        wanted = ("browser_storage_key", "browser_secret", "image_key")
        with self._transaction():
            for name in wanted:
                self._db.execute(
                    "INSERT OR IGNORE INTO settings (key, value) VALUES (?, ?)", (name, secrets.token_hex(32))
                )
        rows = self._db.execute("SELECT key, value FROM settings").fetchall()
        return {key: value for key, value in rows if key in wanted}

    # ----- conversations -----

    def titles(self, owner: str) -> list[tuple[str, str]]:
        """(title, id) of `owner`'s conversations: the pinned ones first, then the latest changed first."""
        return [(title, id_) for title, id_, _ in self.listing(owner)]

    def listing(self, owner: str, limit: int = -1) -> list[tuple[str, str, bool]]:
        """(title, id, pinned) of `owner`'s conversations, in `titles`' order (the first `limit`; -1: all)."""
        rows = self._db.execute(
            "SELECT title, id, pinned FROM conversations WHERE owner = ? ORDER BY pinned DESC, updated DESC LIMIT ?",
            (owner, limit),
        ).fetchall()
        return [(title, id_, bool(pinned)) for title, id_, pinned in rows]

    def get(self, owner: str, conversation_id: str) -> SavedConversation:
        """`owner`'s conversation, with the branch on screen as its messages."""
        row = self._db.execute(
            "SELECT id, title, updated, options, revision, leaf FROM conversations WHERE id = ? AND owner = ?",
            (str(conversation_id), owner),
        ).fetchone()
        if row is None:
            raise UserError(NO_SUCH)
        shape = self._shape(row[0])
        path = self._nodes(row[0], shape.path_to(row[5]))
        messages = flat_entries(path)
        options, points = json.loads(row[3]), shape.points(path)
        return SavedConversation(row[0], row[1], row[2], messages, options, row[4], latest_model(messages), points)

    def _shape(self, conversation_id: str) -> Shape:
        return Shape(self._db.execute("SELECT id, parent, made FROM nodes WHERE conversation = ?", (conversation_id,)))

    def _nodes(self, conversation_id: str, ids: list[str]) -> list[Node]:
        """The nodes `ids` of a conversation, in that order."""
        places = ", ".join("?" * len(ids))
        rows = self._db.execute(
            f"SELECT id, parent, entries, made FROM nodes WHERE conversation = ? AND id IN ({places})",
            (conversation_id, *ids),
        )
        found = {id_: Node(id_, parent, json.loads(entries), made) for id_, parent, entries, made in rows}
        return [found[id_] for id_ in ids]

    def save(
        self,
        owner: str,
        conversation_id: str | None,
        messages: list[dict],
        title: str | None = None,
        options: dict | None = None,
        read: int | None = None,
    ) -> Saved:
        """Write `messages` (the branch on screen, history/tree.py; and `options`, where given) into the conversation
        `conversation_id` of `owner` (a new one when None): its nodes added or changed, the other branches kept, the
        last node the leaf on screen. Its id and its revision now. `read`: the revision the saving page read (None:
        no check); where the conversation has another by now, nothing is written (`Changed`)."""
        now = time.time()
        nodes = path_nodes(messages)
        leaf = nodes[-1].id if nodes else None
        kept = json.dumps(options or {})
        with self._transaction():
            if conversation_id is not None:
                row = self._db.execute(
                    "SELECT owner, revision, title, leaf FROM conversations WHERE id = ?", (conversation_id,)
                ).fetchone()
                if row is not None and row[0] != owner:
                    raise UserError(NO_SUCH)
                if row is not None:
                    if read is not None and row[1] != read:
                        raise Changed()
                    # a title the user never changed follows the messages (a refused first message gives none)
                    shown = self.branch_title(conversation_id, self._shape(conversation_id), row[3])
                    kept_title = row[2] if title is None and row[2] != shown else None
                    self._put_nodes(conversation_id, nodes, now)
                    self._db.execute(
                        "UPDATE conversations SET updated = ?, revision = revision + 1, title = ?, leaf = ?, "
                        "options = CASE WHEN ? THEN ? ELSE options END WHERE id = ?",
                        (now, title or kept_title or title_of(messages), leaf, options is not None, kept,
                         conversation_id),
                    )  # fmt: skip
                    return Saved(conversation_id, row[1] + 1)
            conversation_id = conversation_id or secrets.token_urlsafe(16)
            self._insert(conversation_id, owner, title or title_of(messages), kept, nodes, leaf, now)
        return Saved(conversation_id, 0)

    def _insert(self, conversation_id: str, owner: str, title: str, options: str, nodes, leaf, now: float) -> None:
        """A new conversation and its `nodes`, `leaf` on screen (in the caller's transaction)."""
        self._db.execute(
            "INSERT INTO conversations (id, owner, title, created, updated, options, leaf) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, owner, title, now, now, options, leaf),
        )
        self._put_nodes(conversation_id, nodes, now)

    def branch_title(self, conversation_id: str, shape: Shape, leaf: str | None) -> str:
        """The title the branch down to `leaf` gives (its first question's start)."""
        return title_of(flat_entries(self._nodes(conversation_id, shape.path_to(leaf)[:3])))

    def _put_nodes(self, conversation_id: str, nodes: list[Node], now: float) -> None:
        """Add `nodes` to the conversation's tree (made now, in their order, where they name no time), or change those
        it has (only those whose messages changed)."""
        ids = [node.id for node in nodes]
        places = ", ".join("?" * len(ids))
        had = dict(self._db.execute(
            f"SELECT id, entries FROM nodes WHERE conversation = ? AND id IN ({places})", (conversation_id, *ids)
        ))  # fmt: skip
        for order, node in enumerate(nodes):
            data = json.dumps(node.entries, ensure_ascii=False)
            if had.get(node.id) != data:
                self._db.execute(
                    "INSERT INTO nodes (conversation, id, parent, made, entries, text) VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (conversation, id) DO UPDATE SET parent = excluded.parent, "
                    "entries = excluded.entries, text = excluded.text",
                    (
                        conversation_id,
                        node.id,
                        node.parent,
                        node.made or now + order * 1e-6,
                        data,
                        searchable(node.entries),
                    ),
                )

    def rename(self, owner: str, conversation_id: str, title: str) -> None:
        title = " ".join((title or "").split())[:200]
        if not title:
            raise UserError("The new title is empty; type one first.")
        self._change(owner, conversation_id, "UPDATE conversations SET title = ? WHERE id = ? AND owner = ?", title)

    def delete(self, owner: str, conversation_id: str) -> None:
        self._change(owner, conversation_id, "DELETE FROM conversations WHERE id = ? AND owner = ?")  # its nodes too

    def _change(self, owner: str, conversation_id: str, statement: str, *values) -> None:
        with self._transaction():
            if not self._db.execute(statement, (*values, str(conversation_id), owner)).rowcount:
                raise UserError(NO_SUCH)

    # ----- the tools an owner always allows -----

    def always_allowed(self, owner: str) -> list[str]:
        rows = self._db.execute("SELECT tool FROM tool_approvals WHERE owner = ? ORDER BY tool", (owner,))
        return [tool for (tool,) in rows.fetchall()]

    def allow_always(self, owner: str, tools: list[str], allowed: bool = True) -> None:
        """Add `tools` to `owner`'s always-allowed ones (`allowed`), or take them off."""
        with self._transaction():
            for tool in tools:
                statement = (
                    "INSERT OR IGNORE INTO tool_approvals (owner, tool) VALUES (?, ?)"
                    if allowed
                    else "DELETE FROM tool_approvals WHERE owner = ? AND tool = ?"
                )
                self._db.execute(statement, (owner, tool))

    # ----- images -----

    def put_image(self, png: bytes) -> str:
        """Keep a PNG (once, whoever sends it again); its SHA-256."""
        return self._put(png, ".png")

    def put_sound(self, wav: bytes) -> str:
        """Keep a recording as a WAV file (once); its SHA-256."""
        return self._put(wav, ".wav")

    def _put(self, data: bytes, suffix: str) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.images / f"{digest}{suffix}"
        if not path.exists():
            partial = path.with_suffix(f".{secrets.token_hex(4)}.part")
            partial.write_bytes(data)
            partial.replace(path)  # whole or absent, even if the app is killed meanwhile
        return digest

    def image_path(self, digest: str) -> Path:
        return self.images / f"{digest}.png"

    def sound_path(self, digest: str) -> Path:
        return self.images / f"{digest}.wav"

    def image_signature(self, owner: str, conversation_id: str, digest: str) -> str:
        message = f"{owner}\n{conversation_id}\n{digest}".encode()
        return hmac.new(bytes.fromhex(self.keys["image_key"]), message, hashlib.sha256).hexdigest()[:32]

    def signed(self, owner: str, conversation_id: str, digest: str, signature: str) -> bool:
        """Whether `signature` is the one `owner` was given for image `digest` of conversation `conversation_id`."""
        return hmac.compare_digest(self.image_signature(owner, conversation_id, digest), signature)

    def image_for_owner_of(self, conversation_id: str, digest: str, signature: str) -> Path | None:
        """The image (or recording) `digest` of conversation `conversation_id` (on any of its branches) when
        `signature` is the one its owner was given."""
        row = self._db.execute("SELECT owner FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        rows = self._db.execute("SELECT entries FROM nodes WHERE conversation = ?", (conversation_id,))
        if row is None or digest not in media_hashes([e for (data,) in rows for e in json.loads(data)]):
            return None
        if not self.signed(row[0], conversation_id, digest, signature):
            return None
        return next((path for path in (self.image_path(digest), self.sound_path(digest)) if path.exists()), None)

    # ----- branches, pins and search -----

    def _owned_shape(self, owner: str, conversation_id: str, node: str | None = None) -> Shape:
        row = self._db.execute("SELECT owner FROM conversations WHERE id = ?", (str(conversation_id),)).fetchone()
        if row is None or row[0] != owner:
            raise UserError(NO_SUCH)
        shape = self._shape(conversation_id)
        if node is not None and node not in shape.parent:
            raise UserError(GONE)
        return shape

    def switch(self, owner: str, conversation_id: str, node: str) -> None:
        """Show the branch through `node`, down to its newest message (a title the user never set follows it)."""
        with self._transaction():
            shape = self._owned_shape(owner, conversation_id, node)
            leaf = shape.latest_leaf(node)
            title, shown = self._db.execute(
                "SELECT title, leaf FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            if title == self.branch_title(conversation_id, shape, shown):
                title = self.branch_title(conversation_id, shape, leaf)
            self._db.execute(
                "UPDATE conversations SET leaf = ?, title = ? WHERE id = ?", (leaf, title, conversation_id)
            )

    def delete_branch(self, owner: str, conversation_id: str, node: str) -> None:
        """Delete `node` and everything under it; where the branch on screen went with it, the newest branch left
        under its parent is shown."""
        with self._transaction():
            shape = self._owned_shape(owner, conversation_id, node)
            gone = shape.below(node)
            self._db.execute(
                f"DELETE FROM nodes WHERE conversation = ? AND id IN ({', '.join('?' * len(gone))})",
                (conversation_id, *gone),
            )
            (leaf,) = self._db.execute("SELECT leaf FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            if leaf in gone:
                leaf = self._shape(conversation_id).latest_leaf(shape.parent[node])
            self._db.execute(
                "UPDATE conversations SET leaf = ?, updated = ?, revision = revision + 1 WHERE id = ?",
                (leaf, time.time(), conversation_id),
            )

    def fork(self, owner: str, conversation_id: str, node: str, note: dict) -> str:
        """A new conversation of `owner` holding the branch down to `node`, titled "TITLE (fork)", with `note` (where
        it came from) before its first question; its id."""
        path = self._nodes(conversation_id, self._owned_shape(owner, conversation_id, node).path_to(node))
        (title,) = self._db.execute("SELECT title FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if path[0].id == START:
            path[0] = Node(START, None, [note, *path[0].entries], path[0].made)
        else:
            first = path[0]
            path[0] = Node(first.id, START, first.entries, first.made)
            path.insert(0, Node(START, None, [note], first.made - 1e-3))
        return self.put_tree(owner, path, f"{title} (fork)", options={"forked_from": conversation_id})

    def put_tree(self, owner: str, nodes: list[Node], title: str, leaf: str | None = None, options=None) -> str:
        """A new conversation of `owner` holding `nodes` (parents before children), `leaf` (default: the last node)
        on screen; its id."""
        conversation_id, now = secrets.token_urlsafe(16), time.time()
        leaf = leaf if leaf is not None else (nodes[-1].id if nodes else None)
        with self._transaction():
            self._insert(conversation_id, owner, title, json.dumps(options or {}), nodes, leaf, now)
        return conversation_id

    def tree(self, owner: str, conversation_id: str) -> tuple[list[Node], str | None]:
        """Every node of the conversation (parents before children, siblings oldest first) and the leaf on screen."""
        self._owned_shape(owner, conversation_id)
        rows = self._db.execute(
            "SELECT id, parent, entries, made FROM nodes WHERE conversation = ? ORDER BY made, number",
            (conversation_id,),
        )
        nodes = [Node(id_, parent, json.loads(entries), made) for id_, parent, entries, made in rows]
        (leaf,) = self._db.execute("SELECT leaf FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return nodes, leaf

    def pin(self, owner: str, conversation_id: str, pinned: bool = True) -> None:
        """Keep the conversation at the top of `owner`'s list (`pinned`), or not."""
        self._change(owner, conversation_id, "UPDATE conversations SET pinned = ? WHERE id = ? AND owner = ?", pinned)

    def pinned(self, owner: str, conversation_id: str) -> bool:
        row = self._db.execute(
            "SELECT pinned FROM conversations WHERE id = ? AND owner = ?", (str(conversation_id), owner)
        ).fetchone()
        return bool(row and row[0])

    def search(self, owner: str, text: str, limit: int = 20, marks=("[", "]")) -> list[Found]:
        """`owner`'s conversations whose title or messages hold the words of `text` (the last one as a prefix)."""
        query = match_query(text)
        if query is None:
            return []
        found: dict[str, Found] = {}
        titles = self._db.execute(
            "SELECT t.conversation, c.title, highlight(title_text, 0, ?, ?) FROM title_text t "
            "JOIN conversations c ON c.id = t.conversation WHERE title_text MATCH ? AND c.owner = ? "
            "ORDER BY t.rowid DESC LIMIT ?",
            (*marks, query, owner, limit),
        )
        for conversation, title, marked in titles:
            found.setdefault(conversation, Found(conversation, title, None, marked))
        messages = self._db.execute(
            "SELECT n.conversation, c.title, n.id, snippet(node_text, 0, ?, ?, '…', ?) FROM node_text "
            "JOIN nodes n ON n.number = node_text.rowid JOIN conversations c ON c.id = n.conversation "
            "WHERE node_text MATCH ? AND c.owner = ? ORDER BY node_text.rowid DESC LIMIT ?",
            (*marks, SNIPPET_WORDS, query, owner, SEARCHED_ROWS),
        )
        for conversation, title, node, snippet in messages:
            if len(found) >= limit:
                break
            found.setdefault(conversation, Found(conversation, title, node, snippet))
        return list(found.values())

    def close(self) -> None:
        self._db.close()
