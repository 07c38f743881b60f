"""The chat's messages as the page keeps them: a typed list in `gr.State`, of which the Chatbot's value is only a view.

Each entry is a Gradio chat message ({"role", "content", "metadata"?}) with its kind under "kind": a question
("user") and an answer ("assistant") need none; the others are "thinking" (a reasoning model's thought, shown folded
above its answer, and sent back to the model as the answer's `reasoning_content`), "error", "notice" (a note in the
chat: older turns left out), "stats" (an answer's figures), "stopped", "tool_call" and "tool_result" (an imported
conversation's). Gradio drops metadata keys it does not know, so the kind is never read from metadata or text: an
entry without one is a question or an answer by its role. Saved conversations store these entries (history/store.py).
"""

from __future__ import annotations

import json

from local_chat.prompting import message_text

ERROR_MARK = "⚠️ "
DROPPED_TITLE = "Older turns left out"
THINKING_TITLE = "Thinking"
NOT_FOR_THE_MODEL = ("notice", "stats", "stopped")


def kind_of(entry: dict) -> str:
    return entry.get("kind") or ("question" if entry.get("role") == "user" else "answer")


def view(entries: list[dict]) -> list[dict]:
    """The Chatbot's value: each entry as Gradio shows it, one message each (so an edit's index is the entry's)."""
    return [{k: v for k, v in e.items() if k in ("role", "content", "metadata")} for e in entries]


def answer(text: str, model: str | None = None) -> dict:
    """An answer; `model`: the one that gave it, where the page picks among models (saved with it)."""
    return {"role": "assistant", "content": text} | ({"model": model} if model else {})


def error(sentence: str) -> dict:
    return {"role": "assistant", "content": ERROR_MARK + sentence, "kind": "error"}


def stats(line: str) -> dict:
    """An answer's figures (or its place in the queue), shown under it."""
    return {"role": "assistant", "metadata": {"title": line, "status": "done"}, "content": "", "kind": "stats"}


def stopped() -> dict:
    return {"role": "assistant", "metadata": {"title": "Stopped"}, "content": "The answer was stopped here.",
            "kind": "stopped"}  # fmt: skip


def dropped_turns(turns: int, context: int) -> dict:
    """A note that the conversation's oldest turns were left out."""
    text = (
        f"The model no longer sees the {turns} oldest turn{'s' if turns > 1 else ''} of this conversation: the "
        f"conversation is longer than its {context}-token context."
    )
    return {"role": "assistant", "metadata": {"title": DROPPED_TITLE}, "content": text, "kind": "notice"}


def thinking(text: str, done: bool, seconds: float | None = None, was_stopped: bool = False) -> dict:
    """A reasoning model's thought: streaming ("pending", open), then folded once its answer starts ("done")."""
    metadata = {"title": THINKING_TITLE, "status": "done" if done else "pending"}
    if seconds is not None:
        metadata["duration"] = round(seconds, 1)
    if was_stopped:
        metadata["log"] = "stopped"
    return {"role": "assistant", "metadata": metadata, "content": text, "kind": "thinking"}


def tool_call(call: dict) -> dict:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    title = f"Called {function.get('name', 'a tool')}"
    return {"role": "assistant", "metadata": {"title": title, "status": "done"}, "content": text,
            "kind": "tool_call", "call": call}  # fmt: skip


def tool_result(content: str, call_id: str | None, name: str | None) -> dict:
    return {"role": "assistant", "metadata": {"title": f"Result of {name or 'a tool'}", "status": "done"},
            "content": content, "kind": "tool_result", "tool_call_id": call_id}  # fmt: skip


def is_note(entry: dict) -> bool:
    """Whether an entry is shown but is no part of the conversation (a notice, figures, a stop mark)."""
    return kind_of(entry) in NOT_FOR_THE_MODEL


def with_images_left_out(entries: list[dict], model: str) -> None:
    """A note that `model` (chosen on the page) does not see the conversation's images, once for each model."""
    text = f"{model} does not see images, so it answers without this conversation's images."
    if not any(kind_of(e) == "notice" and e["content"] == text for e in entries):
        entries.append({"role": "assistant", "metadata": {"title": "Images left out"}, "content": text,
                        "kind": "notice"})  # fmt: skip


def with_dropped_turns(entries: list[dict], turns: int, context: int) -> None:
    """Put the dropped-turns note before the answer (the last entry), once for each new cut, not at every turn."""
    if not turns:
        return
    note = dropped_turns(turns, context)
    told = (e["content"] for e in reversed(entries) if kind_of(e) == "notice")
    if note["content"] != next(told, None):
        entries.insert(len(entries) - 1, note)


def model_view(entries: list[dict], for_export: bool = False) -> list[dict]:
    """The conversation as the model sees it (OpenAI-style messages): notes left out, errors with the questions they
    answered (`for_export`: as answers, and each answer with its "model" where it names one), a thought as its
    answer's `reasoning_content`, tool calls and results as `tool_calls` and `tool` messages."""
    kept: list[dict] = []
    reasoning = None
    for entry in entries:
        kind = kind_of(entry)
        if kind in NOT_FOR_THE_MODEL:
            continue
        if kind == "error" and not for_export:
            if kept and kept[-1]["role"] == "user":
                kept.pop()
            reasoning = None
        elif kind == "thinking":
            reasoning = message_text(entry["content"])
        elif kind == "tool_call":
            if not (kept and kept[-1]["role"] == "assistant" and kept[-1].get("tool_calls") is not None):
                kept.append({"role": "assistant", "content": "", "tool_calls": []})
            kept[-1]["tool_calls"].append(entry["call"])
            _with_reasoning(kept[-1], reasoning)
            reasoning = None
        elif kind == "tool_result":
            kept.append({"role": "tool", "tool_call_id": entry.get("tool_call_id"), "content": entry["content"]})
        else:
            message = {"role": entry["role"], "content": entry["content"]}
            message |= {k: entry[k] for k in ("text", "images") if k in entry}  # a question's saved images
            if for_export and entry.get("model"):
                message["model"] = entry["model"]
            if kind == "answer":
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
    while entries and kind_of(entries[-1]) != "question":
        entries.pop()
    return entries


def marked_stopped(entries: list[dict]) -> list[dict] | None:
    """After Stop: a thought still streaming marked done and stopped, then the stop mark; None where the last entry
    is no answer in progress (nothing to mark)."""
    entries = list(entries or [])
    if not entries or kind_of(entries[-1]) not in ("answer", "thinking"):
        return None
    if kind_of(entries[-1]) == "thinking":
        metadata = entries[-1]["metadata"]
        entries[-1] = thinking(entries[-1]["content"], True, metadata.get("duration"), was_stopped=True)
    return entries + [stopped()]
