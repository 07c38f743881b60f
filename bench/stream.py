"""Streaming costs nothing: output tokens/s of `stream_generate` (and of transformers' TextIteratorStreamer
pattern, the peers' way) over bare `model.generate`, greedy, the same tokens, EOS ignored."""

from __future__ import annotations

import threading

from local_chat.model.meta import MetaModel

from .models import SHAPES, eos_ignored, random_meta_model
from .timing import interleaved, median_ratio

PROMPT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the "
    "request.\n\n### Instruction:\nTell me a long story about a red circle, a blue square and a green "
    "triangle who travel from Paris to Tokyo.\n\n### Response:"
)


def bare_generate_ids(model: MetaModel, prompt: str, new_tokens: int) -> list[int]:
    """transformers' own `generate`, greedy, on the same prompt ids as ours."""
    inputs = model.engine.encoder.prepare_inputs([prompt])
    out = model.llma.generate(
        input_ids=inputs.input_ids,
        attention_mask=inputs.attention_mask,
        do_sample=False,
        max_new_tokens=new_tokens,
        pad_token_id=model.tokenizer.pad_id,
    )
    generated = out[0, inputs.input_ids.shape[1] :]
    assert len(generated) == new_tokens, f"generate made {len(generated)} tokens, not {new_tokens}"
    return generated.tolist()


def bare_generate(model: MetaModel, new_tokens: int) -> str:
    """The answer's text as ours gives it: from its first visible character."""
    return model.tokenizer.decode(bare_generate_ids(model, PROMPT, new_tokens)).lstrip()


def our_stream(model: MetaModel, new_tokens: int) -> str:
    pieces = list(model.stream_generate(PROMPT, max_gen_len=new_tokens))
    assert pieces[-1]["completion_tokens"] == new_tokens
    return pieces[-1]["text"]


def text_iterator_streamer(model: MetaModel, new_tokens: int) -> str:
    """transformers' documented streaming: generate in a thread, read text from a TextIteratorStreamer."""
    from transformers import TextIteratorStreamer

    inputs = model.engine.encoder.prepare_inputs([PROMPT])
    streamer = TextIteratorStreamer(model.tokenizer.hf, skip_prompt=True, skip_special_tokens=True)
    thread = threading.Thread(
        target=model.llma.generate,
        kwargs=dict(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            do_sample=False,
            max_new_tokens=new_tokens,
            pad_token_id=model.tokenizer.pad_id,
            streamer=streamer,
        ),
    )
    thread.start()
    text = "".join(streamer)
    thread.join()
    return text


def compare(model: MetaModel, new_tokens: int, repeats: int, with_streamer: bool) -> dict[str, float]:
    runs = {"generate": lambda: bare_generate(model, new_tokens), "stream": lambda: our_stream(model, new_tokens)}
    if with_streamer:
        runs["streamer"] = lambda: text_iterator_streamer(model, new_tokens)
    with eos_ignored(model):
        if bare_generate(model, new_tokens) != our_stream(model, new_tokens):
            raise AssertionError("stream_generate and model.generate made different answers")
        seconds = interleaved(runs, repeats)
    # tokens/s ratio = time ratio inverted: the same number of tokens on both sides
    ratios = {"stream": median_ratio(seconds["generate"], seconds["stream"])}
    if with_streamer:
        ratios["streamer"] = median_ratio(seconds["generate"], seconds["streamer"])
    return ratios


def run(settings, demo: MetaModel) -> dict[str, float]:
    model = random_meta_model(SHAPES[settings.stream_shape])
    random_model = compare(model, settings.new_tokens, settings.repeats, with_streamer=True)
    # the demo model answers in a third of a second: more rounds for the same precision
    demo_model = compare(demo, settings.new_tokens, 3 * settings.repeats, with_streamer=False)
    return {
        "stream_vs_generate": random_model["stream"],
        "textiteratorstreamer_vs_generate": random_model["streamer"],
        "stream_vs_generate_demo": demo_model["stream"],
    }
