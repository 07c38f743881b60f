"""Saved conversations on the page (history/store.py holds them): whose they are, how their messages and images are
shown and read back, the route that serves their images, exports and imports.

Owners: with --auth, the login name; without, an id made on the browser's first load (192 random bits) and kept in
its local storage (`gr.BrowserState`, encrypted with a secret the database keeps, so a restart finds it again).
Every handler names the owner; the store refuses another owner's conversation whatever id a request sends.

Images: in the chat, an image of a saved conversation is a Markdown image whose address is signed for the
conversation's owner (`/history/image/CONVERSATION/SHA256?sig=...`); the route serves it only when the signature is
the owner's and the conversation holds the image. A recording a model that hears was given is an `<audio>` player of
such an address. Without saved conversations (--no_history) images and recordings are Gradio's uploads, shown as
file parts.
"""

from __future__ import annotations

import functools
import secrets
import threading

import gradio as gr
from starlette.requests import Request as HTTPRequest
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from local_chat.defaults import MAX_UPLOAD_MB
from local_chat.documents import Shelf
from local_chat.errors import UserError
from local_chat.history.store import SavedConversation, Store, text_of
from local_chat.prompting import message_text, open_upload, png_bytes
from local_chat.voice.clips import is_sound_file, read_clip_file, wav_bytes

from .documents import with_documents
from .exports import Exports

