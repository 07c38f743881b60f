"""The page's look: its CSS, head and script (`PAGE`, handed to Gradio's launch), the examples, the model line over
the tabs, the sampling settings, the prompt panel and the message box's Send/Stop states."""

from __future__ import annotations

from html import escape
from pathlib import Path

import gradio as gr

from local_chat.documents import DOCUMENT_SUFFIXES
from local_chat.engine import Engine, checkpoint_name
from local_chat.engine.interface import CHAT_SAMPLING, Sampling

STATIC = Path(__file__).parent / "static"  # the page's CSS and scripts
EXAMPLES = [{"text": t} for t in ("What is 23 plus 45?", "What is the capital of Japan?", "Who are you?")]
IMAGE_EXAMPLES = [
    {"text": t} for t in ("What is in the image?", "What color is the circle?", "How many shapes are there?")
]


def static_text(name: str) -> str:
    """One of the page's own files (ui/static/: its CSS and scripts), as Gradio takes them: text."""
    return (STATIC / name).read_text(encoding="utf-8")


CSS = static_text("page.css")
# Images come from the app itself only: a model talked into writing <img src="https://..."> or ![](https://...)
# cannot make the browser call an outside address (and send it whatever the model put into the URL).
HEAD = """<meta http-equiv="Content-Security-Policy" content="img-src 'self' data: blob:">"""
# run by the page once it has loaded (launch's `js`)
PAGE_JS = static_text("page.js")
# what `launch` needs besides the address; the footer's "Settings" (Gradio's) would stand beside the chat's own
PAGE = {"css": CSS, "head": HEAD, "js": PAGE_JS, "footer_links": ["api", "gradio"]}


def model_panel(engine: Engine) -> str:
    """The model line over the tabs (HTML): a short summary, its details a tap away; the checkpoint by its folder's
    name (nothing of the server's disk)."""
    facts = engine.summary()
    seeing = " · sees images" if facts.sees_images else ""
    if facts.remote:  # engine/remote.py: a model another server serves
        context = f"{facts.context} tokens" if facts.context_known else "the engine's context"
        summary = f"<b>Model</b> <code>{escape(facts.path)}</code> · {context}{seeing}"
        details = f"served by {escape(facts.engine_url)} · batching: {escape(facts.batching)}"
    else:
        summary = f"<b>Model</b> <code>{escape(checkpoint_name(facts))}</code> · {facts.context} tokens{seeing}"
        if facts.served_by:  # a GGUF file: "llama.cpp · GGUF Q4_K_M · 4.1 GB"
            summary += f" · {escape(facts.served_by)} · {escape(facts.format)}"
        details = (
            f"{escape(facts.architecture)} · {facts.format} · dtype {escape(facts.dtype)} · device {facts.device} · "
            f"quantization {facts.quant} · weights {facts.weight_mib:,.0f} MiB"
            + (f" · CPU kernels: {escape(facts.cpu_kernels)}" if facts.cpu_kernels not in ("", "off") else "")
            + (" · compiled decoding" if facts.compiled else "")
            + (" · CUDA graphs" if facts.cuda_graphs else "")
            + f" · batching: {escape(facts.batching)}"
            + (f" · LoRA adapters loaded: {escape(', '.join(facts.adapters))}" if facts.adapters else "")
        )
    return f"<details><summary>{summary}</summary><div class='model-details'>{details}</div></details>"


def chat_box(engine: Engine, interactive: bool, hears: bool = False) -> tuple[gr.Chatbot, gr.MultimodalTextbox]:
    """The chat and its message box; `interactive`: the box takes text at once (with saved conversations, only once
    the page's first load gave it its id); `hears`: it has a microphone (--stt_model), and takes sound files."""
    chatbot = gr.Chatbot(
        label="Conversation",
        height="58vh",
        min_height=260,
        buttons=["copy", "copy_all"],
        editable="user",
        placeholder="Ask something" + (", or attach an image" if engine.sees_images else "") + ".",
        elem_classes="conversation",
    )
    message = gr.MultimodalTextbox(
        show_label=False,
        **message_box_images(engine.sees_images, hears),
        file_count="multiple",
        max_lines=6,
        autofocus=True,
        submit_btn="Send",
        stop_btn=False,
        elem_classes="message",
        interactive=interactive,
    )
    return chatbot, message


def message_box_images(sees_images: bool, hears: bool = False) -> dict:
    """The message box's settings that depend on whether the model sees images and the app hears: attachments, the
    microphone, and the placeholder that says so."""
    attach = "images and documents" if sees_images else "documents (PDF, Word, text, code)"
    record = ", or record a question" if hears else ""
    return {
        "placeholder": f"Type a message and press Enter (attach, drop or paste {attach}{record})",
        "file_types": (["image"] if sees_images else []) + list(DOCUMENT_SUFFIXES) + (["audio"] if hears else []),
        "sources": ["upload", "microphone"] if hears else ["upload"],
    }


def shown_prompt(engine: Engine, text: str, images: int) -> str:
    """The prompt as "Prompt sent to the model" shows it: where the template has no image marker, the marker the
    model's processor puts in front for each image, so that the panel shows where the images went."""
    if not images:
        return text
    facts = engine.summary()  # asked only for a prompt with images: a local model's sums its weights' sizes
    marker, token = facts.image_marker, facts.image_token
    if marker and token and token not in text:
        return marker * images + text
    return text


def sampling_controls(defaults: Sampling | None = None) -> list[gr.components.Component]:
    """The answers' settings, starting at `defaults` (the page's own, CHAT_SAMPLING, where None)."""
    defaults = defaults or CHAT_SAMPLING
    with gr.Accordion("Settings", open=False):
        max_gen_len = gr.Slider(1, 2048, value=defaults.max_new_tokens, step=1, label="Max answer length (tokens)")
        temperature = gr.Slider(0.0, 2.0, value=defaults.temperature, step=0.05, label="Temperature (0 = greedy)")
        top_p = gr.Slider(0.05, 1.0, value=defaults.top_p, step=0.05, label="Top p")
        with gr.Accordion("More", open=False):
            top_k = gr.Slider(0, 200, value=defaults.top_k, step=1, label="Top k (0 = off)")
            repetition_penalty = gr.Slider(
                1.0, 2.0, value=defaults.repetition_penalty, step=0.05, label="Repetition penalty"
            )
    return [max_gen_len, temperature, top_p, top_k, repetition_penalty]


def sampling_values(sampling: Sampling) -> list:
    """`sampling_controls`' values for `sampling`, in their order."""
    return [sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k, sampling.repetition_penalty]


def prompt_panel() -> gr.Code:
    """The "Prompt sent to the model" panel: the exact text, its long lines wrapped."""
    with gr.Accordion("Prompt sent to the model", open=False):
        return gr.Code(
            label="Prompt", language=None, interactive=False, wrap_lines=True, max_lines=20, elem_classes="prompt-view"
        )


def busy_box():
    return gr.update(submit_btn=False, stop_btn="Stop")


def idle_box():
    return gr.update(submit_btn="Send", stop_btn=False)
