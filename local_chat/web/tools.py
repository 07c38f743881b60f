"""The web as the model's own tools: `web_search(query)` (the provider's hits: title, address, snippet) and
`fetch_page(url)` (a page's main text, through the same guard and limits as the page's search), offered beside
--mcp_config's tools and run through the same approval cards (tools/toolbox.py)."""

from __future__ import annotations

import time

from local_chat.errors import UserError
from local_chat.tools import Tool, ToolOutcome

from .context import WebResearch
from .pages import PageFailure, fetch_pages

SERVER = "web"  # the tools' "server", in their cards and the "always allow" lists
PAGE_CHARS = 8000  # of a page's text, at most, in a fetch_page result

SEARCH = Tool(
    SERVER,
    "web_search",
    "web_search",
    "Search the web. Returns the first results: each one's title, address and a snippet.",
    {"type": "object", "properties": {"query": {"type": "string", "description": "What to search for"}},
     "required": ["query"]},
)  # fmt: skip
FETCH = Tool(
    SERVER,
    "fetch_page",
    "fetch_page",
    "Read a web page. Returns its title and main text.",
    {"type": "object", "properties": {"url": {"type": "string", "description": "The page's http(s) address"}},
     "required": ["url"]},
)  # fmt: skip


class WebTools:
    """`web_search` and `fetch_page` over one `WebResearch` (its provider and fetch limits)."""

    def __init__(self, research: WebResearch):
        self.research = research
        self.tools = [SEARCH, FETCH]
        self.problems: dict[str, str] = {}

    def tool(self, called: str) -> Tool | None:
        return next((t for t in self.tools if t.called == called), None)

    async def call(self, tool: Tool, arguments: dict) -> ToolOutcome:
        started = time.monotonic()
        try:
            text = await (self._search(arguments) if tool.name == SEARCH.name else self._fetch(arguments))
            outcome = ToolOutcome(text)
        except UserError as error:
            outcome = ToolOutcome(str(error), failed=True)
        outcome.seconds = time.monotonic() - started
        return outcome

    async def _search(self, arguments: dict) -> str:
        query = _argument(arguments, "query")
        hits = await self.research.provider.search(query, self.research.pages)
        if not hits:
            return f"No results for “{query}”."
        return "\n\n".join(f"[{n}] {hit.title}\n{hit.url}\n{hit.snippet}" for n, hit in enumerate(hits, 1))

    async def _fetch(self, arguments: dict) -> str:
        (read,) = await fetch_pages([_argument(arguments, "url")], self.research.limits)
        if isinstance(read, PageFailure):
            raise UserError(read.sentence)
        text = read.text if len(read.text) <= PAGE_CHARS else read.text[:PAGE_CHARS] + "\n[… the rest left out]"
        return f"{read.title}\n{read.url}\n\n{text}"

    def close(self) -> None:
        pass


def _argument(arguments: dict, name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str) or not value.strip():
        raise UserError(f'The call needs "{name}" as a text.')
    return value.strip()