IMAGE_ROUTE = "/history/image"
BROWSER_ID_BYTES = 24  # 192 bits
LISTED = 200  # the conversations the sidebar lists (the pinned ones, then the latest); the search finds the others
PIN = "★"  # before a pinned conversation's title (in every font, where an emoji may not be)
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
    "node",
    "reply",
)


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
    def exports(self) -> Exports:
        """The conversations' exports and imports (ui/exports.py)."""
        return Exports(self.store, self.shelf, self.max_upload_mb)

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
        return current if SavedChats.has_browser_id(current) else secrets.token_urlsafe(BROWSER_ID_BYTES)

    @staticmethod
    def has_browser_id(browser_id) -> bool:
        return isinstance(browser_id, str) and len(browser_id) >= 32

    def owner(self, browser_id, request: gr.Request) -> str:
        username = getattr(request, "username", None)
        if username:
            return "user:" + username
        if not self.has_browser_id(browser_id):
            raise UserError("This page has no browser id yet; reload it.")
        return "browser:" + browser_id

    # ----- messages: stored <-> shown -----

    def user_message(
        self, owner: str | None, conversation_id: str | None, text: str, images: list, clips: list = ()
    ) -> dict:
        """A new user message as the chat keeps it: with saved conversations, each image (and each recording, `clips`'
        (path, Clip), for a model that hears) kept in the store, listed by its digest under "images" ("clips"), with
        the message's "text", and shown by its signed address; without, Gradio's upload files."""
        if not images and not clips:
            return {"role": "user", "content": text}
        if not self.on:
            return {"role": "user", "content": [*({"path": path} for path, _ in [*images, *clips]), text]}
        digests = [self.store.put_image(png_bytes(image)) for _, image in images]
        sounds = [self.store.put_sound(wav_bytes(clip)) for _, clip in clips]
        return self._question(owner, conversation_id, text, digests, sounds)

    def _question(self, owner: str, conversation_id: str, text: str, digests: list[str], sounds=()) -> dict:
        shown = self._refs(owner, conversation_id, digests) + self._players(owner, conversation_id, sounds) + text
        question = {"role": "user", "content": shown, "text": text, "images": digests}
        return question | {"clips": list(sounds)} if sounds else question

    def _refs(self, owner: str, conversation_id: str, digests: list[str]) -> str:
        return "".join(f"![image]({self._address(owner, conversation_id, d)})\n\n" for d in digests)

    def _players(self, owner: str, conversation_id: str, digests: list[str]) -> str:
        return "".join(
            f'<audio controls src="{self._address(owner, conversation_id, d)}"></audio>\n\n' for d in digests
        )

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
                sounds = [p["sha256"] for p in content if p.get("type") == "audio"]
                question = {**message, **self._question(owner, conversation_id, text_of(content), digests, sounds)}
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
            if message.get("images") or message.get("clips"):
                entry["content"] = [{"type": "image", "sha256": d} for d in message.get("images", ())]
                entry["content"] += [{"type": "audio", "sha256": d} for d in message.get("clips", ())]
                entry["content"].append({"type": "text", "text": message["text"]})
            if message.get("metadata"):
                entry["metadata"] = {k: v for k, v in message["metadata"].items() if v is not None}
            entry |= {k: message[k] for k in KEPT_KEYS if message.get(k) is not None}
            if message.get("documents") and not (message.get("images") or message.get("clips")):  # the text apart
                entry["text"] = message["text"]
            stored.append(entry)
        return stored

    def for_the_model(self, history: list[dict]) -> list[dict]:
        """The chat's messages (`model_view`'s) with their images and recordings decoded, as prompting/ reads them: a
        user message's images are `{"type": "image", "image": PIL}` parts before its text, its recordings
        `{"type": "audio", "audio": Clip}` parts."""
        messages = []
        for message in history:
            content = message.get("content")
            parts = [self._upload_part(path) for path in file_paths(content)]
            parts += [self._upload_part(self.store.image_path(d)) for d in message.get("images", ())]
            parts += [self._upload_part(self.store.sound_path(d)) for d in message.get("clips", ())]
            text = message["text"] if "text" in message else message_text(content)
            kept = {k: v for k, v in message.items() if k not in ("text", "images", "clips")}
            messages.append({**kept, "content": parts + [{"type": "text", "text": text}] if parts else text})
        return messages

    def _upload_part(self, path) -> dict:
        """An attached file's part for the model: a recording's clip, else an image (each checked as an upload)."""
        if is_sound_file(path):
            return {"type": "audio", "audio": read_clip_file(path, self.max_upload_mb)}
        return {"type": "image", "image": open_upload(path, self.max_upload_mb)}

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

    def take_back(self, page: str, owner: str, conversation_id: str, question: dict | None) -> None:
        """Undo: `question` and its answers deleted from the saved conversation (history/store.py), the page's
        read revision the new one."""
        if question is None or not question.get("node"):
            return
        try:
            self.store.delete_branch(owner, conversation_id, question["node"])
            self.opened(page, owner, conversation_id)
        except UserError:  # never saved (a refused message), or deleted in another window
            pass

    def choices(self, owner: str | None, open_id: str | None = None) -> list[tuple[str, str]]:
        """The sidebar's list: this owner's conversations, the pinned ones first and marked, then the `LISTED` latest
        (older ones are found by the search), and the one open (`open_id`) wherever it is."""
        listing = self.store.listing(owner, LISTED) if self.on and owner else []
        if open_id is not None and all(id_ != open_id for _, id_, _ in listing):
            listing += [entry for entry in self.store.listing(owner) if entry[1] == open_id]
        return [(f"{PIN} {title}" if pinned else title, id_) for title, id_, pinned in listing]

    def listed(self, owner: str | None, open_id: str | None):
        """The sidebar list's update: `choices`, `open_id` chosen."""
        return gr.update(choices=self.choices(owner, open_id), value=open_id)

    # ----- the image route -----

    def route(self) -> Route:
        async def image(http: HTTPRequest) -> Response:
            found = self.store.image_for_owner_of(
                http.path_params["conversation"], http.path_params["digest"], http.query_params.get("sig", "")
            )
            if found is None:
                return Response("Not found", status_code=404)
            kind = "audio/wav" if found.suffix == ".wav" else "image/png"
            return FileResponse(found, media_type=kind, headers={"Cache-Control": "private, max-age=86400"})

        return Route(IMAGE_ROUTE + "/{conversation}/{digest}", image, methods=["GET"])


def new_conversation_id() -> str:
    return secrets.token_urlsafe(16)
