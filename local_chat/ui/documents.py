"""Documents in the chat: the files of the message box that are documents (a PDF, a .docx, text, code...) read in a
process of their own (documents/extract.py), kept once on the `Shelf` of the saved conversations (or of this
process), named by the question they came with (its "documents"), and put in the prompt of each later question of
the conversation, whole or searched (documents/context.py); the answer shows its sources under it.
"""

from __future__ import annotations

import asyncio

from local_chat.documents import Document, Shelf, document_context, extract_elsewhere, is_document
from local_chat.errors import UserError
from local_chat.prompting import message_text

from . import turns

ROOM_MARGIN = 16  # tokens kept free beside the documents, for the template's own


def split_files(files: list[str]) -> tuple[list[str], list[str]]:
    """(images, documents) of the message box's files, by their names."""
    return [f for f in files if not is_document(f)], [f for f in files if is_document(f)]


async def read_documents(paths: list[str], max_upload_mb: float, shelf: Shelf) -> tuple[list, str]:
    """(path, document) of each document that can be read, kept on `shelf`, and the sentence for those that cannot
    (empty when none)."""
    documents, refused = [], []
    for path in paths:
        try:
            document = await asyncio.to_thread(extract_elsewhere, path, max_upload_mb, _upload_name(path))
            shelf.put(document)
            documents.append((path, document))
        except UserError as error:
            refused.append(str(error))
    if not refused:
        return documents, ""
    return documents, "Taken out of the message (your text is still there): " + " ".join(refused)


def _upload_name(path: str) -> str:
    from pathlib import Path

    return Path(path).name


def with_documents(question: dict, documents: list[Document]) -> dict:
    """A question with the documents attached to it, named under "documents" and listed above its text."""
    if not documents:
        return question
    listed = "".join(f"📎 {d.name} ({len(d.pages)} {'pages' if d.paged else 'parts'})\n\n" for d in documents)
    named = [{"sha256": d.sha256, "name": d.name} for d in documents]
    shown = question["content"]
    text = question.get("text", message_text(shown))
    if isinstance(shown, list):  # Gradio's upload files, then the text
        return {**question, "content": [*shown[:-1], listed + shown[-1]], "text": text, "documents": named}
    addresses = shown[: len(shown) - len(text)]  # a saved question's images
    return {**question, "content": addresses + listed + text, "text": text, "documents": named}


def conversation_documents(messages: list[dict], shelf: Shelf) -> list[Document]:
    """The documents attached to the conversation's questions so far, each once, in order."""
    found: dict[str, Document] = {}
    for message in messages:
        for named in message.get("documents") or []:
            if named["sha256"] not in found and (document := shelf.get(named["sha256"])) is not None:
                found[named["sha256"]] = document
    return list(found.values())


def put_in_prompt(engine, messages: list[dict], answer_tokens: int, shelf: Shelf) -> tuple[list[dict], list[dict]]:
    """`messages` with the conversation's documents before the last question's text (whole or searched, in the room
    the rest leaves), and the sources that went in; messages without documents as they were."""
    documents = conversation_documents(messages, shelf)
    messages = [{k: v for k, v in m.items() if k != "documents"} for m in messages]
    if not documents:
        return messages, []
    question = messages[-1]
    asked = message_text(question["content"])
    tokenizer = engine.tokenizer
    used = sum(len(tokenizer.encode(message_text(m["content"]))) for m in messages)
    room = engine.max_seq_len - min(answer_tokens, engine.max_seq_len // 2) - used - ROOM_MARGIN
    context = document_context(documents, asked, room, lambda text: len(tokenizer.encode(text)), shelf)
    if not context.text:
        return messages, []
    text = context.text + "\n\n" + asked
    content = question["content"]
    if isinstance(content, list):
        content = [p for p in content if not (isinstance(p, dict) and p.get("type") == "text")] + [
            {"type": "text", "text": text}
        ]
    else:
        content = text
    return [*messages[:-1], {**question, "content": content}], context.sources


def sources_entry(sources: list[dict]) -> dict | None:
    """The answer's sources, folded under it: each document, the pages that went in, and the passages searched."""
    if not sources:
        return None
    lines = []
    for source in sources:
        unit = "pages" if source.get("paged") else "parts"
        pages = ", ".join(str(p) for p in source["pages"])
        how = "whole" if source["whole"] else f"{unit} {pages}"
        lines.append(f"**[{source['number']}] {source['name']}**, {how}")
        lines += [turns.fenced(passage) for passage in source.get("passages", [])]
    return {"role": "assistant", "metadata": {"title": "Sources", "status": "done"}, "content": "\n\n".join(lines),
            "kind": "sources", "sources": sources}  # fmt: skip
