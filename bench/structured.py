"""What holding an answer to a JSON schema costs (model/constraints.py), measured side by side in one run:

- tokens/s of answers held to a schema over free answers of the same length (a random Llama of each shape, greedy,
  EOS ignored, the schema a string no answer closes in time): one request, and 8 at once (the free ones in
  transformers' continuous batch; the held ones in the step batch beside it, each row with its own grammar: the
  continuous batch takes no mask per row);
- the step batch's own time per step beside the model's forward pass, 8 held answers (ms: what our batch adds);
- the compile of a 20-field schema for the demo model's tokenizer, the first time and from the cache (ms on this
  machine: the one absolute figure, as the structured issue asks);
- the mask's time per token, llguidance's (kept) and xgrammar's (if installed: `pip install xgrammar`), walking a
  valid answer to the 20-field schema token by token on a 1,024-token vocabulary and on Qwen's 151,936.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from unittest import mock

from local_chat.engine import AnswerFormat, Request, Sampling, collect

from .models import SHAPES, eos_ignored, random_meta_model, synthetic_tokenizer
from .timing import interleaved_values, median_ratio

ANSWERS_AT_ONCE = 8
FREE_STRING = AnswerFormat("json_schema", {"type": "string"})  # no answer of random weights closes it in time
QWEN_VOCAB = 151_936


def twenty_fields() -> dict:
    kinds = [
        {"type": "string", "maxLength": 20},
        {"type": "integer", "minimum": 0, "maximum": 10_000},
        {"type": "number"},
        {"type": "boolean"},
        {"enum": ["red", "green", "blue"]},
        {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
    ]
    properties = {f"field_{i}": kinds[i % len(kinds)] for i in range(20)}
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def twenty_fields_answer() -> str:
    values = ["some text", 42, 3.5, True, "green", [1, 2, 3]]
    return json.dumps({f"field_{i}": values[i % len(values)] for i in range(20)}, separators=(",", ":"))


def run(settings) -> dict[str, float]:
    results: dict[str, float] = {}
    for i, shape in enumerate(settings.structured_shapes):  # the second shape's figures end in "_100m"
        results |= speed(shape, settings, "" if i == 0 else f"_{shape}")
    results |= compile_times()
    results |= mask_times(settings)
    return results


def speed(shape: str, settings, suffix: str) -> dict[str, float]:
    model = random_meta_model(SHAPES[shape], max_seq_len=1024)
    tokens = settings.structured_tokens
    engine = model.engine

    def answers(held: bool, count: int) -> float:
        """Answer tokens/s of `count` answers at once."""
        request = Request("Write JSON:", Sampling(tokens, temperature=0.0), answer_format=FREE_STRING if held else None)
        done: list = [None] * count

        def answer(i: int) -> None:
            done[i] = collect(engine.stream(request))

        threads = [threading.Thread(target=answer, args=(i,)) for i in range(count)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        assert all(a.end.completion_tokens == tokens for a in done), [a.end for a in done]
        return count * tokens / elapsed

    with eos_ignored(model):
        engine.grammars.matcher(FREE_STRING)  # the tokenizer wrapped and the grammar compiled before timing
        engine.start_batching(ANSWERS_AT_ONCE)
        try:
            repeats = settings.structured_repeats
            warmups = settings.warmups
            one = interleaved_values(
                {"held": lambda: answers(True, 1), "free": lambda: answers(False, 1)}, repeats, warmups
            )
            many = interleaved_values(
                {"held": lambda: answers(True, ANSWERS_AT_ONCE), "free": lambda: answers(False, ANSWERS_AT_ONCE)},
                repeats,
                warmups,
            )
            step_ms, forward_ms = step_times(engine, lambda: answers(True, ANSWERS_AT_ONCE))
        finally:
            engine.stop_batching()
    return {
        f"structured_one_over_free{suffix}": median_ratio(one["held"], one["free"]),
        f"structured_eight_over_free{suffix}": median_ratio(many["held"], many["free"]),
        f"step_batch_forward_ms{suffix}": forward_ms,
        f"step_batch_own_ms{suffix}": step_ms - forward_ms,
    }


def step_times(engine, run) -> tuple[float, float]:
    """The step batch's median step and the median forward pass within it (ms), over `run`'s steps of 8 rows."""
    from local_chat.model import step_batch

    stepped = engine.batcher.stepped
    steps, forwards = [], []

    def timed(call, into: list):
        def wrapped(*args, **kwargs):
            started = time.perf_counter()
            result = call(*args, **kwargs)
            into.append(time.perf_counter() - started)
            return result

        return wrapped

    step = stepped._step
    with mock.patch.object(stepped, "_step", timed(step, steps)):
        with mock.patch.object(step_batch, "decode_one", timed(step_batch.decode_one, forwards)):
            run()
    full = list(zip(steps, forwards))[len(steps) // 4 :]  # past the rows' joining
    return statistics.median(s for s, _ in full) * 1000, statistics.median(f for _, f in full) * 1000


def compile_times() -> dict[str, float]:
    """A 20-field schema for the demo model's tokenizer: the first compile, then the cached one (ms)."""
    from transformers import AutoTokenizer

    from local_chat.defaults import DEMO_MODEL
    from local_chat.model.constraints import Grammars

    hf = AutoTokenizer.from_pretrained(str(DEMO_MODEL))
    grammars = Grammars(hf, len(hf), {hf.eos_token_id})
    grammars.matcher(AnswerFormat("json_object"))  # the tokenizer wrapped once, as a model's first request does
    schema = AnswerFormat("json_schema", twenty_fields())
    first = timed(lambda: grammars.matcher(schema))
    cached = statistics.median(timed(lambda: grammars.matcher(schema)) for _ in range(20))
    results = {"structured_compile_20_fields_ms": first * 1000, "structured_compile_cached_ms": cached * 1000}
    try:
        import xgrammar
    except ImportError:
        return results
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf)))
    compiler.compile_builtin_json_grammar()  # its first use, as llguidance's tokenizer above
    schema_text = json.dumps(twenty_fields())
    compile_schema = lambda: compiler.compile_json_schema(schema_text, any_whitespace=False)  # noqa: E731
    return results | {"xgrammar_compile_20_fields_ms": timed(compile_schema) * 1000}


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def mask_times(settings) -> dict[str, float]:
    """Microseconds of mask per token, walking the 20-field answer, for each library and vocabulary."""
    results = {}
    for label, size in (("small_vocab", 1024), ("qwen_vocab", settings.structured_big_vocab)):
        hf = synthetic_tokenizer(size)
        ids = hf.encode(twenty_fields_answer(), add_special_tokens=False)
        results[f"llguidance_mask_us_{label}"] = llguidance_walk(hf, size, ids) * 1e6
        walk = xgrammar_walk(hf, size, ids)
        if walk is not None:
            results[f"xgrammar_mask_us_{label}"] = walk * 1e6
    return results


