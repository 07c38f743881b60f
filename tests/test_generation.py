"""Streaming generation: exact stops, incremental detokenization, cancel, batches, sampling."""

import json
import threading

import pytest
import torch
from torch._dynamo.utils import counters

from fixtures.app_server import ForwardCounter
from local_chat.engine import AnswerFormat, Request, Sampling, collect
from local_chat.errors import UserError
from local_chat.model.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer, StopCutter, StopStrings
from local_chat.model.meta import MetaModel

MULTILINGUAL = "Héllo wörld, ça va? Grüße aus München. 你好，世界。 こんにちは 🙂 🚀 ✓ The answer is 19."


def stream(model, prompt, **kwargs):
    return list(model.stream_generate(prompt, **kwargs))


@pytest.fixture(scope="module")
def sp_model(checkpoints):
    return MetaModel.from_pretrained(str(checkpoints["meta"]))


@pytest.mark.parametrize("which", ["sp", "byte"])
def test_detokenizer_matches_full_decode_without_replacement_chars(which, sp_model, byte_model):
    tokenizer = {"sp": sp_model, "byte": byte_model}[which].tokenizer
    ids = tokenizer.encode(MULTILINGUAL, bos=False)
    windows = []

    def decode(window):
        windows.append(len(window))
        return tokenizer.decode(window)

    detokenizer = IncrementalDetokenizer(decode)
    pieces = [detokenizer.add(i) for i in ids]
    assert "".join(pieces) == tokenizer.decode(ids) == detokenizer.text
    assert MULTILINGUAL.strip() in detokenizer.text
    assert not any(REPLACEMENT_CHAR in p for p in pieces)
    # Constant work per token: the decoded window never grows with the answer.
    assert max(windows) <= 8 and len(ids) > 40


def test_sentencepiece_pieces_keep_their_spaces(sp_model):
    tokenizer = sp_model.tokenizer
    ids = tokenizer.encode("The capital of France is Paris.", bos=False)
    detokenizer = IncrementalDetokenizer(tokenizer.decode)
    assert "".join(detokenizer.add(i) for i in ids) == "The capital of France is Paris."


def test_stop_strings_hold_back_prefixes_and_cut_at_first_match():
    stops = StopStrings(["\n###", "</s>"])
    assert stops.safe_length("Hello\n#") == 5
    assert stops.safe_length("Hello<") == 5
    assert stops.safe_length("Hello") == 5
    assert stops.find("Hello\n##") == -1
    assert stops.find("Hello\n### Human") == 5


def test_a_stop_cutter_shows_what_cannot_begin_a_stop_string_and_the_held_tail_at_the_end():
    """The chat layer's and a remote engine's cutting (StopCutter): a tail that may begin a stop string waits; at the
    end, one that never became one is shown; after a stop string, nothing is."""
    cut = StopCutter(["###", "\nUser:"])
    assert [cut.add(piece) for piece in ("Hello", " #", "#", " world\nUs")] == ["Hello", " ", "", "## world"]
    assert (cut.finish(), cut.hit) == ("\nUs", False)
    cut = StopCutter(["###"])
    assert [cut.add(piece) for piece in ("a##", "#b", "more")] == ["a", "", ""]
    assert (cut.finish(), cut.hit) == ("", True)


def counted_pieces(model, prompt, **kwargs):
    """Each streamed piece with the number of forward passes the model had made when it arrived."""
    counter = ForwardCounter(model)
    try:
        return [(piece, counter.calls) for piece in model.stream_generate(prompt, **kwargs)]
    finally:
        counter.restore()


