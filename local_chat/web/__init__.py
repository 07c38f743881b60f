"""The web in the chat: searches (web/search.py: ddgs, SearXNG, Brave, Tavily), pages fetched and read
(web/pages.py, never a private address unless allowed: web/addresses.py), their best passages put before a question
with numbered sources (web/context.py), and the model's own `web_search` and `fetch_page` tools (web/tools.py)."""

from .context import WebContext, WebFindings, WebResearch, put_web_in_prompt, standalone_query, web_context
from .pages import FetchLimits, Page, PageFailure, fetch_pages
from .search import SearchHit, SearchProvider, parse_provider
from .tools import WebTools

__all__ = [
    "FetchLimits",
    "Page",
    "PageFailure",
    "SearchHit",
    "SearchProvider",
    "WebContext",
    "WebFindings",
    "WebResearch",
    "WebTools",
    "fetch_pages",
    "parse_provider",
    "put_web_in_prompt",
    "standalone_query",
    "web_context",
]
