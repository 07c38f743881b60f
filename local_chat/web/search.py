"""Web search providers, chosen by `--web_search PROVIDER` (or a model's `web_search` in --models_config):
`ddgs` (DuckDuckGo and the other engines of the `ddgs` package; no key: the default), `searxng=URL` (a self-hosted
SearXNG, its JSON API), `brave` (Brave Search's API, key in BRAVE_API_KEY) and `tavily` (Tavily's API, key in
TAVILY_API_KEY); `brave=URL` and `tavily=URL` send to another address of the same API (a proxy, or the tests' own).
`off`: no web search. A provider that fails says so in one sentence (`UserError`), which the Sources show.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from local_chat.errors import UserError

PROVIDERS = ("ddgs", "searxng", "brave", "tavily")
BRAVE_URL = "https://api.search.brave.com/res/v1/web/search"
TAVILY_URL = "https://api.tavily.com/search"
KEYS = {"brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY"}
SEARCH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str


@dataclass(frozen=True)
class SearchProvider:
    """One provider: its name and, where it has one, the address of its API."""

    name: str
    url: str | None = None

    def __str__(self) -> str:
        return self.name if self.url is None else f"{self.name}={self.url}"

    async def search(self, query: str, count: int = 5) -> list[SearchHit]:
        """The provider's first `count` hits for `query`; `UserError` with one sentence where it fails."""
        try:
            hits = await asyncio.wait_for(self._search(query, count), SEARCH_TIMEOUT_S)
        except UserError:
            raise
        except TimeoutError:
            raise UserError(f"The web search ({self.name}) did not answer within {SEARCH_TIMEOUT_S:g} s.")
        except Exception as error:  # noqa: BLE001 (a provider's failure, rate limits included, is its sentence)
            raise UserError(f"The web search ({self.name}) failed: {_said(error)}.")
        return [hit for hit in hits if hit.url.startswith(("http://", "https://"))][:count]

    async def _search(self, query: str, count: int) -> list[SearchHit]:
        if self.name == "ddgs":
            return await asyncio.to_thread(_ddgs, query, count)
        import httpx

        async with httpx.AsyncClient(timeout=SEARCH_TIMEOUT_S) as client:
            if self.name == "searxng":
                response = await client.get(self.url.rstrip("/") + "/search", params={"q": query, "format": "json"})
                return _hits(_json(response, self.name).get("results"), "content")
            key = os.environ.get(KEYS[self.name], "")
            if self.name == "brave":
                response = await client.get(
                    self.url or BRAVE_URL,
                    params={"q": query, "count": count},
                    headers={"X-Subscription-Token": key, "Accept": "application/json"},
                )
                return _hits((_json(response, self.name).get("web") or {}).get("results"), "description")
            response = await client.post(
                self.url or TAVILY_URL,
                json={"query": query, "max_results": count},
                headers={"Authorization": f"Bearer {key}"},
            )
            return _hits(_json(response, self.name).get("results"), "content")


def _ddgs(query: str, count: int) -> list[SearchHit]:
    from ddgs import DDGS

    results = DDGS(timeout=int(SEARCH_TIMEOUT_S)).text(query, max_results=count, backend="duckduckgo")
    return _hits(results, "body", address="href")


def _hits(results, snippet: str, address: str = "url") -> list[SearchHit]:
    """A provider's results (JSON objects) as hits: each one's title, address and snippet under the provider's keys."""
    return [SearchHit(r.get("title", ""), r.get(address, ""), r.get(snippet, "")) for r in results or []]


def _json(response, name: str) -> dict:
    if response.status_code == 429:
        raise UserError(f"The web search ({name}) is rate-limited now (HTTP 429); try again in a minute.")
    if response.status_code in (401, 403):
        key = KEYS.get(name)
        hint = f"; set {key}" if key else ""
        raise UserError(f"The web search ({name}) refused the request (HTTP {response.status_code}{hint}).")
    if response.status_code >= 400:
        raise UserError(f"The web search ({name}) answered HTTP {response.status_code}.")
    try:
        data = response.json()
    except ValueError:
        raise UserError(f"The web search ({name}) did not answer JSON (is its JSON format switched on?).")
    return data if isinstance(data, dict) else {}


def _said(error: BaseException) -> str:
    """A provider's failure in a few words: unreachable, rate-limited, or its own first line."""
    text = str(error).strip()
    kind = type(error).__name__
    if "Ratelimit" in kind:
        return "it is rate-limited now; try again in a minute"
    if any(word in text or word in kind for word in ("DNS", "ConnectError", "Connection refused", "connect")):
        return "it cannot be reached (is this machine offline?)"
    return (text.splitlines()[0] if text else kind)[:160]


def parse_provider(text: str | None) -> SearchProvider | None:
    """`--web_search`'s value as a provider (None: `off`); `UserError` naming what it takes."""
    if text is None or text.strip().lower() in ("off", "none", ""):
        return None
    name, _, url = text.strip().partition("=")
    name = name.lower()
    if name not in PROVIDERS:
        raise UserError(f"--web_search {text} is not a provider; pass ddgs, searxng=URL, brave, tavily or off.")
    if url and not url.startswith(("http://", "https://")):
        raise UserError(f"--web_search {text}: {url} is not an http:// or https:// address.")
    if name == "searxng" and not url:
        raise UserError("--web_search searxng needs its address: searxng=http://localhost:8080.")
    if name == "ddgs" and url:
        raise UserError("--web_search ddgs takes no address.")
    if name in KEYS and not os.environ.get(KEYS[name]):
        raise UserError(f"--web_search {name} needs its API key in the {KEYS[name]} environment variable.")
    return SearchProvider(name, url or None)
