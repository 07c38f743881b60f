"""Saved conversations as files (`Exports`, which `SavedChats.exports` of ui/history.py makes): a JSON export (the
branch on screen as OpenAI-style messages, and every branch under "tree") or a Markdown one (the branch on screen),
and their import as a new conversation, which checks every image as an upload and reads no document again."""

from __future__ import annotations

import base64
import json
import re
import tempfile
from pathlib import Path

from local_chat.errors import UserError
from local_chat.history.store import title_of
from local_chat.history.tree import Node, Shape, flat_entries
from local_chat.prompting import image_from_data_url, message_text, png_bytes, png_data_url
from local_chat.prompting.chat import AUDIO_PART_TYPES
from local_chat.prompting.messages import part_clip
from local_chat.voice.clips import wav_bytes

from .documents import exported_documents, imported_documents, imported_sources
from .turns import model_view, thinking, tool_call, tool_result

EXPORT_ROLES = ("system", "user", "assistant", "tool")
BROKEN_TREE = (
    'The file\'s "tree" is not one this app wrote (a node without messages, an id twice, or a parent after its '
    'child); remove the "tree" key to import the branch of its "messages".'
)
THOUGHT_MD = re.compile(r"\A<details><summary>Thinking</summary>\n\n(.*?)\n\n</details>\n\n", re.DOTALL)
MD_IMAGE = re.compile(r"^!\[image\]\((data:image/[^)\s]+)\)$", re.MULTILINE)  # an image, as markdown_turn writes it
MD_TURN = re.compile(r"^## (System|User|Assistant|Tool)(?: · ([^\n]+))?\n\n", re.MULTILINE)  # an answer's model


def well_formed(nodes: list[Node]) -> bool:
    """Whether imported `nodes` make a tree the page can show: string ids once each, each parent before its child,
    each node a question alone or entries with no question among them."""
    seen: set = set()
    for node in nodes:
        questions = sum(entry.get("role") == "user" for entry in node.entries)
        whole = questions == 0 or (questions == 1 and len(node.entries) == 1)
        if not (isinstance(node.id, str) and node.id not in seen and node.entries and whole):
            return False
        if node.parent is not None and node.parent not in seen:
            return False
        seen.add(node.id)
    return True


