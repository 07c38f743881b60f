"""A saved conversation as a tree of messages (schema 7): regenerating an answer or editing a question keeps what
was there as a sibling branch, and the page shows one branch at a time, from the first message down to a leaf.

The page keeps the branch on screen as its flat typed list (ui/turns.py); `path_nodes` cuts it into nodes: each
question is a node of its own, named by its "node"; the entries that follow it up to the next question (its thought,
answer, tool calls, figures) are one node, named by the question's "reply". A regeneration gives the question a new
"reply" (the new answer is a sibling of the old one); an edit is a new question (a sibling of the old question).
Entries before the first question (an imported system message, a fork's note) are the node `START`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

START = "start"
IDS = ("node", "reply")  # a question's, on the page


def new_node_id() -> str:
    return secrets.token_urlsafe(9)


@dataclass
class Node:
    id: str
    parent: str | None
    entries: list[dict]
    made: float = 0.0  # when it was first saved: siblings are shown in that order

    @property
    def is_question(self) -> bool:
        return self.entries[0].get("role") == "user"


@dataclass(frozen=True)
class Point:
    """A node of the branch on screen, for the page's controls under it: its last entry's place in the flat list,
    its siblings (itself among them, oldest first) and where it is among them."""

    index: int
    node: str
    siblings: tuple[str, ...]

    @property
    def at(self) -> int:
        return self.siblings.index(self.node)


def text_of(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def searchable(entries: list[dict]) -> str:
    """What the sidebar's search finds of a node: its questions' text (without their attachments) and its answers'."""
    texts = []
    for entry in entries:
        if entry.get("role") == "user":
            texts.append(entry.get("text") or text_of(entry.get("content")))
        elif entry.get("role") == "assistant" and entry.get("kind") is None:
            texts.append(text_of(entry.get("content")))
    return "\n".join(texts)


def first_answer(node: str) -> str:
    """The id a question's first answer has (the same wherever it is made: the page, an import, a read)."""
    return f"{node}.answer"


def with_ids(question: dict) -> dict:
    """A new question with its own node id and the id its answer will have."""
    node = new_node_id()
    return {**question, "node": node, "reply": first_answer(node)}


def answered_again(question: dict) -> dict:
    """The question with a new answer's id: the answer that comes is a sibling of the one before."""
    return {**question, "reply": new_node_id()}


def path_nodes(entries: list[dict]) -> list[Node]:
    """The page's flat list cut into its nodes, each with its parent (the node before it); the nodes' entries
    without the ids. A question without ids (an entry made before ids, or by a test) gets them in place, so the
    caller's list keeps them."""
    nodes: list[Node] = []
    reply = START  # the id of the entries that follow the last question
    for entry in entries:
        parent = nodes[-1].id if nodes else None
        if entry.get("role") == "user":
            entry.setdefault("node", new_node_id())
            entry.setdefault("reply", first_answer(entry["node"]))
            kept = {key: value for key, value in entry.items() if key not in IDS}  # the ids are the tree's
            nodes.append(Node(entry["node"], parent, [kept]))
            reply = entry["reply"]
        elif nodes and not nodes[-1].is_question:
            nodes[-1].entries.append(entry)
        else:
            nodes.append(Node(reply, parent, [entry]))
    return nodes


def flat_entries(path: list[Node]) -> list[dict]:
    """The branch `path` as the page's flat list: each question's "reply" is the answer shown after it (where it has
    one on this branch)."""
    entries = []
    for node, after in zip(path, path[1:] + [None]):
        for entry in node.entries:
            entry = dict(entry)
            if entry.get("role") == "user":
                entry["node"] = node.id
                # the answer shown after it, else the id its first answer will have (the same at every read)
                entry["reply"] = after.id if after is not None and not after.is_question else first_answer(node.id)
            entries.append(entry)
    return entries


class Shape:
    """The tree's structure (ids, parents, times), without the messages: which branch a node is on, and its
    siblings."""

    def __init__(self, rows):
        rows = list(rows)  # (id, parent, made)
        self.parent = {node: parent for node, parent, _ in rows}
        self.made = {node: made for node, _, made in rows}
        self.children: dict[str | None, list[str]] = {}
        for node, parent, _ in sorted(rows, key=lambda row: row[2]):
            self.children.setdefault(parent, []).append(node)

    def latest_leaf(self, node: str | None) -> str | None:
        """The newest message under `node` (`node` itself where it has none; under None: of the whole tree): a leaf,
        since a message is always newer than the one it follows."""
        under = [n for top in self.children.get(node, ()) for n in self.below(top)]
        return max(under, key=self.made.get, default=node)

    def path_to(self, node: str | None) -> list[str]:
        """The ids from the first message down to `node`."""
        path = []
        while node is not None and node in self.parent:
            path.append(node)
            node = self.parent[node]
        return path[::-1]

    def below(self, node: str) -> list[str]:
        """`node` and every node under it."""
        found, waiting = [], [node]
        while waiting:
            found.append(waiting.pop())
            waiting.extend(self.children.get(found[-1], ()))
        return found

    def points(self, path: list[Node]) -> list[Point]:
        """Where each node of the branch `path` ends in its flat list, with its siblings."""
        points, index = [], -1
        for node in path:
            index += len(node.entries)
            points.append(Point(index, node.id, tuple(self.children.get(node.parent, [node.id]))))
        return points
