"""Documents the tests make: PDFs written here byte by byte (text pages in Helvetica, or pages with no text, as a
scan has), an encrypted PDF (pypdf's writer), a broken one, a .docx (python-docx), a .docx zip bomb and long text."""

from __future__ import annotations

import zipfile
from pathlib import Path


def pdf_bytes(pages: list[list[str]]) -> bytes:
    """A PDF whose pages hold these lines of text (an empty list: a page with no text)."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", None, "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for lines in pages:
        text = "".join(f"({_escaped(line)}) Tj T* " for line in lines)
        stream = f"BT /F1 11 Tf 14 TL 72 740 Td {text}ET" if lines else ""
        objects.append(f"<< /Length {len(stream.encode())} >>\nstream\n{stream}\nendstream")
        content = len(objects)
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {content} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>"
        )
        kids.append(len(objects))
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)} >>"
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def _escaped(line: str) -> str:
    return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def write_pdf(path: Path, pages: list[list[str]]) -> Path:
    path.write_bytes(pdf_bytes(pages))
    return path


def write_encrypted_pdf(path: Path) -> Path:
    from pypdf import PdfReader, PdfWriter

    plain = write_pdf(path.with_name("plain-" + path.name), [["A secret page."]])
    writer = PdfWriter()
    for page in PdfReader(plain).pages:
        writer.add_page(page)
    writer.encrypt("password")
    with open(path, "wb") as file:
        writer.write(file)
    return path


def write_docx(path: Path, paragraphs: list[str]) -> Path:
    import docx

    document = docx.Document()
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    document.save(str(path))
    return path


def write_docx_bomb(path: Path, unzipped_mb: int) -> Path:
    """A .docx that unzips to `unzipped_mb` MB of zeros (a few hundred KB zipped)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w") as member:
            block = b"\0" * 1_000_000
            for _ in range(unzipped_mb):
                member.write(block)
    return path


def long_text(pages: int, needle: str, at_page: int) -> str:
    """`pages` pages of varied filler text (about 3,000 characters each) with `needle` on page `at_page` (1-based)."""
    topics = ["rivers", "mountains", "markets", "harbours", "gardens", "railways", "libraries", "bridges"]
    out = []
    for page in range(1, pages + 1):
        topic = topics[page % len(topics)]
        filler = f"Page {page} is about the {topic} of the region, their history and how people use them today. " * 30
        out.append(filler + (f"\n\n{needle}\n\n" if page == at_page else "\n\n"))
    return "".join(out)