class Exports:
    """Exports of `store`'s conversations, and imports into it (the documents' text from and to `shelf`; images
    checked as uploads of at most `max_upload_mb` are)."""

    def __init__(self, store, shelf, max_upload_mb: float):
        self.store, self.shelf, self.max_upload_mb = store, shelf, max_upload_mb

    def export(self, owner: str, conversation_id: str, kind: str) -> str:
        """A file holding the conversation as JSON (the branch on screen as OpenAI-style messages, images as data:
        URLs, a thought as its answer's `reasoning_content`; and every branch under "tree", each node's messages
        alike) or Markdown (the branch on screen, a thought folded in `<details>`)."""
        conversation = self.store.get(owner, conversation_id)
        messages = self._exported_messages(conversation.messages)
        if kind == "json":
            nodes, leaf = self.store.tree(owner, conversation_id)
            every = [{"id": n.id, "parent": n.parent, "messages": self._exported_messages(n.entries)} for n in nodes]
            tree = {"leaf": leaf, "nodes": every}
            data = {"title": conversation.title, "messages": messages, "tree": tree}
            data = json.dumps(data, ensure_ascii=False, indent=1)
        else:
            data = f"# {conversation.title}\n\n" + "".join(markdown_turn(m) for m in messages)
        folder = Path(tempfile.mkdtemp(prefix="export-"))
        path = folder / f"{safe_name(conversation.title)}.{'json' if kind == 'json' else 'md'}"
        path.write_text(data)
        return str(path)

    def _exported_messages(self, entries: list[dict]) -> list[dict]:
        return [self._exported(m) for m in model_view(entries, for_export=True)]

    def _exported(self, message: dict) -> dict:
        content = message["content"]
        if isinstance(content, list):
            content = [self._exported_part(p) for p in content]
        if message.get("documents"):  # each whole: an import needs no reading again
            message = {**message, "documents": exported_documents(message["documents"], self.shelf)}
        return {**message, "content": content}

    def _exported_part(self, part: dict) -> dict:
        """A stored part as OpenAI's: an image as a PNG `data:` URL, a recording as a WAV `input_audio`."""
        if part.get("type") == "image":
            return {
                "type": "image_url",
                "image_url": {"url": png_data_url(self.store.image_path(part["sha256"]).read_bytes())},
            }
        if part.get("type") == "audio":
            data = base64.b64encode(self.store.sound_path(part["sha256"]).read_bytes()).decode()
            return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
        return {"type": "text", "text": part.get("text", "")}

    def import_file(self, owner: str, path: str) -> str:
        """A JSON or Markdown export made a new conversation of `owner` (its images checked as uploads are); its id."""
        size = Path(path).stat().st_size
        limit = self.max_upload_mb * 1e6 * 4  # a few images at the upload cap, as base64
        if size > limit:
            raise UserError(f"The file is {size / 1e6:.1f} MB; import one under {limit / 1e6:.0f} MB.")
        try:
            text = Path(path).read_text()
        except UnicodeDecodeError:
            raise UserError("The file is not text; import a conversation exported as JSON or Markdown by this app.")
        title, messages, tree = (None, None, None)
        if Path(path).suffix.lower() == ".md":
            title, messages = markdown_messages(text)
        else:
            try:
                data = json.loads(text)
            except ValueError:
                raise UserError("The file is not JSON; import a conversation exported as JSON by this app.")
            messages = data.get("messages") if isinstance(data, dict) else data
            title = data.get("title") if isinstance(data, dict) and isinstance(data.get("title"), str) else None
            tree = data.get("tree") if isinstance(data, dict) else None
        if tree is not None:
            return self._imported_tree(owner, tree, title)
        if not isinstance(messages, list) or not messages:
            raise UserError('The file holds no messages; import a JSON export ({"title", "messages": [...]}).')
        called: dict = {}  # the tools its calls named, by call id (to title their results)
        stored = [entry for message in messages for entry in self._imported(message, called)]
        return self.store.save(owner, None, stored, title=title or title_of(stored)).id

    def _imported_tree(self, owner: str, tree, title: str | None) -> str:
        """An export's "tree" (every branch) made a new conversation of `owner`; its id."""
        nodes: list[Node] = []
        called: dict = {}
        for item in tree.get("nodes") if isinstance(tree, dict) and isinstance(tree.get("nodes"), list) else [None]:
            if not isinstance(item, dict) or not isinstance(item.get("messages"), list):
                raise UserError(BROKEN_TREE)
            entries = [entry for message in item["messages"] for entry in self._imported(message, called)]
            nodes.append(Node(item.get("id"), item.get("parent"), entries))
        if not well_formed(nodes):
            raise UserError(BROKEN_TREE)
        leaf = tree.get("leaf") if tree.get("leaf") in {node.id for node in nodes} else None
        shape = Shape([(node.id, node.parent, order) for order, node in enumerate(nodes)])
        on_screen = {node.id: node for node in nodes}
        title = title or title_of(flat_entries([on_screen[id_] for id_ in shape.path_to(leaf or nodes[-1].id)]))
        return self.store.put_tree(owner, nodes, title, leaf)

    def _imported(self, message, called: dict) -> list[dict]:
        """A message of an export as the page's entries: a thought before its answer, calls and results folded."""
        if not isinstance(message, dict) or message.get("role") not in EXPORT_ROLES:
            raise UserError(
                "A message of the file has no role user, assistant, system or tool; import a JSON export of this app."
            )
        if message["role"] == "tool":
            name = called.get(message.get("tool_call_id"))
            return [tool_result(message_text(message.get("content")), message.get("tool_call_id"), name)]
        entries = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if message["role"] == "assistant" and isinstance(reasoning, str) and reasoning.strip():
            entries.append(thinking(reasoning.strip(), True))
        content = self._imported_content(message.get("content"))
        if content or not message.get("tool_calls"):
            model = message.get("model") if message["role"] == "assistant" else None  # the model that gave it
            entry = {"role": message["role"], "content": content} | ({"model": model} if isinstance(model, str) else {})
            if message["role"] == "user" and message.get("documents"):
                text = message.get("text") if isinstance(message.get("text"), str) else message_text(content)
                entry |= {"documents": imported_documents(message["documents"], self.shelf), "text": text}
            entries.append(entry)
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                called[call.get("id")] = call["function"].get("name")
                entries.append(tool_call(call))
        if message["role"] == "assistant" and message.get("sources"):
            entries.append(imported_sources(message["sources"]))
        return entries

    def _imported_content(self, content):
        if not isinstance(content, list):
            return message_text(content)
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("image_url", "image"):
                url = part.get("image_url", part.get("url"))
                url = url.get("url") if isinstance(url, dict) else url
                image = image_from_data_url(url, self.max_upload_mb)
                parts.append({"type": "image", "sha256": self.store.put_image(png_bytes(image))})
            elif isinstance(part, dict) and part.get("type") in AUDIO_PART_TYPES:
                clip = part_clip(part, len([p for p in parts if p["type"] == "audio"]) + 1, self.max_upload_mb)
                parts.append({"type": "audio", "sha256": self.store.put_sound(wav_bytes(clip))})
            else:
                parts.append({"type": "text", "text": message_text(part)})
        return parts


