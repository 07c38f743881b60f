"""The page's thinking switch: which template variable it sets for the model's chat template ("enable_thinking",
"reasoning_effort"), what it starts as, and the variables each of its values sets."""

from __future__ import annotations

from local_chat.engine import Engine
from local_chat.prompting.messages import template_reads

EFFORTS = ("low", "medium", "high")
ENGINE_THINKING = ("engine's default", "think", "don't think")  # the switch over an engine (--api_base)


def thinking_switch(engine: Engine) -> tuple[str | None, object]:
    """(the template variable the page's thinking switch sets: "enable_thinking", "reasoning_effort", or None where
    the model's template reads neither; the switch's first value: what the template does with it unset). An engine
    that renders messages itself (--api_base) gets a switch whose template is unknown here: the engine's default
    (nothing sent), or `chat_template_kwargs.enable_thinking` true or false."""
    if getattr(engine, "renders_messages", False):
        return "enable_thinking", ENGINE_THINKING[0]
    reads, renderer = template_reads(engine), engine.chat_renderer
    probe = [{"role": "user", "content": "Hi"}]

    def render(**variables):
        try:
            return renderer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, **variables)
        except Exception:  # a template that cannot render the probe: the switch starts as the variable's default
            return None

    if "reasoning_effort" in reads:
        unset = render()
        return "reasoning_effort", next((e for e in EFFORTS if render(reasoning_effort=e) == unset), "medium")
    if "enable_thinking" in reads:
        return "enable_thinking", render() != render(enable_thinking=False)
    return None, None


def thinking_kwargs(thinking) -> dict:
    """The template variables the thinking switch's value sets: a checkbox's bool, an effort's name, an engine's
    choice, or nothing."""
    if thinking in ENGINE_THINKING[1:]:
        thinking = thinking == ENGINE_THINKING[1]
    if isinstance(thinking, bool):
        return {"enable_thinking": thinking}
    if thinking in EFFORTS:
        return {"reasoning_effort": thinking}
    return {}
