"""The chat tab's inputs: the page's settings beside its messages (`ChatSettings`), and what the message box and
an edit give."""

from __future__ import annotations

from dataclasses import dataclass

from local_chat.engine import Sampling
from local_chat.errors import UserError
from local_chat.prompting import open_upload
from local_chat.voice.clips import read_clip_file

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
    tools: list[str] | None = None  # the tools switched on, where the page has tools (ui/tool_rounds.py)
    pdf_pictures: bool = False  # a PDF's pages go to a model that sees images as pictures (ui/documents.py)
    web_search: bool = False  # the Search the web switch, where the page has a web search (web/context.py)
    speak_answers: bool = False  # the Speak answers switch, where the app speaks (ui/voice.py)

    @property
    def sampling(self) -> Sampling:
        return page_sampling(self.max_gen_len, self.temperature, self.top_p, self.top_k, self.repetition_penalty)


def edited_question(question: dict, edited_text: str) -> dict:
    """A user message whose text was edited: its images and recordings (saved ones, or upload files) stay, the text is
    the new one (without their addresses, where the edit box showed them)."""
    content = question["content"]
    if question.get("images") or question.get("clips"):
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


def attached_images(files, engine, max_upload_mb: float) -> tuple[list[tuple[str, object]], str]:
    """(path, checked image) of each attached file that can be read, and the sentence for those that cannot (empty
    when none): a model that cannot see refuses them all."""
    if files and not engine.sees_images:
        return [], (
            "This model does not see images, so the attachment was taken out of the message (your text is still "
            "there); start a model that sees them to ask about an image."
        )
    return read_each(files, open_upload, max_upload_mb)


NOT_HEARD = (
    "This model does not hear recordings, so the recording was taken out of the message (your text is still there); "
    "start a model that hears (Qwen2-Audio, say), or the app with --stt_model to turn recordings into text."
)


def attached_clips(files, engine, max_upload_mb: float) -> tuple[list[tuple[str, object]], str]:
    """(path, checked `Clip`) of each recording attached for a model that hears, and the sentence for those that
    cannot be read (empty when none): a model that does not hear refuses them all."""
    if files and not engine.summary().hears:
        return [], NOT_HEARD
    return read_each(files, read_clip_file, max_upload_mb)


def read_each(files, read, max_upload_mb: float) -> tuple[list[tuple[str, object]], str]:
    """(path, `read(path, max_upload_mb)`) of each file that can be read, and the sentence for those that cannot
    (empty when none)."""
    read_ones, refused = [], []
    for path in files:
        try:
            read_ones.append((path, read(path, max_upload_mb)))
        except UserError as error:
            refused.append(str(error))
    return read_ones, taken_out(refused)


def taken_out(refused: list[str]) -> str:
    """The sentence for the attachments taken out of the message box (empty when none): each one's reason."""
    return "Taken out of the message (your text is still there): " + " ".join(refused) if refused else ""
