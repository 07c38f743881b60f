"""The web in the chat (web/): pages fetched from a local server of real HTML (tests/data/web) within their limits,
never from a private address unless allowed; each provider's HTTP API answered locally in its documented shape; the
page's Search the web switch putting the best passages before the question with a Sources entry, saved and exported;
a follow-up made a standalone query; the model's web_search call on an approval card; /v1's `web_search_options`
with `url_citation` annotations through the `openai` client. No internet: everything is fixtures/web_pages.py's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures.app_server import last_of, serve
from fixtures.web_pages import BRAVE_KEY, TAVILY_KEY, WebSite
from local_chat.errors import UserError
from local_chat.history import Store
from local_chat.tools import Toolbox
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_settings import ChatSettings
from local_chat.ui.chat_tab import ChatTab
from local_chat.ui.history import SavedChats
from local_chat.ui.turns import kind_of
from local_chat.web import (
    FetchLimits,
    Page,
    SearchProvider,
    WebResearch,
    WebTools,
    addresses,
    fetch_pages,
    parse_provider,
    standalone_query,
)
from local_chat.web.context import INSTRUCTION, WebFindings, web_context

END = "<|im_end|>"
BROWSER = "b" * 40
OWNER = "browser:" + BROWSER
REQUEST = SimpleNamespace(session_hash="tab", username=None)
OPEN = FetchLimits(timeout_s=2.0, allow_private=True)  # the local server is 127.0.0.1
QUESTION = "How do I make rustdoc document private items?"


@pytest.fixture(scope="module")
def site():
    with WebSite() as served:
        yield served


def fetched(site, *paths, limits=OPEN) -> list:
    return asyncio.run(fetch_pages([site.url(path) for path in paths], limits))


# ----- pages -----


def test_real_pages_give_their_main_text_and_title_and_a_pdf_its_text(site):
    article, reference, pdf = fetched(site, "/article.html", "/reference.html", "/paper.pdf")
    assert article.title == "What is rustdoc? - The rustdoc book"
    assert "The standard Rust distribution ships with a tool called `rustdoc`" in article.text
    assert "Keyboard shortcuts" not in article.text and "Press ← or →" not in article.text  # the book's menus
    assert reference.title == "Command-line arguments - The rustdoc book" and len(reference.text) > 10_000
    assert "--document-private-items" in reference.text
    assert "The --document-private-items flag makes rustdoc document private items too." in pdf.text


def test_a_redirect_is_followed_and_each_limit_is_one_sentence(site):
    moved, looping, never, huge, image, missing = fetched(
        site, "/moved", "/loop", "/never", "/huge", "/image.png", "/gone", limits=FetchLimits(1.0, allow_private=True)
    )
    assert isinstance(moved, Page) and moved.url == site.url("/article.html")
    assert looping.sentence == f"{site.url('/loop')} redirected more than 5 times, so it was left out."
    assert never.sentence == f"{site.url('/never')} did not answer within 1 s, so it was left out."
    assert huge.sentence == f"{site.url('/huge')} is larger than 5 MB, so it was left out."
    assert image.sentence == f"{site.url('/image.png')} is image/png, not text, HTML or PDF, so it was left out."
    assert missing.sentence == f"{site.url('/gone')} answered HTTP 404, so it was left out."


def test_pages_are_fetched_at_once(site):
    site.delay_s, base = 0.5, site.at_once  # (a page that never answers may still be waiting)
    site.most_at_once = base
    try:
        pages = fetched(site, "/article.html", "/reference.html", "/paper.pdf", "/article.html")
    finally:
        site.delay_s = 0.0
    assert all(isinstance(page, Page) for page in pages)
    assert site.most_at_once - base == 4


# ----- the private-address guard -----


@pytest.mark.parametrize(
    "address, public",
    [("127.0.0.1", False), ("10.1.2.3", False), ("192.168.0.8", False), ("172.16.4.4", False),
     ("169.254.169.254", False), ("100.64.0.1", False), ("::1", False), ("fe80::1", False), ("fd00::1", False),
     ("::ffff:127.0.0.1", False), ("0.0.0.0", False), ("8.8.8.8", True), ("2606:4700::1111", True)],
)  # fmt: skip
def test_private_loopback_and_link_local_addresses_are_not_public(address, public):
    assert addresses.is_public(address) is public


def test_the_model_may_not_fetch_this_machine_or_a_redirect_to_a_private_address(site, monkeypatch):
    (refused,) = fetched(site, "/article.html", limits=FetchLimits(2.0))
    assert refused.sentence == (
        "127.0.0.1 is this machine or a private network's address, so the model may not fetch it "
        "(--web_allow_private allows it)."
    )
    (named,) = asyncio.run(fetch_pages([f"http://localhost:{site.url('').rsplit(':', 1)[1]}/"], FetchLimits(2.0)))
    assert "localhost is this machine or a private network's address" in named.sentence
    # a public page that redirects to the cloud's metadata address: refused at the redirect, nothing fetched there
    public = addresses.is_public
    monkeypatch.setattr(addresses, "is_public", lambda address: address == "127.0.0.1" or public(address))
    site.redirects["/to-metadata"] = "http://169.254.169.254/latest/meta-data/"
    (redirected,) = fetched(site, "/to-metadata", limits=FetchLimits(2.0))
    assert redirected.sentence.startswith("169.254.169.254 is this machine or a private network's address")
    (scheme,) = fetched(site, "/article.html", limits=FetchLimits(2.0))  # allowed now, by the patched check
    assert isinstance(scheme, Page)
    (file_url,) = asyncio.run(fetch_pages(["file:///etc/passwd"], OPEN))
    assert file_url.sentence == "file:///etc/passwd is not an http:// or https:// address, so it was not fetched."


# ----- the providers -----


def provider_of(site, name: str) -> SearchProvider:
    paths = {"searxng": "/searxng", "brave": "/brave/res/v1/web/search", "tavily": "/tavily/search"}
    return SearchProvider(name, site.url(paths[name]) if name in paths else None)


@pytest.mark.parametrize("name", ["searxng", "brave", "tavily", "ddgs"])
def test_each_provider_is_asked_in_its_own_api_and_its_hits_read(site, name, monkeypatch):
    monkeypatch.setenv("BRAVE_API_KEY", BRAVE_KEY)
    monkeypatch.setenv("TAVILY_API_KEY", TAVILY_KEY)
    from ddgs.engines.duckduckgo import Duckduckgo

    monkeypatch.setattr(Duckduckgo, "search_url", site.url("/ddg/html/"))  # ddgs's own HTTP client, local
    hits = asyncio.run(provider_of(site, name).search("rustdoc private items", 5))
    assert site.asked[-1] == "rustdoc private items"
    assert sorted(hit.url for hit in hits) == sorted(site.url(p) for p in ("/article.html", "/reference.html",
                                                                           "/paper.pdf"))  # fmt: skip
    article = next(hit for hit in hits if hit.url.endswith("/article.html"))
    assert article.title == "What is rustdoc?" and article.snippet == "About article.html"


def test_a_provider_that_fails_is_one_sentence(site, monkeypatch):
    monkeypatch.setenv("BRAVE_API_KEY", "a-wrong-key")
    with pytest.raises(
        UserError, match=r"^The web search \(brave\) refused the request \(HTTP 401; set BRAVE_API_KEY\)"
    ):
        asyncio.run(provider_of(site, "brave").search("x"))
    limited = SearchProvider("searxng", site.url("/searxng/limited"))
    with pytest.raises(UserError, match=r"rate-limited now \(HTTP 429\); try again in a minute\.$"):
        asyncio.run(limited.search("x"))
    gone = SearchProvider("searxng", "http://127.0.0.1:9")
    with pytest.raises(UserError) as raised:
        asyncio.run(gone.search("x"))
    assert str(raised.value) == "The web search (searxng) failed: it cannot be reached (is this machine offline?)."


@pytest.mark.parametrize(
    "flag, sentence",
    [("bing", "--web_search bing is not a provider; pass ddgs, searxng=URL, brave, tavily or off."),
     ("searxng", "--web_search searxng needs its address: searxng=http://localhost:8080."),
     ("brave", "--web_search brave needs its API key in the BRAVE_API_KEY environment variable."),
     ("searxng=localhost:8080", "--web_search searxng=localhost:8080: localhost:8080 is not an http:// or https:// "
      "address.")],
)  # fmt: skip
def test_a_wrong_provider_flag_is_one_sentence(flag, sentence, monkeypatch):
    monkeypatch.delenv("BRAVE_API_KEY", raising=False)
    with pytest.raises(UserError) as raised:
        parse_provider(flag)
    assert str(raised.value) == sentence
    assert parse_provider("off") is None and parse_provider("ddgs") == SearchProvider("ddgs")


def test_the_app_refuses_a_wrong_provider_at_launch_in_one_sentence():
    import subprocess
    import sys

    from local_chat.launchers.loading import free_port

    app = Path(__file__).resolve().parent.parent / "app.py"
    done = subprocess.run([sys.executable, str(app), "--web_search", "bing", "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert "error: --web_search bing is not a provider; pass ddgs, searxng=URL, brave, tavily or off." in done.stderr


def test_a_search_reads_its_hits_pages_and_a_pdf_takes_the_searchs_title(site, research):
    findings = asyncio.run(research.search("rustdoc"))
    assert [page.title for page in findings.pages] == [
        "What is rustdoc? - The rustdoc book", "Command-line arguments - The rustdoc book", "Rustdoc field notes"
    ]  # fmt: skip
    assert findings.failures == [] and site.asked[-1] == "rustdoc"


# ----- the query and the passages -----


def test_a_follow_up_becomes_a_standalone_query():
    first = [{"role": "user", "content": "Who designed the Sydney Opera House?"}]
    assert standalone_query(first) == "Who designed the Sydney Opera House?"
    follow = [*first, {"role": "assistant", "content": "Jørn Utzon."}, {"role": "user", "content": "When did it open?"}]
    assert standalone_query(follow) == "When did it open? designed Sydney Opera House"
    alone = [*first, {"role": "assistant", "content": "Jørn Utzon."},
             {"role": "user", "content": "What is the tallest building made of timber in Norway today?"}]  # fmt: skip
    assert standalone_query(alone) == "What is the tallest building made of timber in Norway today?"


def test_the_best_passages_go_in_within_the_budget_numbered_after_the_documents(site):
    pages = [page for page in fetched(site, "/article.html", "/reference.html", "/paper.pdf")]
    findings = WebFindings("rustdoc private items", pages=pages, failures=[f"{site.url('/never')} did not answer."])
    words = lambda text: len(text.split())  # noqa: E731 (a tokenizer's stand-in)
    context = web_context(findings, QUESTION, room=400, count=words, first=3)
    assert context.text.startswith(INSTRUCTION) and words(context.text) <= 400
    assert [source["number"] for source in context.sources] == list(range(3, 3 + len(context.sources)))
    assert "--document-private-items" in context.text  # the passage that answers
    assert context.note == f"Searched the web for “rustdoc private items”. {site.url('/never')} did not answer."
    assert web_context(findings, QUESTION, room=0, count=words).text == ""  # no room: nothing goes in


# ----- the page -----


@pytest.fixture
def research(site):
    return WebResearch(SearchProvider("searxng", site.url("/searxng")), FetchLimits(2.0, allow_private=True))


@pytest.fixture
def page(qwen3_roomy, research, tmp_path):
    """(the chat tab with the web's switch and tools and saved conversations, its forced answers, the store)."""
    model, forced = qwen3_roomy
    store = Store(tmp_path / "conversations.db")
    tab = ChatTab(model.engine, Cancels(), "chat_template", "padded_resize", SavedChats(store),
                  tool_servers=Toolbox.of(WebTools(research)), web=research)  # fmt: skip
    yield tab, forced, store
    store.close()


def settings(conversation=None, web_search=False, tools=None) -> ChatSettings:
    return ChatSettings(conversation, BROWSER, "chat_template", None, "padded_resize", 300, 0.0, 0.75, 0, 1.0, None,
                        None, tools, False, web_search)  # fmt: skip


def ask(tab, text, history=(), conversation=None, web_search=True, tools=None):
    """Send `text`: (entries, prompt panel, conversation id)."""
    box = {"text": text, "files": []}
    entries, _, prompt, conversation, _ = last_of(
        tab.submit(REQUEST, box, list(history), settings(conversation, web_search, tools))
    )
    return entries, prompt, conversation


def test_search_the_web_puts_passages_before_the_question_and_sources_under_the_answer(page, site):
    tab, forced, store = page
    forced.again("Pass --document-private-items [2].", tab.engine.tokenizer.hf, END)
    site.hits = ["/article.html", "/reference.html", "/never", "/image.png"]
    try:
        entries, prompt, conversation = ask(tab, QUESTION)
    finally:
        site.hits = ["/article.html", "/reference.html", "/paper.pdf"]
    assert site.asked[-1] == QUESTION
    assert INSTRUCTION in prompt and f'url="{site.url("/reference.html")}"' in prompt
    assert prompt.index("--document-private-items") < prompt.index(QUESTION)  # the passages, then the question
    kinds = [kind_of(entry) for entry in entries]
    assert kinds == ["question", "answer", "sources", "stats"]
    sources = entries[2]
    assert sources["metadata"]["title"] == "Sources"
    assert f"[Command-line arguments - The rustdoc book]({site.url('/reference.html')})" in sources["content"]
    assert f"{site.url('/never')} did not answer within 2 s, so it was left out." in sources["content"]
    assert "is image/png, not text, HTML or PDF" in sources["content"]
    assert {s["url"] for s in sources["sources"]} <= {site.url("/article.html"), site.url("/reference.html")}
    saved = store.get(OWNER, conversation).messages
    assert saved[2]["sources"] == sources["sources"]  # kept with the conversation
    exported = json.loads(Path(tab.saved.exports.export(OWNER, conversation, "json")).read_text())
    assert exported["messages"][1]["sources"] == sources["sources"]  # with the answer that read them
    imported = tab.saved.exports.import_file(OWNER, tab.saved.exports.export(OWNER, conversation, "json"))
    again = store.get(OWNER, imported).messages
    assert [kind_of(e) for e in again][:3] == ["question", "answer", "sources"] and again[2]["sources"] == sources[
        "sources"
    ]


def test_without_the_switch_nothing_is_searched_and_a_follow_up_searches_its_standalone_query(page, site):
    tab, forced, _ = page
    forced.again("Rustdoc.", tab.engine.tokenizer.hf, END)
    searched = len(site.asked)
    entries, prompt, conversation = ask(tab, "What generates documentation for Rust crates?", web_search=False)
    assert len(site.asked) == searched and INSTRUCTION not in prompt
    forced.again("With a flag [1].", tab.engine.tokenizer.hf, END)
    entries, prompt, _ = ask(tab, "How does it show private items?", entries, conversation)
    assert site.asked[-1] == "How does it show private items? generates documentation Rust crates"


def test_a_failing_provider_is_one_line_in_the_sources_and_the_answer_goes_on(page, site, qwen3_roomy):
    tab, forced, _ = page
    tab.web = WebResearch(SearchProvider("searxng", site.url("/searxng/limited")), OPEN)
    forced.again("I could not look.", tab.engine.tokenizer.hf, END)
    entries, prompt, _ = ask(tab, QUESTION)
    assert [kind_of(entry) for entry in entries] == ["question", "answer", "sources", "stats"]
    assert entries[1]["content"] == "I could not look."
    assert "rate-limited now (HTTP 429)" in entries[2]["content"] and INSTRUCTION not in prompt


def test_the_models_web_search_call_waits_on_its_card_then_runs(page, site):
    tab, forced, _ = page
    call = '<tool_call>\n{"name": "web_search", "arguments": {"query": "rustdoc private items"}}\n</tool_call>'
    forced.again("No tools.", tab.engine.tokenizer.hf, END)
    _, prompt, _ = ask(tab, "Hello.", web_search=False)
    assert "web_search" not in prompt  # the web's tools are off until ticked under Tools
    assert tab.tools.tools_of(None, BROWSER, REQUEST) == []
    forced.in_turn([call, "Found it [1]."], tab.engine.tokenizer.hf, END)
    ticked = ["web/web_search", "web/fetch_page"]
    entries, _, conversation = ask(tab, "Search for rustdoc's private items flag.", web_search=False, tools=ticked)
    assert tab.tools.tools_of(conversation, BROWSER, REQUEST) == ticked  # kept with the conversation
    card = entries[-1]
    assert kind_of(card) == "tool_call" and card["approval"] == "ask" and card["server"] == "web"
    assert [o["value"] for o in card["options"]] == ["allow", "always", "deny"]
    chosen = SimpleNamespace(value="allow", index=0)
    entries, prompt, _, _ = last_of(tab.decide(REQUEST, chosen, entries, settings(conversation, tools=ticked)))
    result = next(entry for entry in entries if kind_of(entry) == "tool_result")
    assert f"[1] What is rustdoc?\n{site.url('/article.html')}\nAbout article.html" in result["result"]
    assert entries[-2]["content"] == "Found it [1]." or entries[-1]["content"] == "Found it [1]."


def test_fetch_page_refuses_a_private_address_without_the_flag(site):
    tools = WebTools(WebResearch(SearchProvider("searxng", site.url("/searxng")), FetchLimits(2.0)))
    outcome = asyncio.run(tools.call(tools.tool("fetch_page"), {"url": site.url("/article.html")}))
    assert outcome.failed and "(--web_allow_private allows it)" in outcome.text
    allowed = WebTools(WebResearch(SearchProvider("searxng", site.url("/searxng")), OPEN))
    outcome = asyncio.run(allowed.call(allowed.tool("fetch_page"), {"url": site.url("/article.html")}))
    assert not outcome.failed and outcome.text.startswith("What is rustdoc? - The rustdoc book\n")


# ----- /v1 -----


def test_web_search_options_answers_with_url_citations_through_the_openai_client(qwen3_roomy, research, site):
    from openai import OpenAI

    model, forced = qwen3_roomy
    forced.again("Pass --document-private-items [1], as the book says [9].", model.tokenizer.hf, END)
    site.hits = ["/reference.html"]
    try:
        with serve(model, web=research) as (url, _):
            client = OpenAI(base_url=url + "/v1", api_key="none")
            messages = [{"role": "user", "content": QUESTION}]
            reply = client.chat.completions.create(model="m", messages=messages, web_search_options={}, max_tokens=100)
            forced.again()
            stream = client.chat.completions.create(
                model="m", messages=messages, web_search_options={"search_context_size": "low"}, stream=True,
                max_tokens=100,
            )  # fmt: skip
            chunks = list(stream)
            plain = client.chat.completions.create(model="m", messages=messages, max_tokens=5)
    finally:
        site.hits = ["/article.html", "/reference.html", "/paper.pdf"]
    message = reply.choices[0].message
    assert message.content == "Pass --document-private-items [1], as the book says [9]."
    (annotation,) = message.annotations  # [9] names no page
    start = message.content.index("[1]")
    assert annotation.type == "url_citation"
    assert (annotation.url_citation.start_index, annotation.url_citation.end_index) == (start, start + 3)
    assert annotation.url_citation.url == site.url("/reference.html")
    assert annotation.url_citation.title == "Command-line arguments - The rustdoc book"
    streamed = [a for c in chunks if c.choices for a in (getattr(c.choices[0].delta, "annotations", None) or [])]
    assert [a["url_citation"]["url"] for a in streamed] == [site.url("/reference.html")]
    assert plain.choices[0].message.annotations is None  # no search asked, none given


def test_a_v1_client_asking_for_the_web_search_tool_gets_the_answer_after_the_server_ran_it(
    qwen3_roomy, research, site
):
    from openai import OpenAI

    model, forced = qwen3_roomy
    call = '<tool_call>\n{"name": "web_search", "arguments": {"query": "rustdoc private items"}}\n</tool_call>'
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    with serve(model, web=research) as (url, _):
        client = OpenAI(base_url=url + "/v1", api_key="none")
        messages = [{"role": "user", "content": "Find rustdoc's private items flag."}]
        forced.in_turn([call, "It is --document-private-items."], model.tokenizer.hf, END)
        reply = client.chat.completions.create(model="m", messages=messages, tools=[{"type": "web_search"}],
                                               max_tokens=200)  # fmt: skip
        forced.in_turn([call, "It is --document-private-items."], model.tokenizer.hf, END)
        stream = client.chat.completions.create(model="m", messages=messages, tools=[{"type": "web_search"}, weather],
                                                max_tokens=200, stream=True)  # fmt: skip
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        forced.in_turn(['<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'], model.tokenizer.hf, END)
        own = client.chat.completions.create(model="m", messages=messages, tools=[{"type": "web_search"}, weather],
                                             max_tokens=200)  # fmt: skip
    message = reply.choices[0].message
    assert message.content == "It is --document-private-items." and not message.tool_calls
    assert reply.choices[0].finish_reason == "stop" and site.asked[-1] == "rustdoc private items"
    assert streamed == "It is --document-private-items."
    assert [c.function.name for c in own.choices[0].message.tool_calls] == ["get_weather"]  # the client's own
    assert own.choices[0].finish_reason == "tool_calls"


def test_web_search_options_on_a_server_without_web_search_is_a_400(qwen3_roomy):
    import httpx

    model, _ = qwen3_roomy
    with serve(model) as (url, _):
        body = {"messages": [{"role": "user", "content": "hi"}], "web_search_options": {}}
        reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        size = httpx.post(url + "/v1/chat/completions", json=body | {"web_search_options": {"search_context_size": 3}})
        tools = {"messages": body["messages"], "tools": [{"type": "web_search"}]}
        tool = httpx.post(url + "/v1/chat/completions", json=tools, timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == "This server searches no web (it was started with --web_search off)."
    assert size.json()["error"]["message"].startswith("`web_search_options.search_context_size` is 3;")
    assert tool.status_code == 400 and tool.json()["error"]["param"] == "tools"


def test_the_web_tools_are_offered_only_where_the_model_calls_tools(qwen3_roomy, research):
    from local_chat.defaults import DEMO_MODEL
    from local_chat.model.meta import MetaModel

    demo = MetaModel.from_pretrained(str(DEMO_MODEL))  # its template shows no tools
    toolbox = Toolbox.of(WebTools(research))
    plain = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None), tool_servers=toolbox)
    calling = ChatTab(qwen3_roomy[0].engine, Cancels(), "chat_template", "padded_resize", SavedChats(None),
                      tool_servers=toolbox)  # fmt: skip
    assert plain.tools.servers is None  # no Tools control, no tools in its prompt
    assert [t.called for t in calling.tools.servers.tools] == ["web_search", "fetch_page"]
