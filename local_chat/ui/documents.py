"""Documents in the chat: the files of the message box that are documents (a PDF, a .docx, text, code...) read in a
process of their own (documents/extract.py), kept once on the `Shelf` of the saved conversations (or of this
process), named by the question they came with (its "documents"), and put in the prompt of each later question of
the conversation, whole or searched (documents/context.py); the answer shows its sources under it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass

from local_chat.documents import Document, Shelf, extract_elsewhere, is_document, render_elsewhere
from local_chat.errors import UserError
from local_chat.history.kinds import Kind
from local_chat.prompting import message_text

from . import turns
from .chat_settings import taken_out

PAGE_PICTURES = 8  # a PDF's pages sent as pictures, at most


async def as_pictures(images: list[str], documents: list[str]) -> tuple[list[str], list[str]]:
    """The PDFs among `documents` as pictures of their first `PAGE_PICTURES` pages (PNG files, rendered by pypdfium2
    in the extraction's process), added to `images`; the other documents as they were. A PDF that cannot be
    rendered stays a document, whose reading then says why."""
    pictures, kept = list(images), []
    for path in documents:
        if not path.lower().endswith(".pdf"):
            kept.append(path)
            continue
        try:
            pictures += await asyncio.to_thread(render_elsewhere, path, PAGE_PICTURES)
        except UserError:
            kept.append(path)
    return pictures, kept


def split_files(files: list[str]) -> tuple[list[str], list[str]]:
    """(images, documents) of the message box's files, by their names."""
    return [f for f in files if not is_document(f)], [f for f in files if is_document(f)]


async def read_documents(paths: list[str], max_upload_mb: float, shelf: Shelf) -> tuple[list, str]:
    """(path, document) of each document that can be read, kept on `shelf`, and the sentence for those that cannot
    (empty when none)."""
    documents, refused = [], []
    for path in paths:
        try:
            document = await asyncio.to_thread(extract_elsewhere, path, max_upload_mb)  # named as its file is
            shelf.put(document)
            documents.append((path, document))
        except UserError as error:
            refused.append(str(error))
    return documents, taken_out(refused)


def with_documents(question: dict, documents: list[Document]) -> dict:
    """A question with the documents attached to it, named under "documents" and listed above its text."""
    if not documents:
        return question
    listed = "".join(f"Attached: {d.name} ({len(d.pages)} {'pages' if d.paged else 'parts'})\n\n" for d in documents)
    named = [d.named for d in documents]
    shown = question["content"]
    text = question.get("text", message_text(shown))
    if isinstance(shown, list):  # Gradio's upload files, then the text
        return {**question, "content": [*shown[:-1], listed + shown[-1]], "text": text, "documents": named}
    addresses = shown[: len(shown) - len(text)]  # a saved question's images
    return {**question, "content": addresses + listed + text, "text": text, "documents": named}


def sources_entry(*contexts) -> dict | None:
    """The answer's sources, folded under it: of its documents (documents/context.py's `Context`: each document, the
    pages that went in, the passages searched) and of the web (web/context.py's `WebContext`: each page's title,
    address and passages); first, what each says of itself (how much went in, what failed). None where none is."""
    contexts = [context for context in contexts if context is not None]
    if not contexts:
        return None
    lines = [f"*{context.note}*" for context in contexts if context.note]
    sources = [source for context in contexts for source in context.sources]
    for source in sources:
        if "url" in source:  # a web page
            lines.append(f"**[{source['number']}] [{source['name']}]({source['url']})**")
        else:
            unit = "pages" if source.get("paged") else "parts"
            how = "whole" if source.get("whole") else f"{unit} {', '.join(str(p) for p in source.get('pages', []))}"
            lines.append(f"**[{source['number']}] {source['name']}**, {how}")
        lines += [turns.fenced(passage) for passage in source.get("passages", [])]
    return {"role": "assistant", "metadata": {"title": "Sources", "status": "done"}, "content": "\n\n".join(lines),
            "kind": Kind.SOURCES, "sources": sources}  # fmt: skip


@dataclass(frozen=True)
class Listed:
    """Sources as an export keeps them: the list alone."""

    sources: list[dict]
    note: str = ""


def imported_sources(listed) -> dict:
    """An exported answer's "sources" as its Sources entry again."""
    if not isinstance(listed, list) or not all(
        isinstance(s, dict) and isinstance(s.get("number"), int) and isinstance(s.get("name"), str) for s in listed
    ):
        raise UserError('An answer\'s "sources" in the file are not {"number", "name", ...} objects.')
    return sources_entry(Listed(listed))


def exported_documents(named: list[dict], shelf: Shelf) -> list[dict]:
    """A question's documents as an export holds them: each whole, its name and its pages' text."""
    kept = [shelf.get(n["sha256"]) for n in named]
    return [{"name": d.name, "paged": d.paged, "pages": list(d.pages)} for d in kept if d is not None]


def imported_documents(listed, shelf: Shelf) -> list[dict]:
    """An export's documents of a question put on `shelf`, named as a question names them."""
    if not isinstance(listed, list) or not all(
        isinstance(d, dict) and isinstance(d.get("name"), str) and isinstance(d.get("pages"), list) for d in listed
    ):
        raise UserError('A question\'s "documents" in the file are not {"name", "pages": [...]} objects.')
    named = []
    for entry in listed:
        pages = tuple(str(page) for page in entry["pages"])
        sha = hashlib.sha256(json.dumps([entry["name"], pages]).encode()).hexdigest()
        document = Document(entry["name"], sha, pages, bool(entry.get("paged")))
        shelf.put(document)
        named.append(document.named)
    return named