def llguidance_walk(hf, vocab: int, ids: list[int]) -> float:
    import llguidance
    import llguidance.hf
    import llguidance.torch as llg_torch

    from local_chat.prompting.answer_grammars import json_options

    grammar = llguidance.LLMatcher.grammar_from_json_schema(twenty_fields(), overrides=json_options())
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(hf, vocab), grammar, log_level=0)
    bitmask = llg_torch.allocate_token_bitmask(1, vocab)
    seconds = []
    for token in ids:
        started = time.perf_counter()
        llg_torch.fill_next_token_bitmask(matcher, bitmask, 0)
        seconds.append(time.perf_counter() - started)
        assert matcher.consume_token(token), matcher.get_error()
    return statistics.median(seconds)


def xgrammar_walk(hf, vocab: int, ids: list[int]) -> float | None:
    try:
        import xgrammar
    except ImportError:
        return None
    info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
    compiled = xgrammar.GrammarCompiler(info).compile_json_schema(
        json.dumps(twenty_fields()), any_whitespace=False, separators=(",", ":")
    )
    matcher = xgrammar.GrammarMatcher(compiled)
    bitmask = xgrammar.allocate_token_bitmask(1, vocab)
    seconds = []
    for token in ids:
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 0)
        seconds.append(time.perf_counter() - started)
        assert matcher.accept_token(token)
    return statistics.median(seconds)
