"""Saved conversations on the page (history/store.py holds them): whose they are, how their messages and images are
shown and read back, the route that serves their images, exports and imports.

Owners: with --auth, the login name; without, an id made on the browser's first load (192 random bits) and kept in
its local storage (`gr.BrowserState`, encrypted with a secret the database keeps, so a restart finds it again).
Every handler names the owner; the store refuses another owner's conversation whatever id a request sends.

Images: in the chat, an image of a saved conversation is a Markdown image whose address is signed for the
conversation's owner (`/history/image/CONVERSATION/SHA256?sig=...`); the route serves it only when the signature is
the owner's and the conversation holds the image. Without saved conversations (--no_history) images are Gradio's
uploads, shown as file parts.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import tempfile
import threading
from pathlib import Path

import gradio as gr
from starlette.requests import Request as HTTPRequest
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from local_chat.defaults import MAX_UPLOAD_MB
from local_chat.documents import Shelf
from local_chat.errors import UserError
from local_chat.history.store import SavedConversation, Store, text_of, title_of
from local_chat.prompting import image_from_data_url, message_text, open_upload, png_bytes, png_data_url

from .documents import exported_documents, imported_documents, with_documents
from .turns import model_view, thinking, tool_call, tool_result

IMAGE_ROUTE = "/history/image"
BROWSER_ID_BYTES = 24  # 192 bits
EXPORT_ROLES = ("system", "user", "assistant", "tool")
# what the page's entries carry besides Gradio's keys (ui/turns.py)
KEPT_KEYS = (
    "kind",
    "call",
    "tool_call_id",
    "model",
    "server",
    "approval",
    "result",
    "options",
    "documents",
    "sources",
)
THOUGHT_MD = re.compile(r"\A<details><summary>Thinking</summary>\n\n(.*?)\n\n</details>\n\n", re.DOTALL)
MD_IMAGE = re.compile(r"^!\[image\]\((data:image/[^)\s]+)\)$", re.MULTILINE)  # an image, as markdown_turn writes it
MD_TURN = re.compile(r"^## (System|User|Assistant|Tool)(?: · ([^\n]+))?\n\n", re.MULTILINE)  # an answer's model


def file_paths(content) -> list[str]:
    """The files among a message's parts, as Gradio sends a chat back (`{"type": "file", "file": {"path"}}`)."""
    parts = content if isinstance(content, list) else [content]
    paths = []
    for part in parts:
        if isinstance(part, dict) and part.get("type") == "file":
            paths.append(part["file"]["path"])
        elif isinstance(part, dict) and "path" in part and "type" not in part:
            paths.append(part["path"])
    return paths


