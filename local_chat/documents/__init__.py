"""Documents attached to a question: their text (documents/extract.py) and what of it goes in the prompt, whole or
searched (documents/context.py)."""

from .context import (
    Context,
    Shelf,
    conversation_documents,
    document_context,
    put_in_prompt,
    room_left,
    token_counter,
    with_text_before,
)
from .extract import DOCUMENT_SUFFIXES, Document, extract, extract_elsewhere, is_document, render_elsewhere

__all__ = [
    "DOCUMENT_SUFFIXES",
    "Context",
    "Document",
    "Shelf",
    "conversation_documents",
    "put_in_prompt",
    "document_context",
    "room_left",
    "token_counter",
    "with_text_before",
    "extract",
    "extract_elsewhere",
    "is_document",
    "render_elsewhere",
]
