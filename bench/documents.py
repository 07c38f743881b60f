"""Documents in the chat: what reading, indexing and searching cost, and what a whole attached document adds to the
first token. Files made here (fixtures/documents_files.py): a 50-page PDF, a .docx of the same text, a 500-page text
with one needle passage. PDF text is read with pypdfium2 (the app's) and, where installed, pypdf, on the same file:
time per page and whether the text is the same. The time to first token of a question with a 5-page document
attached (put in whole) over the same question with the document's text typed in: the demo model, medians of
interleaved repeats.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

NEEDLE = "The needle: the treasure lies under the old oak by the mill."
LINES = [f"Line {n}: the quarterly figures of the northern region rose by {n % 7} percent." for n in range(40)]


def run(settings, demo) -> dict[str, float]:
    from fixtures.documents_files import long_text, write_docx, write_pdf
    from local_chat.documents import Shelf, extract

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-documents-") as tmp:
        folder = Path(tmp)
        pdf = write_pdf(folder / "fifty.pdf", [LINES] * 50)
        docx = write_docx(folder / "fifty.docx", LINES * 50)
        atlas = folder / "atlas.txt"
        atlas.write_text(long_text(500, NEEDLE, 321))
        repeats = max(3, settings.api_repeats)
        results["documents_pdf_ms_per_page"] = _best(lambda: extract(pdf, 50), repeats) * 1000 / 50
        results["documents_docx_ms_per_page"] = _best(lambda: extract(docx, 50), repeats) * 1000 / 50
        if importlib.util.find_spec("pypdf") is not None:
            results["documents_pypdf_ms_per_page"] = _best(lambda: _pypdf_pages(pdf), repeats) * 1000 / 50
            same = [" ".join(p.split()) for p in extract(pdf, 50).pages] == [
                " ".join(p.split()) for p in _pypdf_pages(pdf)
            ]
            print(f"documents: pypdf's text {'is' if same else 'is not'} pypdfium2's", file=sys.stderr)
        document = extract(atlas, 50)
        started = time.perf_counter()
        shelf = Shelf()
        shelf.put(document)
        results["documents_index_500_pages_ms"] = (time.perf_counter() - started) * 1000
        searches = []
        for _ in range(repeats * 5):
            started = time.perf_counter()
            found = shelf.search([document.sha256], "Where does the treasure lie?")
            searches.append(time.perf_counter() - started)
        assert NEEDLE in found[0].text
        results["documents_search_500_pages_ms"] = statistics.median(searches) * 1000
        results["documents_ttft_attached_over_typed"] = _ttft_ratio(demo, folder, repeats)
    return results


def _best(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def _pypdf_pages(path: Path) -> list[str]:
    from pypdf import PdfReader

    return [page.extract_text() or "" for page in PdfReader(path).pages]


def _ttft_ratio(demo, folder: Path, repeats: int) -> float:
    """Time to first piece of a question with a 5-page PDF attached over the same text typed in (a new chat each)."""
    import asyncio
    from types import SimpleNamespace

    from fixtures.documents_files import write_pdf
    from local_chat.documents import extract
    from local_chat.ui.chat import Cancels
    from local_chat.ui.chat_settings import ChatSettings
    from local_chat.ui.chat_tab import ChatTab
    from local_chat.ui.history import SavedChats
    from local_chat.ui.turns import kind_of

    pdf = write_pdf(folder / "five.pdf", [LINES[:3]] * 5)  # about 1,000 tokens: it goes in whole
    typed = "\n\n".join(extract(pdf, 50).pages) + "\n\nWhat rose?"
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None))
    settings = ChatSettings(None, None, "default", None, "padded_resize", 16, 0.0, 0.75, 0, 1.0)

    async def first_piece(box) -> float:
        started = time.perf_counter()
        async for history, *_ in tab.submit(SimpleNamespace(session_hash="b", username=None), box, [], settings):
            if isinstance(history, list) and kind_of(history[-1]) == "answer" and history[-1]["content"]:
                return time.perf_counter() - started
        raise AssertionError(f"no answer: {history[-1]}")

    attached, plain = [], []
    for round_ in range(repeats + 1):
        for kind in ("attached", "typed") if round_ % 2 == 0 else ("typed", "attached"):
            box = {"text": "What rose?", "files": [str(pdf)]} if kind == "attached" else {"text": typed, "files": []}
            seconds = asyncio.run(first_piece(box))
            if round_:
                (attached if kind == "attached" else plain).append(seconds)
    return statistics.median(attached) / statistics.median(plain)