class SavedChats:
    """The page's side of saved conversations over `store` (None: --no_history, nothing is saved)."""

    def __init__(self, store: Store | None, max_upload_mb: float = MAX_UPLOAD_MB, retrieval: tuple = (None, None)):
        self.store, self.retrieval = store, retrieval  # (embedding model, reranker) of documents/vectors.py
        self.max_upload_mb = max_upload_mb
        self._read: dict[tuple[str, str], int] = {}  # (page, conversation id): the revision that page read or wrote
        self._saving = threading.Lock()  # one page's saves one after the other (Stop's beside its answer's)

    def opened(self, page: str, owner: str, conversation_id: str) -> SavedConversation:
        """`owner`'s conversation as the page `page` (a browser tab's session) opens it: its revision is the one
        that page's next save must find."""
        found = self.store.get(owner, conversation_id)
        self._read[(page, found.id)] = found.revision
        return found

    def forget(self, page: str) -> None:
        """A closed page's read revisions."""
        for key in [key for key in self._read if key[0] == page]:
            del self._read[key]

    @property
    def on(self) -> bool:
        return self.store is not None

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    @functools.cached_property
    def shelf(self) -> Shelf:
        """The documents attached to questions (documents/context.py): in the database, else in memory."""
        return Shelf(str(self.store.path) if self.store is not None else ":memory:", *self.retrieval)

    def browser_state(self, kind: str = "") -> gr.BrowserState:
        """A value kept in the browser's local storage (the browser's id; with `kind` "open", the conversation open
        on its page); the key and secret are the database's (see the module)."""
        keys = self.store.keys
        return gr.BrowserState(None, storage_key="local-chat-" + keys["browser_storage_key"][:16] + kind,
                               secret=keys["browser_secret"])  # fmt: skip

    @staticmethod
    def browser_id(current) -> str:
        """The browser's id: the one it keeps, else a new one (its first load)."""
        return current if isinstance(current, str) and len(current) >= 32 else secrets.token_urlsafe(BROWSER_ID_BYTES)

    def owner(self, browser_id, request: gr.Request) -> str:
        username = getattr(request, "username", None)
        if username:
            return "user:" + username
        if not (isinstance(browser_id, str) and len(browser_id) >= 32):
            raise UserError("This page has no browser id yet; reload it.")
        return "browser:" + browser_id

    # ----- messages: stored <-> shown -----

    def user_message(self, owner: str | None, conversation_id: str | None, text: str, images: list) -> dict:
        """A new user message as the chat keeps it: with saved conversations, each image kept in the store, listed by
        its digest under "images" (with the message's "text"), and shown by its signed address; without, Gradio's
        upload files."""
        if not images:
            return {"role": "user", "content": text}
        if not self.on:
            return {"role": "user", "content": [*({"path": path} for path, _ in images), text]}
        digests = [self.store.put_image(png_bytes(image)) for _, image in images]
        return self._question(owner, conversation_id, text, digests)

    def _question(self, owner: str, conversation_id: str, text: str, digests: list[str]) -> dict:
        shown = self._refs(owner, conversation_id, digests) + text
        return {"role": "user", "content": shown, "text": text, "images": digests}

    def _refs(self, owner: str, conversation_id: str, digests: list[str]) -> str:
        return "".join(f"![image]({self._address(owner, conversation_id, d)})\n\n" for d in digests)

    def _address(self, owner: str, conversation_id: str, digest: str) -> str:
        return (
            f"{IMAGE_ROUTE}/{conversation_id}/{digest}?sig={self.store.image_signature(owner, conversation_id, digest)}"
        )

    def image_address(self, owner: str | None, conversation_id: str | None, png: bytes) -> str | None:
        """The address a saved image (a tool's result) is shown from in `owner`'s conversation; None where nothing
        is saved."""
        if owner is None or conversation_id is None:
            return None
        return self._address(owner, conversation_id, self.store.put_image(png))

    def shown(self, owner: str, conversation_id: str, messages: list[dict]) -> list[dict]:
        """Stored messages as the chat keeps them."""
        shown = []
        for message in messages:
            content = message["content"]
            if isinstance(content, list):
                digests = [p["sha256"] for p in content if p.get("type") == "image"]
                question = {**message, **self._question(owner, conversation_id, text_of(content), digests)}
                named = [self.shelf.get(n["sha256"]) for n in message.get("documents") or []]
                shown.append(with_documents(question, [d for d in named if d is not None]))  # listed again
            else:
                shown.append(dict(message))
        return shown

    def stored(self, history: list[dict]) -> list[dict]:
        """The chat's messages as they are stored: a question's images as their digests' parts before its text,
        everything else as shown."""
        stored = []
        for message in history:
            entry = {"role": message["role"], "content": message_text(message.get("content"))}
            if message.get("images"):
                entry["content"] = [{"type": "image", "sha256": d} for d in message["images"]]
                entry["content"].append({"type": "text", "text": message["text"]})
            if message.get("metadata"):
                entry["metadata"] = {k: v for k, v in message["metadata"].items() if v is not None}
            entry |= {k: message[k] for k in KEPT_KEYS if message.get(k) is not None}
            if message.get("documents") and not message.get("images"):  # its text apart from the documents' list
                entry["text"] = message["text"]
            stored.append(entry)
        return stored

    def for_the_model(self, history: list[dict]) -> list[dict]:
        """The chat's messages (`model_view`'s) with their images decoded, as prompting/ reads them: a user message's
        images are `{"type": "image", "image": PIL}` parts before its text."""
        messages = []
        for message in history:
            content = message.get("content")
            images = [open_upload(path, self.max_upload_mb) for path in file_paths(content)]
            images += [open_upload(self.store.image_path(d), self.max_upload_mb) for d in message.get("images", ())]
            text = message["text"] if "text" in message else message_text(content)
            parts = [{"type": "image", "image": image} for image in images]
            kept = {k: v for k, v in message.items() if k not in ("text", "images")}
            messages.append({**kept, "content": parts + [{"type": "text", "text": text}] if parts else text})
        return messages

    # ----- saving -----

    def save(
        self,
        page: str,
        owner: str | None,
        conversation_id: str | None,
        history: list[dict],
        options: dict | None = None,
    ) -> str | None:
        """Commit the chat of page `page` (and its `options`, where given) as conversation `conversation_id`
        (created if new); its id (None without a store). `Changed` where it changed since that page read it."""
        if not self.on or owner is None:
            return None
        conversation_id = conversation_id or new_conversation_id()
        stored = self.stored(history)
        with self._saving:
            read = self._read.get((page, conversation_id))
            saved = self.store.save(owner, conversation_id, stored, options=options, read=read)
            self._read[(page, saved.id)] = saved.revision
        return saved.id

    def choices(self, owner: str | None) -> list[tuple[str, str]]:
        return self.store.titles(owner) if self.on and owner else []

    # ----- the image route -----

    def route(self) -> Route:
        async def image(http: HTTPRequest) -> Response:
            found = self.store.image_for_owner_of(
                http.path_params["conversation"], http.path_params["digest"], http.query_params.get("sig", "")
            )
            if found is None:
                return Response("Not found", status_code=404)
            return FileResponse(found, media_type="image/png", headers={"Cache-Control": "private, max-age=86400"})

        return Route(IMAGE_ROUTE + "/{conversation}/{digest}", image, methods=["GET"])

    # ----- export and import -----

    def export(self, owner: str, conversation_id: str, kind: str) -> str:
        """A file holding the conversation as JSON (OpenAI-style messages, images as data: URLs, a thought as its
        answer's `reasoning_content`) or Markdown (a thought folded in `<details>`)."""
        conversation = self.store.get(owner, conversation_id)
        messages = [self._exported(m) for m in model_view(conversation.messages, for_export=True)]
        if kind == "json":
            data = json.dumps({"title": conversation.title, "messages": messages}, ensure_ascii=False, indent=1)
        else:
            data = f"# {conversation.title}\n\n" + "".join(markdown_turn(m) for m in messages)
        folder = Path(tempfile.mkdtemp(prefix="export-"))
        path = folder / f"{safe_name(conversation.title)}.{'json' if kind == 'json' else 'md'}"
        path.write_text(data)
        return str(path)

    def _exported(self, message: dict) -> dict:
        content = message["content"]
        if isinstance(content, list):
            content = [
                {
                    "type": "image_url",
                    "image_url": {"url": png_data_url(self.store.image_path(p["sha256"]).read_bytes())},
                }
                if p.get("type") == "image"
                else {"type": "text", "text": p.get("text", "")}
                for p in content
            ]
        if message.get("documents"):  # each whole: an import needs no reading again
            message = {**message, "documents": exported_documents(message["documents"], self.shelf)}
        return {**message, "content": content}

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
        title, messages = (None, None)
        if Path(path).suffix.lower() == ".md":
            title, messages = markdown_messages(text)
        else:
            try:
                data = json.loads(text)
            except ValueError:
                raise UserError("The file is not JSON; import a conversation exported as JSON by this app.")
            messages = data.get("messages") if isinstance(data, dict) else data
            title = data.get("title") if isinstance(data, dict) and isinstance(data.get("title"), str) else None
        if not isinstance(messages, list) or not messages:
            raise UserError('The file holds no messages; import a JSON export ({"title", "messages": [...]}).')
        called: dict = {}  # the tools its calls named, by call id (to title their results)
        stored = [entry for message in messages for entry in self._imported(message, called)]
        return self.store.save(owner, new_conversation_id(), stored, title=title or title_of(stored)).id

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
            else:
                parts.append({"type": "text", "text": message_text(part)})
        return parts


def new_conversation_id() -> str:
    return secrets.token_urlsafe(16)


def markdown_turn(message: dict) -> str:
    content = message["content"]
    if isinstance(content, str):
        body = content
    else:
        body = "\n\n".join(
            f"![image]({p['image_url']['url']})" if p["type"] == "image_url" else p["text"] for p in content
        )
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
