"""The saved conversations' branches, pins and search: a mixin of `Store` (history/store.py), over its connection.

- `switch` shows another branch (down to its newest message), `delete_branch` deletes a message with everything
  under it, `fork` makes a new conversation of the branch down to a message, `put_tree` writes a whole tree (an
  import).
- `search` finds an owner's conversations by the words of their titles and messages (SQLite FTS5, kept by triggers,
  history/migrations.py): the last word as a prefix (results as the user types), titles first, then messages, each
  newest first (the index's own order: no sort of every match), one result per conversation, each with the message
  that matched and its words in their context.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import NamedTuple

from local_chat.errors import UserError

from .tree import START, Node, Shape

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


class Branches:
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
