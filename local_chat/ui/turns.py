"""The chat's messages as the page keeps them: a typed list in `gr.State`, of which the Chatbot's value is only a view.

Each entry is a Gradio chat message ({"role", "content", "metadata"?}) with its kind under "kind": a question
("user") and an answer ("assistant") need none; the others are "thinking" (a reasoning model's thought, shown folded
above its answer, and sent back to the model as the answer's `reasoning_content`), "error", "notice" (a note in the
chat: older turns left out), "stats" (an answer's figures), "stopped", "sources" (the documents an answer read:
ui/documents.py), "tool_call" and "tool_result" (a call the model made, with its "approval" where the page runs it:
ui/tool_rounds.py; or an imported conversation's). Gradio drops metadata keys it does not know, so the kind is never
read from metadata or text: an entry without one is a question or an answer by its role. Saved conversations store
these entries (history/store.py).
"""

from __future__ import annotations

import json
import re

from local_chat.history.kinds import NOT_FOR_THE_MODEL, Approval, Kind
from local_chat.prompting import message_text

ERROR_MARK = "⚠️ "
DROPPED_TITLE = "Older turns left out"
THINKING_TITLE = "Thinking"
STOPPED_CALL = "The user pressed Stop; this call did not run to its end."


def kind_of(entry: dict) -> Kind:
    return Kind(entry.get("kind") or (Kind.QUESTION if entry.get("role") == "user" else Kind.ANSWER))


def view(entries: list[dict]) -> list[dict]:
    """The Chatbot's value: each entry as Gradio shows it, one message each (so an edit's index is the entry's)."""
    return [{k: v for k, v in e.items() if k in ("role", "content", "metadata", "options")} for e in entries]


def answer(text: str, model: str | None = None) -> dict:
    """An answer; `model`: the one that gave it, where the page picks among models (saved with it)."""
    return {"role": "assistant", "content": text} | ({"model": model} if model else {})


def error(sentence: str) -> dict:
    return {"role": "assistant", "content": ERROR_MARK + sentence, "kind": Kind.ERROR}


def stats(line: str) -> dict:
    """An answer's figures (or its place in the queue), shown under it."""
    return {"role": "assistant", "metadata": {"title": line, "status": "done"}, "content": "", "kind": Kind.STATS}


def stopped() -> dict:
    return {"role": "assistant", "metadata": {"title": "Stopped"}, "content": "The answer was stopped here.",
            "kind": Kind.STOPPED}  # fmt: skip


def dropped_turns(turns: int, context: int) -> dict:
    """A note that the conversation's oldest turns were left out."""
    text = (
        f"The model no longer sees the {turns} oldest turn{'s' if turns > 1 else ''} of this conversation: the "
        f"conversation is longer than its {context}-token context."
    )
    return notice(DROPPED_TITLE, text)


def notice(title: str, text: str) -> dict:
    """A note in the chat, no part of the conversation the model sees."""
    return {"role": "assistant", "metadata": {"title": title}, "content": text, "kind": Kind.NOTICE}


def thinking(text: str, done: bool, seconds: float | None = None, was_stopped: bool = False) -> dict:
    """A reasoning model's thought: streaming ("pending", open), then folded once its answer starts ("done")."""
    metadata = {"title": THINKING_TITLE, "status": "done" if done else "pending"}
    if seconds is not None:
        metadata["duration"] = round(seconds, 1)
    if was_stopped:
        metadata["log"] = "stopped"
    return {"role": "assistant", "metadata": metadata, "content": text, "kind": Kind.THINKING}


def tool_call(call: dict, server: str | None = None, approval: Approval | None = None) -> dict:
    """A call the model made, shown as a card: its name, its server and its arguments. `approval`, where the page runs
    it (ui/tool_rounds.py): "ask" (open, waiting for the user), "allowed" or "always" (to run), "running", "denied",
    "done" or "stopped"; None: an imported call."""
    function = call.get("function") or {}
    name = function.get("name", "a tool")
    arguments = fenced(pretty_arguments(function.get("arguments")), "json")
    server_named = f" · {server}" if server else ""
    card = {"role": "assistant", "content": arguments, "kind": Kind.TOOL_CALL, "call": call}
    if approval == Approval.ASK:  # open, in the chat itself: what would run
        of = f" of the server {server}" if server else ""
        card["content"] = f"The model asks to call **{name}**{of} with:\n\n{arguments}"
    else:
        titles = {Approval.RUNNING: f"Running {name}…", Approval.DENIED: f"Declined {name}",
                  Approval.STOPPED: f"Stopped {name}", Approval.NOT_RUN: f"Not run: {name}"}  # fmt: skip
        status = "pending" if approval == Approval.RUNNING else "done"
        card["metadata"] = {"title": titles.get(approval, f"Called {name}") + server_named, "status": status}
    return card | ({"server": server} if server else {}) | ({"approval": approval} if approval else {})


def pretty_arguments(arguments) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, ensure_ascii=False, indent=2)


