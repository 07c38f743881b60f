"""Documents attached to a question: their text, page by page, read with the libraries made for each kind (PDF:
pypdfium2, PDFium's text, 3.7x faster than pypdf for the same text in bench/documents.py; Word: python-docx; text,
Markdown, CSV, JSON, HTML and source files: decoded), in a process of its own (`extract_elsewhere`), so that a long PDF
never holds the web server's loop. A file that cannot be read is one sentence (`UserError`) that says why and what to
do.
"""

from __future__ import annotations

import hashlib
import html.parser
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from local_chat.errors import UserError

TEXT_SUFFIXES = (
    ".txt .md .markdown .csv .tsv .json .jsonl .xml .yaml .yml .toml .ini .cfg .log .rst .tex .sql .py .js .ts .tsx "
    ".jsx .java .c .h .cc .cpp .hpp .cs .go .rs .rb .php .sh .bash .swift .kt .scala .r .m .lua .pl .css .scss"
).split()
HTML_SUFFIXES = (".html", ".htm")
DOCUMENT_SUFFIXES = (".pdf", ".docx", *HTML_SUFFIXES, *TEXT_SUFFIXES)
PAGE_CHARS = 3000  # a "page" of a document that has none (text, Word): about a printed page
UNZIPPED_RATIO = 100  # a .docx that unzips to more than this many times --max_upload_mb is refused (a zip bomb)


@dataclass(frozen=True)
class Document:
    """A document's text: its name, its SHA-256 (its bytes'), and its pages' text (PDF pages; else cut about
    `PAGE_CHARS` apart); `paged`: the pages are the file's own."""

    name: str
    sha256: str
    pages: tuple[str, ...]
    paged: bool = False

    @property
    def named(self) -> dict:
        """How a question names it (its "documents" entries)."""
        return {"sha256": self.sha256, "name": self.name}


def is_document(path: str | Path) -> bool:
    return Path(path).suffix.lower() in DOCUMENT_SUFFIXES


def extract(path: str | Path, max_upload_mb: float, name: str | None = None) -> Document:
    """The text of the document at `path` (`name`: the one the user knows it by)."""
    path = Path(path)
    name = name or path.name
    size = path.stat().st_size
    if size > max_upload_mb * 1e6:
        raise UserError(f"{name} is {size / 1e6:.1f} MB, over the {max_upload_mb:g} MB limit (--max_upload_mb).")
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        return Document(name, sha, _pdf_pages(path, name), paged=True)
    if suffix == ".docx":
        return Document(name, sha, cut_pages(mended(_docx_text(path, name, max_upload_mb))))
    if suffix in HTML_SUFFIXES:
        return Document(name, sha, cut_pages(mended(html_text(decoded(data, name)))))
    if suffix in TEXT_SUFFIXES:
        return Document(name, sha, cut_pages(mended(decoded(data, name))))
    raise UserError(
        f"{name}: this kind of file cannot be read; attach a PDF, a Word (.docx), text, Markdown, CSV, JSON, HTML or "
        "source file, or an image."
    )


def _pdf_pages(path: Path, name: str) -> tuple[str, ...]:
    import pypdfium2

    try:
        document = pypdfium2.PdfDocument(str(path))
    except pypdfium2.PdfiumError as error:
        if "password" in str(error).lower():
            raise UserError(f"{name} is encrypted; remove its password (print it to a new PDF) and attach it again.")
        raise UserError(f"{name} cannot be read as a PDF ({error}); it may be damaged.")
    try:
        pages = tuple(repaired(page.get_textpage().get_text_range().replace("\r\n", "\n")) for page in document)
    finally:
        document.close()
    if not any(page.strip() for page in pages):
        raise UserError(f"{name}: no text found (a scan?); attach its pages as images instead.")
    return pages