@pytest.mark.parametrize("which", ["sp", "byte"])
def test_streamed_text_never_shows_a_stop_string_or_its_start(which, sp_model, byte_model):
    model = {"sp": sp_model, "byte": byte_model}[which]
    kwargs = dict(max_gen_len=60, temperature=1.0, seed=3)
    reference = counted_pieces(model, "The quick brown fox", **kwargs)
    full = reference[-1][0]["text"]
    # A stop string spanning a token boundary (where a streamed piece ended), taken from the model's own answer.
    boundaries = [len(piece["text"]) for piece, _ in reference[:-1] if 3 <= len(piece["text"]) <= len(full) - 3]
    boundary = boundaries[len(boundaries) // 2]
    stop = full[boundary - 3 : boundary + 3]
    passes_to_complete_it = next(calls for piece, calls in reference if stop in piece["text"])

    stopped = counted_pieces(model, "The quick brown fox", additional_stop_symbols=[stop], **kwargs)
    pieces = [piece for piece, _ in stopped]
    assert pieces[-1]["text"] == full[: full.find(stop)] and pieces[-1]["finish_reason"] == "stop"
    shown = ""
    for piece in pieces:
        assert stop not in piece["text"]
        # nothing of the stop string is shown, not even its start (the text may end with characters the stop string
        # starts with, where they come before it: the answer's own)
        assert full[: full.find(stop)].startswith(piece["text"])
        assert piece["text"].startswith(shown)  # streamed text only grows
        shown = piece["text"]
    # The model stopped computing at the match: no forward pass beyond the token that completed it.
    assert stopped[-1][1] <= passes_to_complete_it


def test_accessory_default_separator_never_leaks(sp_model):
    from local_chat.templates.multi_turn import default_conversation

    conv = default_conversation()
    conv.load_qas([["Hello there!", None]])
    pieces = stream(
        sp_model,
        conv.get_prompt(),
        max_gen_len=80,
        temperature=1.0,
        seed=1,
        additional_stop_symbols=[conv.response_end_signal],
    )
    for piece in pieces:
        assert "\n###" not in piece["text"] and not piece["text"].endswith(("\n", "\n#", "\n##"))


def test_eos_stops_the_answer(byte_model):
    full = stream(byte_model, "Hello", max_gen_len=30)
    eos_free = full[-1]
    # Declare the first generated token as the end of sequence: the answer is then empty and stops at once.
    first_id = byte_model.tokenizer.encode(eos_free["text"], bos=False)[0]
    counter = ForwardCounter(byte_model)
    byte_model.llma.generation_config.eos_token_id = [2, first_id]
    try:
        pieces = stream(byte_model, "Hello", max_gen_len=30)
    finally:
        byte_model.llma.generation_config.eos_token_id = 2
        counter.restore()
    assert pieces[-1]["text"] == "" and pieces[-1]["finish_reason"] == "stop" and counter.calls == 1


def test_special_token_stop_symbol_becomes_an_eos_id(byte_model):
    assert byte_model.tokenizer.special_token_id("<|im_end|>") in byte_model.engine.eos_ids(["<|im_end|>"])
    assert byte_model.tokenizer.special_token_id("Hello") is None


def test_last_piece_carries_counts_and_timings(byte_model):
    pieces = stream(byte_model, "The quick brown fox", max_gen_len=7)
    last = pieces[-1]
    assert [p["end_of_content"] for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert last["finish_reason"] == "length" and last["completion_tokens"] == 7
    assert last["prompt_tokens"] == len(byte_model.tokenizer.encode("The quick brown fox"))
    assert last["time_to_first_token"] > 0 and last["total_time"] >= last["time_to_first_token"]
    assert last["tokens_per_second"] > 0


def test_cancel_stops_the_model_within_two_steps(byte_model):
    cancel = threading.Event()
    counter = ForwardCounter(byte_model)
    calls_at_cancel = None
    pieces = []
    for piece in byte_model.stream_generate(
        "The quick brown fox", max_gen_len=200, temperature=1.0, seed=0, cancel=cancel
    ):
        pieces.append(piece)
        if len(pieces) == 3:
            cancel.set()
            calls_at_cancel = counter.calls
    counter.restore()
    assert pieces[-1]["finish_reason"] == "cancelled"
    assert counter.calls - calls_at_cancel <= 2


def test_cancel_from_another_thread(byte_model):
    cancel = threading.Event()
    counter = ForwardCounter(byte_model)
    seen_at_cancel = []

    def set_cancel():  # the promise counts from the moment Stop is pressed, however late this thread runs
        seen_at_cancel.append(counter.calls)
        cancel.set()

    def cancel_after_five_passes(*_):
        if counter.calls == 5 and not seen_at_cancel:
            threading.Thread(target=set_cancel).start()

    handle = byte_model.llma.register_forward_hook(cancel_after_five_passes)
    try:
        pieces = stream(byte_model, "Hello", max_gen_len=500, temperature=1.0, seed=0, cancel=cancel)
    finally:
        handle.remove()
        counter.restore()
    assert pieces[-1]["finish_reason"] == "cancelled"
    assert counter.calls - seen_at_cancel[0] <= 2
    assert threading.active_count() < 10  # nothing left running


def test_closing_the_stream_stops_the_model(byte_model):
    counter = ForwardCounter(byte_model)
    generator = byte_model.stream_generate("Hello", max_gen_len=500, temperature=1.0, seed=0)
    for i, _ in enumerate(generator):
        if i == 2:
            calls_at_close = counter.calls
            break
    generator.close()
    calls = counter.calls
    counter.restore()
    assert calls == calls_at_close


def test_cancelled_before_start_runs_nothing(byte_model):
    cancel = threading.Event()
    cancel.set()
    counter = ForwardCounter(byte_model)
    pieces = stream(byte_model, "Hello", cancel=cancel)
    counter.restore()
    assert counter.calls == 0 and pieces == [pieces[-1]] and pieces[-1]["finish_reason"] == "cancelled"


def test_seed_makes_sampling_repeatable_and_top_k_one_is_greedy(byte_model):
    a = stream(byte_model, "Hello", max_gen_len=20, temperature=0.9, seed=11)[-1]["text"]
    b = stream(byte_model, "Hello", max_gen_len=20, temperature=0.9, seed=11)[-1]["text"]
    c = stream(byte_model, "Hello", max_gen_len=20, temperature=0.9, seed=12)[-1]["text"]
    greedy = stream(byte_model, "Hello", max_gen_len=20)[-1]["text"]
    top1 = stream(byte_model, "Hello", max_gen_len=20, temperature=0.9, top_k=1, seed=5)[-1]["text"]
    assert a == b and a != c and top1 == greedy


def test_repetition_penalty_changes_a_repetitive_answer(byte_model):
    plain = stream(byte_model, "Hello", max_gen_len=40)[-1]["text"]
    penalized = stream(byte_model, "Hello", max_gen_len=40, repetition_penalty=5.0)[-1]["text"]
    assert plain != penalized


def test_batch_generate_is_left_padded_and_matches_single_prompts(byte_model):
    prompts = ["Hello", "What is the capital of France? The capital", "A red circle"]
    batch = byte_model.generate(prompts, max_gen_len=12)
    singles = [byte_model.generate([p], max_gen_len=12)[0] for p in prompts]
    assert batch == singles
    details = byte_model.generate(prompts, max_gen_len=12, return_details=True)
    assert [d["text"] for d in details] == batch and all(d["completion_tokens"] <= 12 for d in details)


def test_a_seeded_batch_row_draws_what_it_draws_alone(byte_model):
    prompts = ["Hello", "What is the capital of France? The capital", "Hello"]
    sampled = dict(max_gen_len=16, temperature=1.0, top_p=0.95, seed=5)
    batch = byte_model.generate(prompts, **sampled)
    assert batch == [byte_model.generate([p], **sampled)[0] for p in prompts]
    assert batch[0] == batch[2]  # the same seed and prompt: the same draws, whatever row


def test_stream_and_generate_agree(byte_model):
    assert stream(byte_model, "Hello", max_gen_len=15)[-1]["text"] == byte_model.generate(["Hello"], max_gen_len=15)[0]


def test_answer_length_is_clamped_to_the_context(byte_llama_dir):
    small = MetaModel.from_pretrained(str(byte_llama_dir), max_seq_len=32)
    prompt_tokens = len(small.tokenizer.encode("The quick brown fox jumps"))
    last = stream(small, "The quick brown fox jumps", max_gen_len=500)[-1]
    assert last["finish_reason"] == "length" and last["completion_tokens"] == 32 - prompt_tokens


def test_prompt_that_fills_the_context_is_one_clear_error(byte_llama_dir):
    small = MetaModel.from_pretrained(str(byte_llama_dir), max_seq_len=16)
    with pytest.raises(UserError, match=r"tokens long and leaves no room for an answer within the 16-token context"):
        stream(small, "The quick brown fox jumps over the lazy dog. " * 4)


def test_image_on_a_text_only_model_is_one_clear_error(byte_model):
    from PIL import Image

    with pytest.raises(UserError, match="This model cannot see images"):
        stream(byte_model, "What is in the image?", image=Image.new("RGB", (8, 8)))


def test_generation_runs_without_gradients(byte_model):
    seen = []
    handle = byte_model.llma.register_forward_hook(lambda *_: seen.append(torch.is_grad_enabled()))
    stream(byte_model, "Hello", max_gen_len=3)
    handle.remove()
    assert seen and not any(seen)


def test_the_cache_goes_by_the_name_the_models_forward_takes(byte_model, byte_llama_dir):
    """transformers 5.24 renamed forward's `past_key_values` to `cache` and warns on the old name (removed in 5.40);
    a model written for the old name (remote code, transformers before 5.24) must still get its cache."""
    import inspect
    import warnings

    from transformers import LlamaForCausalLM

    stock_keyword = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"
    caches_seen = []

    class OldStyle(LlamaForCausalLM):
        def forward(
            self,
            input_ids=None,
            attention_mask=None,
            position_ids=None,
            past_key_values=None,
            use_cache=None,
            logits_to_keep=0,
            **kwargs,
        ):
            caches_seen.append(past_key_values)
            return super().forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=use_cache,
                logits_to_keep=logits_to_keep,
                **{stock_keyword: past_key_values},
                **kwargs,
            )

    prompts = ["Hello there", "A longer prompt, which pads the other row"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the deprecation warning would end the test here
        expected = byte_model.generate(prompts, max_gen_len=12)
        old_style = MetaModel.from_pretrained(str(byte_llama_dir))
        old_style.llma.__class__ = OldStyle
        assert old_style.generate(prompts, max_gen_len=12) == expected
    assert len(caches_seen) >= 12 and all(cache is not None for cache in caches_seen)


def test_compiled_decoding_gives_the_same_answers(byte_llama_dir):
    """--compile (torch.compile over a static KV cache) changes the speed, never the tokens: single prompts,
    a left-padded batch, sampling with a seed, and a second request that reuses the pooled cache."""
    eager = MetaModel.from_pretrained(str(byte_llama_dir), max_seq_len=96)
    compiled = MetaModel.from_pretrained(str(byte_llama_dir), max_seq_len=96, compile=True)
    assert compiled.engine.info["compile"] != "off" and eager.engine.compiled is None
    prompts = ["The quick brown fox", "What is the capital of France? The capital"]

    def answers(model):
        return [
            model.generate(prompts, max_gen_len=12),
            model.generate(prompts[:1], max_gen_len=12),
            stream(model, prompts[1], max_gen_len=12)[-1]["text"],
            model.generate(prompts, max_gen_len=12, temperature=0.8, seed=3),
        ]

    expected = answers(eager)
    torch._dynamo.reset()  # forget the graphs earlier tests compiled for models of this shape
    counters.clear()
    assert all(expected[0]) and answers(compiled) == expected
    # one whole graph for batch size 1 (torch specializes size 1) and one for the others, whatever the lengths
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"]


@pytest.mark.parametrize("queues_ahead", [True, False], ids=["as-on-cuda", "cpu"])
def test_compiled_decoding_queues_each_step_before_reading_the_last(byte_llama_dir, queues_ahead):
    """With --compile on CUDA the GPU never waits for Python: each decode step is queued before the tokens it
    follows are read back (forced here on the CPU, where the order is the same code). Answers stay the eager ones
    (one that fills the context to its last position, one cut at a stop string); a stop costs exactly the one step
    already queued, a cancel at most two. On the CPU, where a forward pass runs as it is called, steps are not
    queued ahead: a stop costs none, and the session keeps every token fed either way."""
    eager = MetaModel.from_pretrained(str(byte_llama_dir), max_seq_len=48, speculative="off")  # a token a pass
    compiled = MetaModel.from_pretrained(str(byte_llama_dir), max_seq_len=48, compile=True)
    assert not compiled.engine.compiled.queues_ahead  # a CPU model
    compiled.engine.compiled.queues_ahead = queues_ahead
    compiled_forward = compiled.engine.compiled.forward
    steps = []
    compiled.engine.compiled.forward = lambda *args, **kwargs: steps.append(1) or compiled_forward(*args, **kwargs)
    prompt = "The quick brown fox"

    def both(**kwargs):
        counter = ForwardCounter(eager)
        try:
            expected = stream(eager, prompt, **kwargs)[-1]
        finally:
            counter.restore()
        steps.clear()
        got = stream(compiled, prompt, **kwargs)[-1]
        assert got["text"] == expected["text"] and got["finish_reason"] == expected["finish_reason"]
        # eager's calls count its prefill too: queued ahead, one decode step more than eager's
        assert len(steps) == counter.calls - (not queues_ahead)
        return got

    turn = both(max_gen_len=10, session="tab")  # the session keeps what went through the model
    _, kept = compiled.engine.sessions.store.take("tab")
    assert len(kept.token_ids) == kept.cache.get_seq_length() == turn["prompt_tokens"] + 10 - (not queues_ahead)
    whole = both(max_gen_len=100)
    assert whole["finish_reason"] == "length" and whole["prompt_tokens"] + whole["completion_tokens"] == 48
    stop = whole["text"][8:11]
    cut = both(max_gen_len=100, additional_stop_symbols=[stop])
    assert cut["finish_reason"] == "stop" and cut["text"] == whole["text"][: whole["text"].index(stop)]

    cancel, steps_at_cancel = threading.Event(), None
    for i, piece in enumerate(compiled.stream_generate(prompt, max_gen_len=40, cancel=cancel)):
        if i == 2:
            cancel.set()
            steps_at_cancel = len(steps)
    assert piece["finish_reason"] == "cancelled" and len(steps) - steps_at_cancel <= 2

    # an answer held to a schema: each step's mask follows the token read back, queued ahead or not
    numbers = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3}
    held = Request(prompt, Sampling(30, temperature=0.0), answer_format=AnswerFormat("json_schema", numbers))
    answer = collect(compiled.engine.stream(held))
    assert answer.text == collect(eager.engine.stream(held)).text and isinstance(json.loads(answer.text), list)


def test_compiled_decoding_attends_over_what_the_request_may_hold(byte_model):
    """Each compiled step attends over its whole static cache, so a request gets one sized to its prompt and answer
    (a power of two from 256, at most --max_seq_len), not the whole context: same answers as eager, and one graph
    for every length (a dynamic dimension), never a recompile in the middle of a conversation."""
    compiled = MetaModel(byte_model.llma, byte_model.tokenizer, max_seq_len=1024, compile=True)
    compiled_forward, spans = compiled.engine.compiled.forward, set()

    def forward(*args, **kwargs):
        spans.add(kwargs["attention_mask"].shape[1])
        return compiled_forward(*args, **kwargs)

    compiled.engine.compiled.forward = forward
    short, long = "The quick brown fox", "The quick brown fox jumps over the lazy dog. " * 12  # 12 and 279 tokens
    requests = [(short, 12, 256), (long, 12, 512), (long, 300, 1024), (short, 400, 512), (short, 2000, 1024)]
    torch._dynamo.reset()  # forget the graphs earlier tests compiled for models of this shape
    counters.clear()
    for prompt, max_gen_len, span in requests:
        spans.clear()
        got = stream(compiled, prompt, max_gen_len=max_gen_len)[-1]
        assert got["text"] == stream(byte_model, prompt, max_gen_len=max_gen_len)[-1]["text"] and spans == {span}
        assert counters["stats"]["unique_graphs"] == 1  # compiled for the first request, the others reuse it


def test_compile_decoding_leaves_nothing_to_compile_for_a_first_answer(byte_model):
    """The launchers compile the decode step before the first answer (`compile_decoding`), so that it does not stop
    for minutes after its first token: after it, a first answer of another length compiles nothing, as eager."""
    compiled = MetaModel(byte_model.llma, byte_model.tokenizer, max_seq_len=1024, compile=True)
    torch._dynamo.reset()  # forget the graphs earlier tests compiled for models of this shape
    counters.clear()
    compiled.engine.compile_decoding()
    assert counters["stats"]["unique_graphs"] == 1
    prompt = "The quick brown fox jumps over the lazy dog. " * 12  # 279 tokens: a static cache of 512, not 256
    answer = stream(compiled, prompt, max_gen_len=12)[-1]["text"]
    assert answer == stream(byte_model, prompt, max_gen_len=12)[-1]["text"]
    assert counters["stats"]["unique_graphs"] == 1


def test_a_pooled_static_cache_keeps_nothing_of_the_request_before(byte_model):
    """--compile's pooled static caches are emptied for each request: after a session's turn, whose length is
    known, only the positions it wrote beyond the new prompt are zeroed, the rest is overwritten; after any other
    request, all. Whatever the last request left, NaN here, answers stay eager's (a masked NaN poisons the sums)."""
    compiled = MetaModel(byte_model.llma, byte_model.tokenizer, max_seq_len=256, compile=True)
    long, short = "The quick brown fox jumps over the lazy dog. " * 4, "The quick brown fox"  # 181 and 20 tokens
    for prompt, session in [(long, "first"), (short, "second"), (long, None), (short, None), (short, "third")]:
        got = stream(compiled, prompt, max_gen_len=12, session=session)[-1]
        assert got["text"] == stream(byte_model, prompt, max_gen_len=12)[-1]["text"], (prompt, session)
        [(cache, written)] = compiled.engine.compiled._free[(1, 256)]  # both lengths get the shortest static cache
        assert (written is not None) == (session is not None)
        with torch.inference_mode():
            for layer in cache.layers:  # what the request wrote: the positions after it are zero already
                layer.keys[:, :, : written or 256] = float("nan")
                layer.values[:, :, : written or 256] = float("nan")


def test_compile_with_tensor_parallel_is_one_sentence(byte_model):
    """Compiled steps are queued before the ranks agree on their tokens: the two are refused together."""
    with pytest.raises(UserError, match="--compile is not available with tensor parallel"):
        MetaModel(byte_model.llma, byte_model.tokenizer, compile=True, lockstep=object())


def test_compiled_sliding_window_model_answers_sessions_afresh(byte_model):
    """A session's keys and values are copied into --compile's static cache only where every layer keeps every
    position; a sliding-window model (Mistral's) answers a session's turns as a prefill from scratch, right."""
    from transformers import MistralConfig, MistralForCausalLM

    from fixtures.tiny_models import TEXT_CONFIG

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=byte_model.llma.config.vocab_size, bos_token_id=1, eos_token_id=2, sliding_window=8, **TEXT_CONFIG
    )
    mistral = MistralForCausalLM(config).eval()
    eager = MetaModel(mistral, byte_model.tokenizer, max_seq_len=64)
    compiled = MetaModel(mistral, byte_model.tokenizer, max_seq_len=64, compile=True)
    assert not compiled.engine.compiled.keeps_sessions
    prompt = "The quick brown fox jumps"
    for _ in range(2):  # the second turn would find the first one's cache, if one were kept
        got = stream(compiled, prompt, max_gen_len=12, session="mistral")[-1]
        assert got["cached_tokens"] == 0 and got["text"] == stream(eager, prompt, max_gen_len=12)[-1]["text"]


def test_cuda_graphs_are_off_where_they_cannot_run_and_the_model_line_says_why():
    """The plain launch replays its decode steps from CUDA graphs only on one GPU (tests/test_gpu.py runs them);
    elsewhere, and with --no_cuda_graphs, the model's facts say why not."""
    from local_chat.launchers.flags import parser
    from local_chat.launchers.loading import load_engine

    engine = load_engine(parser("test").parse_args(["--no_cuda_graphs"]))
    assert engine.graphs is None and engine.info["cuda_graphs"] == "off: --no_cuda_graphs"
    on_the_cpu = MetaModel(engine.llma, engine.tokenizer)
    assert on_the_cpu.engine.graphs is None and on_the_cpu.engine.info["cuda_graphs"] == "off: not on a GPU"
    assert on_the_cpu.engine.summary().cuda_graphs is False
