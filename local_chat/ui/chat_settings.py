"""The chat tab's inputs: the page's settings beside its messages (`ChatSettings`), and what the message box and
an edit give."""

from __future__ import annotations

from dataclasses import dataclass

from local_chat.engine import Sampling

from .gradio_api import page_sampling


@dataclass
class ChatSettings:
    """The chat's inputs beside its messages, in the order the page sends them (`ChatTab.build`'s `settings`)."""

    conversation_id: str | None
    browser_id: str | None
    template: str
    system: str | None
    transform: str
    max_gen_len: int
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    thinking: object = None  # the thinking switch's value (ui/thinking.py), where the page has one
    model: str | None = None  # this session's model, where the page has a picker (ui/model_picker.py)

    @property
    def sampling(self) -> Sampling:
        return page_sampling(self.max_gen_len, self.temperature, self.top_p, self.top_k, self.repetition_penalty)


def edited_question(question: dict, edited_text: str) -> dict:
    """A user message whose text was edited: its images (saved ones, or upload files) stay, the text is the new one
    (without the images' addresses, where the edit box showed them)."""
    content = question["content"]
    if question.get("images"):
        addresses = content[: len(content) - len(question["text"])]
        text = edited_text.removeprefix(addresses)
        return {**question, "content": addresses + text, "text": text}
    files = [p for p in content if isinstance(p, dict) and p.get("type") == "file"] if isinstance(content, list) else []
    return {"role": "user", "content": [*files, edited_text] if files else edited_text}


def message_parts(message) -> tuple[str, list[str]]:
    """(text, attached files) of the message box's value ({"text", "files"}), or of a plain string."""
    if isinstance(message, dict):
        files = [f if isinstance(f, str) else f.get("path") for f in message.get("files") or []]
        return message.get("text") or "", [f for f in files if f]
    return message or "", []
