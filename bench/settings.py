"""The CPU suite's settings: QUICK, the real measurement, and SMOKE, the tiniest, to prove the suite runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    stream_shape: str
    quant_shape: str
    new_tokens: int
    repeats: int
    ui_shape: str
    ui_questions: int
    ui_answer_tokens: int
    ui_repeats: int
    cache_shape: str
    cache_history_tokens: int
    cache_repeats: int
    load_clients: int
    load_turns: int
    load_repeats: int
    api_shape: str = "small"
    api_answer_tokens: int = 200
    api_repeats: int = 6
    batching_shapes: tuple[str, ...] = ("small", "100m")
    batching_repeats: int = 3
    # `transformers serve --continuous-batching`'s paged cache in blocks (None: its default, sized from the memory,
    # whose allocation makes its first answer take ~15 s on this CPU)
    serve_cb_blocks: int | None = None
    front_repeats: int = 5
    structured_shapes: tuple[str, ...] = ("small", "100m")
    structured_tokens: int = 64
    structured_repeats: int = 3
    structured_big_vocab: int = 151_936  # Qwen's
    models_tokens: int = 16
    models_repeats: int = 8
    history_conversations: int = 10_000
    adapters_shape: str = "100m"
    adapters_tokens: int = 64
    adapters_repeats: int = 5
    speculative_document_tokens: int = 1600  # the demo model holds 2,048 tokens: the document, question and answer
    speculative_tokens: int = 200
    speculative_repeats: int = 5
    speculative_depth: int = 10  # the draft bench's model: the demo model's depth times this
    warmups: int = 1  # rounds before the interleaved repeats count
    cpu_shapes: tuple[str, ...] = ("qwen0.5b", "qwen1.5b")  # bench/cpu.py: beside llama.cpp
    cpu_tokens: int = 161
    cpu_repeats: int = 3
    cpu_prompt_tokens: int = 1000
    voice_whisper_tiny: bool = (
        True  # bench/voice.py: a Whisper of openai/whisper-tiny's shape (else the tests' 1-layer)
    )


QUICK = Settings(
    stream_shape="100m",
    quant_shape="0.5b",
    new_tokens=64,
    repeats=4,
    ui_shape="small",
    ui_questions=2,
    ui_answer_tokens=300,
    ui_repeats=6,
    cache_shape="100m",
    cache_history_tokens=2000,
    cache_repeats=3,
    load_clients=8,
    load_turns=3,
    load_repeats=3,
)
SMOKE = Settings(
    stream_shape="tiny",
    quant_shape="tiny",
    new_tokens=8,
    repeats=1,
    ui_shape="tiny",
    ui_questions=1,
    ui_answer_tokens=8,
    ui_repeats=1,
    cache_shape="tiny",
    cache_history_tokens=200,
    cache_repeats=1,
    load_clients=2,
    load_turns=1,
    load_repeats=1,
    api_shape="tiny",
    api_answer_tokens=8,
    api_repeats=1,
    batching_shapes=("tiny",),
    batching_repeats=1,
    serve_cb_blocks=64,
    front_repeats=1,
    structured_shapes=("tiny",),
    structured_tokens=8,
    structured_repeats=1,
    structured_big_vocab=4096,
    models_tokens=4,
    models_repeats=1,
    history_conversations=200,
    adapters_shape="tiny",
    adapters_tokens=4,
    adapters_repeats=1,
    speculative_document_tokens=200,
    speculative_tokens=16,
    speculative_repeats=1,
    speculative_depth=2,
    warmups=0,
    cpu_shapes=("tiny",),
    cpu_tokens=8,
    cpu_repeats=1,
    cpu_prompt_tokens=100,
    voice_whisper_tiny=False,
)

# name: (what it is, goal as (comparison, value) or None for a figure reported beside a goal)