def _docx_text(path: Path, name: str, max_upload_mb: float) -> str:
    import docx

    try:
        with zipfile.ZipFile(path) as archive:
            unzipped = sum(item.file_size for item in archive.infolist())
        if unzipped > max_upload_mb * 1e6 * UNZIPPED_RATIO:
            raise UserError(f"{name} unzips to {unzipped / 1e6:.0f} MB, far more than a document holds; not read.")
        document = docx.Document(str(path))
    except UserError:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as error:
        raise UserError(f"{name} cannot be read as a Word document ({error}); save it again as .docx.")
    blocks = [p.text for p in document.paragraphs]
    for table in document.tables:
        blocks += [" | ".join(cell.text for cell in row.cells) for row in table.rows]
    text = "\n".join(blocks)
    if not text.strip():
        raise UserError(f"{name}: no text found in it.")
    return text


def decoded(data: bytes, name: str) -> str:
    """Text bytes as text: UTF-8 (with or without its mark), else the encoding charset-normalizer finds."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        from charset_normalizer import from_bytes

        best = from_bytes(data).best()
        if best is None:
            raise UserError(f"{name} is not text (no encoding reads it); attach a text file, a PDF or a .docx.")
        return str(best)


def mended(text: str) -> str:
    """Text with mojibake undone (UTF-8 read as Latin-1 or Windows-1252: "CafÃ©"), ligatures spelled out: ftfy's
    repairs, quotes left as they are."""
    import ftfy

    return ftfy.fix_text(text, uncurl_quotes=False)


def repaired(text: str) -> str:
    """A PDF page's text with what extraction leaves behind mended: mojibake and ligatures (`mended`), soft hyphens
    dropped and hyphenated line ends joined, runs of blank lines made one."""
    text = re.sub(r"(\w)-\n(\w)", r"\1\2", mended(text).replace("\u00ad", ""))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


class _HTMLText(html.parser.HTMLParser):
    SKIPPED = ("script", "style", "head", "noscript")
    BREAKS = ("p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "pre")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skipping = [], 0

    def handle_starttag(self, tag, attrs):
        self.skipping += tag in self.SKIPPED
        if tag in self.BREAKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        self.skipping -= tag in self.SKIPPED and self.skipping > 0

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def html_text(markup: str) -> str:
    parser = _HTMLText()
    parser.feed(markup)
    return re.sub(r"\n\s*\n+", "\n\n", "".join(parser.parts)).strip()


def cut_pages(text: str) -> tuple[str, ...]:
    """Text cut into pages of about `PAGE_CHARS`, at line ends where there are some."""
    pages, start = [], 0
    while start < len(text):
        end = min(len(text), start + PAGE_CHARS)
        if end < len(text):
            line_end = text.rfind("\n", start + PAGE_CHARS // 2, end)
            end = line_end + 1 if line_end > 0 else end
        pages.append(text[start:end])
        start = end
    return tuple(pages) or ("",)


def rendered_pages(path: str | Path, pages: int, scale: float = 1.5) -> list[str]:
    """PNG files of a PDF's first `pages` pages (beside it, in a folder of their own), as pictures of 108 dpi."""
    import tempfile

    import pypdfium2

    path = Path(path)
    try:
        document = pypdfium2.PdfDocument(str(path))
    except pypdfium2.PdfiumError as error:
        raise UserError(f"{path.name} cannot be shown as pictures ({error}).")
    folder = Path(tempfile.mkdtemp(prefix="pdf-pages-"))
    try:
        made = []
        for number in range(min(pages, len(document))):
            picture = folder / f"{path.stem}-page-{number + 1}.png"
            document[number].render(scale=scale).to_pil().save(picture)
            made.append(str(picture))
        return made
    finally:
        document.close()


def extract_elsewhere(path: str, max_upload_mb: float, name: str | None = None) -> Document:
    """`extract` in a process of its own (one kept for the app), so that the web server's loop goes on serving."""
    return _elsewhere(extract, path, max_upload_mb, name)


def render_elsewhere(path: str, pages: int) -> list[str]:
    """`rendered_pages` in the same process as the reading."""
    return _elsewhere(rendered_pages, path, pages)


def _elsewhere(work, path: str, *args):
    import concurrent.futures

    global _POOL
    if _POOL is None:
        import multiprocessing

        _POOL = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        return _POOL.submit(work, path, *args).result()
    except concurrent.futures.process.BrokenProcessPool:
        _POOL = None
        raise UserError(f"{Path(path).name} made the reader fail; it may be damaged or too large.")


_POOL = None
