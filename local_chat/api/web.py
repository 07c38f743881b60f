"""/v1's web: `web_search_options` (the last question searched on the server and the best passages put before it, as
the page's Search the web switch does: web/context.py), and the built-in tools a client asks for with
`{"type": "web_search"}` in `tools` (OpenAI's Responses name; `web_search_preview` too): the model gets `web_search`
and `fetch_page` (web/tools.py), and its calls of them run on the server, the answer going on after their results,
while the calls of the client's own tools come back to it as always."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace

from local_chat.defaults import MAX_TOOL_ROUNDS
from local_chat.engine import Delta, End, Request
from local_chat.engine.interface import ToolCallDelta, add_call_piece
from local_chat.errors import UserError
from local_chat.tools import arguments_of
from local_chat.web import WebTools, put_web_in_prompt, standalone_query

from .requests import bad

NO_WEB = "This server searches no web (it was started with --web_search off)."


async def searched(engine, web, request: Request, pages: int, first: int) -> list[dict]:
    """`request`'s messages with the web's best passages for its last question before it (its first `pages` pages
    read, numbered from `first`); the sources its answer may cite."""
    if web is None:
        raise bad(NO_WEB, "web_search_options")
    research = replace(web, pages=pages)
    findings = await research.search(standalone_query(request.messages))
    request.messages, context = put_web_in_prompt(
        engine, request.messages, request.chat.answer_tokens, findings, first, research.reranker
    )
    return context.sources


def with_web_rounds(engine, request: Request, events: Iterator, tools: WebTools) -> Iterator:
    """`events` of `request`'s answer, where an answer whose calls are all of the built-in web tools does not end: the
    calls run here and the model answers again with their results (at most `MAX_TOOL_ROUNDS` rounds), its text
    streaming on; the last answer's calls and end are the client's."""
    for round_ in range(MAX_TOOL_ROUNDS + 1):
        calls, text, end = yield from _one_answer(events)
        if end is None:
            return
        built_in = calls and all(tools.tool(call.name) is not None for call in calls)
        if not built_in or round_ == MAX_TOOL_ROUNDS or (request.cancel and request.cancel.is_set()):
            yield from _pieces(calls)
            yield end
            return
        results = [asyncio.run(_run(tools, call)) for call in calls]
        answered = {"role": "assistant", "content": text, "tool_calls": [call.openai() for call in calls]}
        request = replace(request, messages=[*request.messages, answered, *results])
        events = engine.stream(request)


def _one_answer(events: Iterator):
    """One answer's events passed on but its calls and its end, held back; returns (its calls, its text, its end:
    None where the stream stopped without one)."""
    calls: list[ToolCallDelta] = []
    text: list[str] = []
    for event in events:
        if isinstance(event, End):
            return calls, "".join(text), event
        if isinstance(event, ToolCallDelta):
            add_call_piece(calls, event)
            continue
        if isinstance(event, Delta):
            text.append(event.text)
        yield event
    return calls, "".join(text), None


async def _run(tools: WebTools, call: ToolCallDelta) -> dict:
    """A call of a web tool run, as the `tool` message of its result."""
    try:
        content = (await tools.call(tools.tool(call.name), arguments_of(call.openai()))).text
    except UserError as error:
        content = str(error)
    return {"role": "tool", "tool_call_id": call.id, "content": content}


def _pieces(calls: list[ToolCallDelta]) -> Iterator[ToolCallDelta]:
    """Whole calls as the pieces a client is sent."""
    for index, call in enumerate(calls):
        yield replace(call, index=index)
