"""The chat tab's components as one frozen record (`ChatParts`, made by `ChatTab.build`), named as the handlers' inputs
(`ChatSettings`' fields) and results (ui/wiring.py's records) name them."""

from __future__ import annotations

from dataclasses import dataclass, fields

import gradio as gr

from .chat_settings import ChatSettings

Component = gr.components.Component


@dataclass(frozen=True)
class ChatParts:
    """Every component of one chat tab; a placeholder `gr.State` where the page has no such control (no saved
    conversations: no list and no branch controls; no tools; no thinking switch; no model picker; no web search)."""

    chatbot: gr.Chatbot  # shows `chat`'s view (ui/turns.py's `view`)
    chat: gr.State  # the chat as the page keeps it: ui/turns.py's typed list
    box: gr.MultimodalTextbox  # the message box (Send, and Stop while an answer streams)
    prompt: gr.Code  # the prompt panel: what the last answer was sent
    listed: Component  # the sidebar's list of saved conversations (ui/conversations.py)
    nav: Component  # the controls under the messages (ui/branches.py)
    always: Component  # this login's always-allowed tools (ui/tool_rounds.py)
    # the settings, by `ChatSettings`' names
    conversation_id: gr.State
    browser_id: Component
    template: gr.Dropdown
    system: gr.Textbox
    transform: Component
    max_gen_len: gr.Slider
    temperature: gr.Slider
    top_p: gr.Slider
    top_k: gr.Slider
    repetition_penalty: gr.Slider
    thinking: Component
    model: Component
    tools: Component
    pdf_pictures: Component
    web_search: Component
    speak_answers: Component  # the Speak answers switch, where the app speaks (ui/voice.py)
    speech: Component  # the answers' speech, played by the page's script (ui/voice.py)

    def named(self) -> dict[str, Component]:
        """Each component by its name (not `dataclasses.asdict`, which would copy them)."""
        return dict(vars(self))

    def settings(self) -> list[Component]:
        """The settings' components in `ChatSettings`' field order: the page sends their values last to the
        handlers that take settings (ui/wiring.py's `taking_settings`)."""
        return [getattr(self, field.name) for field in fields(ChatSettings)]
