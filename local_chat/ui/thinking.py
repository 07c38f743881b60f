"""The page's thinking switch: which template variable it sets for the model's chat template ("enable_thinking",
"reasoning_effort"), what it starts as, the control that shows it, and the variables each of its values sets."""

from __future__ import annotations

from enum import StrEnum

import gradio as gr

from local_chat.engine import Engine
from local_chat.prompting.families import PAGE_EFFORTS
from local_chat.prompting.messages import thinking_switch_of


class EngineThinking(StrEnum):
    """The switch over an engine whose template is unknown here (--api_base), and a picker page's for a template
    with `enable_thinking`: the engine's default (nothing sent), think, or don't. Its values are what saved
    conversations keep; the radio shows them as they are."""

    DEFAULT = "engine's default"
    THINK = "think"
    DONT = "don't think"


EFFORTS = tuple(str(effort) for effort in PAGE_EFFORTS)  # "low", "medium", "high": a radio's values


def thinking_switch(engine: Engine) -> tuple[str | None, object]:
    """(what the page's thinking switch sets: "reasoning_effort", "enable_thinking" (a checkbox, whichever switch
    the template has: prompting/messages.py sets it), or None where the model's template has none; the switch's
    first value: what the template does with it unset). An engine that renders messages itself (--api_base) gets a
    switch whose template is unknown here: the engine's default (nothing sent), or
    `chat_template_kwargs.enable_thinking` true or false."""
    if getattr(engine, "renders_messages", False):
        return "enable_thinking", EngineThinking.DEFAULT
    switch, renderer = thinking_switch_of(engine), engine.chat_renderer
    if switch is None:
        return None, None
    probe = [{"role": "user", "content": "Hi"}]

    def render(effort: str | None = None):
        messages = switch.flagged(probe, effort) if effort else probe
        variables = switch.variables(effort) if effort else {}
        try:
            return renderer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **variables)
        except Exception:  # a template that cannot render the probe: the switch starts as the variable's default
            return None

    if switch.variable == "reasoning_effort":
        unset = render()
        return "reasoning_effort", next((e for e in EFFORTS if render(e) == unset), "medium")
    return "enable_thinking", render() != render("none")


def thinking_kwargs(thinking) -> dict:
    """The template variables the thinking switch's value sets: a checkbox's bool, an effort's name, an engine's
    choice, or nothing."""
    if thinking in (EngineThinking.THINK, EngineThinking.DONT):
        thinking = thinking == EngineThinking.THINK
    if isinstance(thinking, bool):
        return {"enable_thinking": thinking}
    if thinking in EFFORTS:
        return {"reasoning_effort": thinking}
    return {}


def thinking_control(engine: Engine, follows_a_picker: bool):
    """The page's thinking switch for `engine`'s template: a checkbox (enable_thinking), or a radio (an effort; an
    engine's choice), nothing (a `gr.State`) where the template reads neither. On a page with a model picker, a radio
    whose choices follow the model (`thinking_update`), hidden while the model's template reads neither."""
    label, choices, value = thinking_choices(engine)
    if not follows_a_picker and not choices:
        return gr.State(None)
    if not follows_a_picker and choices == [EngineThinking.THINK, EngineThinking.DONT]:  # enable_thinking
        return gr.Checkbox(
            value == EngineThinking.THINK, label="Think before answering", container=False, elem_classes="thinking"
        )
    return gr.Radio(choices, value=value, label=label, visible=bool(choices), elem_classes="thinking")


def thinking_choices(engine: Engine) -> tuple[str, list, object]:
    """(label, choices, first value) of a picker page's thinking radio for `engine`: no choices where its template
    reads no thinking variable."""
    variable, first = thinking_switch(engine)
    if first in list(EngineThinking):
        return "Thinking", list(EngineThinking), first
    if variable == "enable_thinking":
        return (
            "Thinking",
            [EngineThinking.THINK, EngineThinking.DONT],
            EngineThinking.THINK if first else EngineThinking.DONT,
        )
    if variable == "reasoning_effort":
        return "Reasoning effort", list(EFFORTS), first
    return "Thinking", [], None


def thinking_update(engine: Engine):
    """A picker page's thinking radio for the model chosen: its choices, reset to what its template starts as."""
    label, choices, value = thinking_choices(engine)
    return gr.update(choices=choices, value=value, label=label, visible=bool(choices))