def fenced(text: str, language: str = "text") -> str:
    """`text` as a code block the page shows as it is (no markup, no HTML), whatever backticks it holds."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text}\n{fence}"


def tool_result(
    content: str, call_id: str | None, name: str | None, images: list[str] | None = None, failed: bool = False
) -> dict:
    """A tool's result, folded: shown as text (never markup), given to the model as it is (`result`); `images`: the
    addresses of the images it returned, shown above it; `failed`: it is the sentence saying why the call failed."""
    shown = "".join(f"![image]({address})\n\n" for address in images or []) + fenced(content)
    title = f"{'Error from' if failed else 'Result of'} {name or 'a tool'}"
    return {"role": "assistant", "metadata": {"title": title, "status": "done"},
            "content": shown, "result": content, "kind": Kind.TOOL_RESULT, "tool_call_id": call_id}  # fmt: skip


def is_note(entry: dict) -> bool:
    """Whether an entry is shown but is no part of the conversation (a notice, figures, a stop mark)."""
    return kind_of(entry) in NOT_FOR_THE_MODEL


def with_images_left_out(entries: list[dict], model: str) -> None:
    """A note that `model` (chosen on the page) does not see the conversation's images, once for each model."""
    text = f"{model} does not see images, so it answers without this conversation's images."
    if not any(kind_of(e) == Kind.NOTICE and e["content"] == text for e in entries):
        entries.append(notice("Images left out", text))


def with_dropped_turns(entries: list[dict], turns: int, context: int) -> None:
    """Put the dropped-turns note before the answer (the last entry), once for each new cut, not at every turn."""
    if not turns:
        return
    note = dropped_turns(turns, context)
    told = (e["content"] for e in reversed(entries) if kind_of(e) == Kind.NOTICE)
    if note["content"] != next(told, None):
        entries.insert(len(entries) - 1, note)


def model_view(entries: list[dict], for_export: bool = False) -> list[dict]:
    """The conversation as the model sees it (OpenAI-style messages): notes left out, errors with the questions they
    answered (`for_export`: as answers, and each answer with its "model" where it names one and the "sources" it
    read), a thought as its
    answer's `reasoning_content`, tool calls and results as `tool_calls` and `tool` messages."""
    kept: list[dict] = []
    reasoning = None
    for entry in entries:
        kind = kind_of(entry)
        if kind == Kind.SOURCES and for_export and kept and kept[-1]["role"] == "assistant":
            kept[-1]["sources"] = entry["sources"]  # what the answer read: each document's or web page's passages
        if kind in NOT_FOR_THE_MODEL:
            continue
        if kind == Kind.ERROR and not for_export:
            if kept and kept[-1]["role"] == "user":
                kept.pop()
            reasoning = None
        elif kind == Kind.THINKING:
            reasoning = message_text(entry["content"])
        elif kind == Kind.TOOL_CALL:
            if not (kept and kept[-1]["role"] == "assistant"):
                kept.append({"role": "assistant", "content": ""})
            kept[-1].setdefault("tool_calls", [])  # the calls of the answer before them
            kept[-1]["tool_calls"].append(entry["call"])
            _with_reasoning(kept[-1], reasoning)
            reasoning = None
        elif kind == Kind.TOOL_RESULT:
            result = entry.get("result", entry["content"])  # an entry of schema 4 or before: its content
            kept.append({"role": "tool", "tool_call_id": entry.get("tool_call_id"), "content": result})
        else:
            message = {"role": entry["role"], "content": entry["content"]}
            message |= {k: entry[k] for k in ("text", "images", "clips", "documents") if k in entry}  # attachments
            if for_export and entry.get("model"):
                message["model"] = entry["model"]
            if kind == Kind.ANSWER:
                _with_reasoning(message, reasoning)
            reasoning = None
            kept.append(message)
    return kept


def _with_reasoning(message: dict, reasoning: str | None) -> None:
    if reasoning:
        message["reasoning_content"] = reasoning


def up_to_last_question(entries: list[dict]) -> list[dict]:
    """The conversation without what followed its last question (the answer, its thought and its notes)."""
    entries = list(entries or [])
    while entries and kind_of(entries[-1]) != Kind.QUESTION:
        entries.pop()
    return entries


def marked_stopped(entries: list[dict]) -> list[dict] | None:
    """After Stop: a thought still streaming marked done and stopped (a tool call running: stopped, with a result
    saying so), then the stop mark; None where the last entry is no answer in progress (nothing to mark)."""
    entries = list(entries or [])
    if any(entries[i].get("approval") == Approval.RUNNING for i in unanswered_calls(entries)):
        entries = with_calls_closed(entries, STOPPED_CALL)
    if not entries or kind_of(entries[-1]) not in (Kind.ANSWER, Kind.THINKING, Kind.TOOL_RESULT):
        return None
    if kind_of(entries[-1]) == Kind.THINKING:
        metadata = entries[-1]["metadata"]
        entries[-1] = thinking(entries[-1]["content"], True, metadata.get("duration"), was_stopped=True)
    return entries + [stopped()]


def unanswered_calls(entries: list[dict]) -> list[int]:
    """Where the calls the page runs (ui/tool_rounds.py) that have no result yet are, in order."""
    answered = {e.get("tool_call_id") for e in entries if kind_of(e) == Kind.TOOL_RESULT}
    return [
        i for i, e in enumerate(entries)
        if kind_of(e) == Kind.TOOL_CALL and e.get("approval") and e["call"].get("id") not in answered
    ]  # fmt: skip


def with_calls_closed(entries: list[dict], sentence: str) -> list[dict]:
    """`entries` with each call that has no result given `sentence` as its result (it was not run, or stopped), so
    that the conversation goes on; a running call is marked stopped, the others declined."""
    entries = list(entries)
    for at in unanswered_calls(entries):
        card = entries[at]
        closed = Approval.STOPPED if card["approval"] == Approval.RUNNING else Approval.NOT_RUN
        entries[at] = tool_call(card["call"], card.get("server"), closed)
        entries.append(tool_result(sentence, card["call"].get("id"), card["call"]["function"].get("name")))
    return entries