def _markdown_part(part: dict) -> str:
    """An exported part in Markdown: an image as a `data:` image, a recording said (its sound stays in the JSON)."""
    if part["type"] == "image_url":
        return f"![image]({part['image_url']['url']})"
    return "*(a recording)*" if part["type"] == "input_audio" else part["text"]


def markdown_turn(message: dict) -> str:
    content = message["content"]
    if isinstance(content, str):
        body = content
    else:
        body = "\n\n".join(_markdown_part(p) for p in content)
    if message.get("reasoning_content"):
        body = f"<details><summary>Thinking</summary>\n\n{message['reasoning_content']}\n\n</details>\n\n{body}"
    for call in message.get("tool_calls") or []:
        function = call["function"]
        body += f"\n\n**Called `{function['name']}`** with `{function['arguments']}`"
    by = f" · {message['model']}" if message.get("model") else ""
    return f"## {message['role'].capitalize()}{by}\n\n{body}\n\n"


def markdown_messages(text: str) -> tuple[str | None, list[dict]]:
    """(title, messages) of a Markdown export: its `# title`, then a message per `## Role` section, its images as
    image parts, a folded Thinking before an answer as its `reasoning_content` (calls stay text)."""
    first = text.split("\n", 1)[0]
    title = first[2:].strip() if first.startswith("# ") else None
    pieces = MD_TURN.split(text)[1:]
    messages = []
    for role, model, body in zip(pieces[::3], pieces[1::3], pieces[2::3]):
        body = body.strip("\n")
        message = {"role": role.lower(), "content": markdown_content(body)} | ({"model": model} if model else {})
        thought = THOUGHT_MD.match(body + "\n\n") if role == "Assistant" else None
        if thought:
            answer = markdown_content(body[thought.end() :].strip("\n"))
            message = {**message, "content": answer, "reasoning_content": thought[1]}
        messages.append(message)
    return title, messages


def markdown_content(body: str) -> str | list[dict]:
    """A Markdown export's message body as its content: the text, or where it holds images (`markdown_turn`'s
    `![image](data:...)` lines), image and text parts in their order."""
    pieces = MD_IMAGE.split(body)
    if len(pieces) == 1:
        return body
    parts = []
    for index, piece in enumerate(pieces):
        if index % 2:
            parts.append({"type": "image_url", "image_url": {"url": piece}})
        elif piece.strip("\n"):
            parts.append({"type": "text", "text": piece.strip("\n")})
    return parts


def safe_name(title: str) -> str:
    return re.sub(r"[^\w -]", "", title)[:40].strip() or "conversation"
