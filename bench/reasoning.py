"""What parsing reasoning costs a /v1 stream: a random Qwen3 with Qwen3's published template, made to write the same
256-token reasoning + answer every time (bench/families.py's `ForcedAnswer`), is streamed through the `openai`
client as a chat (rendered, its text kept with the special tokens and parsed into reasoning and answer) and, in
turns, as a completion of the same rendered prompt (no parsing). Figure: tokens/s after the first text of the
parsed stream over the plain one, medians of interleaved repeats.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from local_chat.launchers.loading import free_port

from .families import ForcedAnswer, save_tiny_qwen3

QUESTION = [{"role": "user", "content": "Think it through: what is 12 plus 7?"}]
SHAPES = {  # Qwen3 sizes: "small" is the demo model's
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4),
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4),
}


def run(settings) -> dict[str, float]:
    from local_chat.model.meta import MetaModel

    tokens = 256 if settings.api_answer_tokens >= 100 else 16
    with tempfile.TemporaryDirectory(prefix="bench-reasoning-") as tmp:
        config = {
            **SHAPES[settings.api_shape],
            "num_key_value_heads": 2,
            "head_dim": 64 if settings.api_shape == "small" else 16,
        }
        model = MetaModel.from_pretrained(str(save_tiny_qwen3(Path(tmp) / "qwen3", config=_full(config))))
        forced = ForcedAnswer(model.llma, model.tokenizer.hf, forced_text(model.tokenizer.hf, tokens), "<|im_end|>")
        with served(model) as client:
            prompt = model.engine.chat_renderer.apply_chat_template(
                QUESTION, tokenize=False, add_generation_prompt=True
            )
            parsed_rates, plain_rates = [], []
            for round_ in range(settings.api_repeats + 1):  # the first round warms up
                order = ("parsed", "plain") if round_ % 2 == 0 else ("plain", "parsed")
                for kind in order:
                    forced.again()
                    rate = chat_rate(client) if kind == "parsed" else completion_rate(client, prompt)
                    if round_:
                        (parsed_rates if kind == "parsed" else plain_rates).append(rate)
        forced.remove()
    return {"reasoning_parse_token_rate_ratio": statistics.median(parsed_rates) / statistics.median(plain_rates)}


def _full(config: dict) -> dict:
    return {**config, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}


def forced_text(tokenizer, tokens: int) -> str:
    """A reasoning block and an answer, `tokens` tokens with the end token."""
    words = "Let me add the units first, then the tens, and check the sum again carefully. ".split()
    reasoning, answer = [], "12 plus 7 is 19."
    while True:
        text = "<think>\n" + " ".join(reasoning) + "\n</think>\n\n" + answer
        if len(tokenizer.encode(text, add_special_tokens=False)) >= tokens - 1:
            return text
        reasoning.append(words[len(reasoning) % len(words)])


def chat_rate(client) -> float:
    stream = client.chat.completions.create(
        model="q",
        messages=QUESTION,
        max_tokens=2000,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    first = last = None
    count = 0
    for chunk in stream:
        if chunk.usage is not None:
            count = chunk.usage.completion_tokens
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None and (delta.content or (delta.model_extra or {}).get("reasoning_content")):
            last = time.perf_counter()
            first = first or last
    return (count - 1) / (last - first)


def completion_rate(client, prompt: str) -> float:
    stream = client.completions.create(
        model="q", prompt=prompt, max_tokens=2000, temperature=0.0, stream=True, stream_options={"include_usage": True}
    )
    first = last = None
    count = 0
    for chunk in stream:
        if chunk.usage is not None:
            count = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].text:
            last = time.perf_counter()
            first = first or last
    return (count - 1) / (last - first)


@contextmanager
def served(model):
    """An `openai` client of the /v1 API over `model`, served in this process (so that the forcing hook holds)."""
    import uvicorn
    from openai import OpenAI
    from starlette.applications import Starlette

    from local_chat.api import OpenAIAPI
    from local_chat.engine.in_order import InArrivalOrder
    from local_chat.prompting import default_template

    engine = InArrivalOrder(model.engine, 1)
    api = OpenAIAPI(engine, default_template(engine), "auto", 10.0)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=api.routes()), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
