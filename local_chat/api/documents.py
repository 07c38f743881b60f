"""/v1's documents: OpenAI's file parts (`{"type": "file", "file": {"file_data": "data:...;base64,...", "filename":
...}}`) in a user message, read in a process of their own and put before the last question, whole or searched, as the
page puts its attachments (documents/context.py)."""

from __future__ import annotations

import asyncio
import base64
import tempfile
from pathlib import Path

from local_chat.documents import Shelf, extract_elsewhere, put_in_prompt
from local_chat.engine import Request
from local_chat.errors import UserError


async def with_file_parts(engine, request: Request, shelf: Shelf, max_upload_mb: float) -> tuple[list[dict], int]:
    """The messages with their file parts read (in a process of their own) and put before the last question,
    whole or searched, as the page does (documents/context.py); and the last source number they took (0: none)."""
    messages = []
    for message in request.messages:
        parts = message.get("content") if isinstance(message.get("content"), list) else []
        files = [p["file"] for p in parts if p.get("type") == "file"]
        if not files:
            messages.append(message)
            continue
        named = []
        for file in files:
            document = await asyncio.to_thread(read_file_part, file, max_upload_mb)
            shelf.put(document)
            named.append(document.named)
        kept = [p for p in parts if p.get("type") != "file"] or [{"type": "text", "text": ""}]
        messages.append({**message, "content": kept, "documents": named})
    if not any("documents" in m for m in messages):
        return request.messages, 0
    messages, context = put_in_prompt(engine, messages, request.chat.answer_tokens, shelf)
    return messages, context.last_number


def read_file_part(file: dict, max_upload_mb: float):
    """A file part's document (`UserError` with its sentence where it cannot be read)."""
    name = Path(file["filename"]).name
    header, _, data = file["file_data"].partition(",")
    if not header.startswith("data:") or ";base64" not in header:
        raise UserError(f'The file part of {name} is not a "data:...;base64," URL; send the document so.')
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError:
        raise UserError(f"The file part of {name} is not valid base64.")
    with tempfile.TemporaryDirectory(prefix="v1-file-") as folder:
        path = Path(folder) / name
        path.write_bytes(raw)
        return extract_elsewhere(str(path), max_upload_mb, name)
