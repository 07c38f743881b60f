"""Web pages fetched and read: with httpx (a time-out for the whole page, a size cap, at most `max_redirects`
redirects, each one's address checked as the first: web/addresses.py), text, HTML and PDF only; the main text of
HTML taken with trafilatura (menus, footers and ads left out), a PDF read by the documents' reader
(documents/extract.py). `fetch_pages` fetches them all at once; a page that fails is a `PageFailure` with its
sentence, and the others are read.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from local_chat.errors import UserError

from .addresses import checked_url

HTML_TYPES = ("text/html", "application/xhtml+xml")
TEXT_TYPES = ("text/plain", "text/markdown")
PDF_TYPES = ("application/pdf",)
USER_AGENT = "Mozilla/5.0 (compatible; local-chat; +https://github.com/) like Gecko"


@dataclass(frozen=True)
class FetchLimits:
    """How far a fetch may go: its whole time, its bytes, its redirects, and whether private addresses may be
    reached (`--web_allow_private`)."""

    timeout_s: float = 10.0
    max_bytes: int = 5_000_000
    max_redirects: int = 5
    allow_private: bool = False


@dataclass(frozen=True)
class Page:
    """A page's address (after its redirects), title and main text."""

    url: str
    title: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256((self.url + "\n" + self.text).encode()).hexdigest()


@dataclass(frozen=True)
class PageFailure:
    url: str
    sentence: str


async def fetch_pages(urls: list[str], limits: FetchLimits) -> list[Page | PageFailure]:
    """Every page of `urls`, fetched at once, in their order."""
    import httpx

    timeout = httpx.Timeout(limits.timeout_s, connect=min(limits.timeout_s, 5.0))
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, headers={"User-Agent": USER_AGENT}) as client:
        return list(await asyncio.gather(*(fetch_page(client, url, limits) for url in urls)))


async def fetch_page(client, url: str, limits: FetchLimits) -> Page | PageFailure:
    """One page, read, or why it could not be."""
    try:
        return await asyncio.wait_for(_fetched(client, url, limits), limits.timeout_s)
    except TimeoutError:
        return PageFailure(url, f"{url} did not answer within {limits.timeout_s:g} s, so it was left out.")
    except UserError as error:
        return PageFailure(url, str(error))
    except Exception as error:  # noqa: BLE001 (a network failure is the page's sentence; the others go on)
        return PageFailure(url, f"{url} could not be fetched ({type(error).__name__}: {error}).")


async def _fetched(client, url: str, limits: FetchLimits) -> Page:
    for _ in range(limits.max_redirects + 1):
        await checked_url(url, limits.allow_private)
        async with client.stream("GET", url) as response:
            if response.is_redirect and "location" in response.headers:
                url = urljoin(url, response.headers["location"])
                continue
            if response.status_code >= 400:
                raise UserError(f"{url} answered HTTP {response.status_code}, so it was left out.")
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind not in (*HTML_TYPES, *TEXT_TYPES, *PDF_TYPES):
                raise UserError(f"{url} is {kind or 'of no stated type'}, not text, HTML or PDF, so it was left out.")
            body = await _body(response, url, limits.max_bytes)
            return await asyncio.to_thread(read_page, str(response.url), kind, body, response.encoding)
    raise UserError(f"{url} redirected more than {limits.max_redirects} times, so it was left out.")


async def _body(response, url: str, max_bytes: int) -> bytes:
    """The response's bytes, up to `max_bytes` (`UserError` beyond: neither read on nor kept)."""
    stated = response.headers.get("content-length", "")
    too_big = f"{url} is larger than {max_bytes / 1e6:g} MB, so it was left out."
    if stated.isdigit() and int(stated) > max_bytes:
        raise UserError(too_big)
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise UserError(too_big)
        chunks.append(chunk)
    return b"".join(chunks)


def read_page(url: str, kind: str, body: bytes, encoding: str | None) -> Page:
    """A fetched page's title and main text (`UserError` where it holds none)."""
    if kind in PDF_TYPES:
        return _pdf_page(url, body)
    text = body.decode(encoding or "utf-8", errors="replace")
    if kind in TEXT_TYPES:
        return Page(url, address_name(url), text.strip())
    import trafilatura

    main = trafilatura.extract(text, url=url, output_format="markdown", include_comments=False, include_tables=True)
    if not (main or "").strip():
        raise UserError(f"{url} holds no text that could be read (a page made by its scripts?), so it was left out.")
    return Page(url, _title(text, main) or address_name(url), main.strip())


def _title(page: str, main: str) -> str:
    """The page's title as a browser's tab shows it, else its text's first heading."""
    found = re.search(r"<title[^>]*>(.*?)</title>", page[:200_000], re.S | re.I)
    if found and (title := " ".join(html.unescape(found.group(1)).split())):
        return title
    heading = re.search(r"^#+ (.+)$", main, re.M)
    return heading.group(1).strip() if heading else ""


def _pdf_page(url: str, body: bytes) -> Page:
    from local_chat.documents import extract_elsewhere

    name = address_name(url)
    name = name if name.lower().endswith(".pdf") else "page.pdf"
    with tempfile.TemporaryDirectory(prefix="web-pdf-") as folder:
        path = Path(folder) / name
        path.write_bytes(body)
        document = extract_elsewhere(str(path), len(body) / 1e6 + 1, name)
    return Page(url, name, "\n\n".join(document.pages).strip())


def address_name(url: str) -> str:
    """What a page is called where it says nothing itself: its address's file name, else its host."""
    parts = urlsplit(url)
    return Path(parts.path).name or parts.hostname or url
