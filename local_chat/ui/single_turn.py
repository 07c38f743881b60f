"""The Single-turn tab: one instruction in one of Accessory's single-turn templates (alpaca, shortqa, ...), sent to
the engine as a raw prompt (with a model picker, to the session's model), its answer streamed with Stop."""

from __future__ import annotations

import gradio as gr

from local_chat.engine import Engine, Request
from local_chat.engine.interface import session_key
from local_chat.errors import UserError
from local_chat.prompting import single_turn_prompt
from local_chat.templates.single_turn import TEMPLATE_NAMES

from .chat import Cancels, answer_updates
from .gradio_api import page_sampling
from .layout import EXAMPLES, prompt_panel, sampling_controls
from .turns import ERROR_MARK
from .wiring import GENERATION, UI_ONLY


class SingleTurnTab:
    def __init__(self, engine: Engine, cancels: Cancels, picker=None):
        self.engine, self.cancels, self.picker = engine, cancels, picker  # picker: ui/model_picker.py's, or None

    async def run(
        self,
        instruction,
        input_text,
        template,
        max_gen_len,
        temperature,
        top_p,
        top_k,
        repetition_penalty,
        model: str | None = None,  # the session's, with a model picker
        request: gr.Request = None,
    ):
        cancel = self.cancels.fresh(session_key(request.session_hash, "single"))
        try:
            settings = page_sampling(max_gen_len, temperature, top_p, top_k, repetition_penalty)
            prompt = single_turn_prompt(instruction, input_text, template)
            engine = self.engine if self.picker is None else self.picker.engine_of(model, request)
        except UserError as error:
            yield ERROR_MARK + str(error), "", ""
            return
        async for update in answer_updates(engine, Request(prompt, settings, cancel=cancel)):
            line = update.line + (" · stopped" if update.stopped else "")
            yield (ERROR_MARK + update.error) if update.error else update.text.strip(), line, prompt

    def stop(self, request: gr.Request):
        self.cancels.cancel(session_key(request.session_hash, "single"))

    def build(self, model=None) -> None:
        """The tab; `model`: the picker's state (this session's model), where there is one."""
        instruction = gr.Textbox(
            label="Instruction", lines=3, placeholder="What is the capital of France?", elem_classes="message"
        )
        input_text = gr.Textbox(label="Input (optional context)", lines=2)
        template = gr.Dropdown(list(TEMPLATE_NAMES), value="alpaca", label="Template")
        with gr.Row():
            run = gr.Button("Generate", variant="primary")
            stop = gr.Button("Stop", variant="stop", visible=False)  # only while an answer streams
        answer = gr.Textbox(label="Answer", lines=6, interactive=False, buttons=["copy"])
        stats = gr.Markdown(elem_classes="stats")
        gr.Examples([e["text"] for e in EXAMPLES], inputs=instruction, label="Examples (a click fills the instruction)")
        sampling = sampling_controls()
        prompt_view = prompt_panel()
        inputs = [instruction, input_text, template, *sampling, model if model is not None else gr.State(None)]
        common = dict(**GENERATION, api_visibility=UI_ONLY)
        toggle = dict(queue=False, show_progress="hidden", api_visibility=UI_ONLY)
        running = [gr.update(visible=False), gr.update(visible=True)]  # (Generate, Stop)
        idle = [gr.update(visible=True), gr.update(visible=False)]
        runs = []
        for trigger in (run.click, instruction.submit):
            trigger(lambda: running, None, [run, stop], **toggle)
            runs.append(trigger(self.run, inputs, [answer, stats, prompt_view], **common))
            runs[-1].then(lambda: idle, None, [run, stop], **toggle)
        stop.click(self.stop, None, None, cancels=runs, **toggle).then(lambda: idle, None, [run, stop], **toggle)
