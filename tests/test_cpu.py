"""On a machine without a GPU: the default dtype follows the CPU (bf16 where it computes bf16 natively), and the linear
layers run on torch's CPU kernels (model/cpu_linear.py): prepacked bf16, int8 and int4 weights. They compute what
`F.linear` computes (within their rounding), and the answers keep what the plain model gives: the same greedy tokens
as plain bf16 layers, the session's cache across turns, the batch, answers held to a schema, guessed tokens."""

import json
import os
import threading

import pytest
import torch

from fixtures import tiny_models
from local_chat.engine import AnswerFormat, Request, Sampling, collect
from local_chat.model import cpu_linear, cpu_threads, loading
from local_chat.model.cpu_linear import INT4_GROUP, Int4Linear, Int8Linear, PackedLinear, SiblingLinear, swap_linears
from local_chat.model.meta import MetaModel


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, byte_tokenizer):
    model = tiny_models.random_llama(len(byte_tokenizer), seed=3, hidden_size=128, intermediate_size=384)
    return tiny_models.save_hf(model, tmp_path_factory.mktemp("cpu"), hf_tokenizer=byte_tokenizer)


def test_the_default_dtype_is_bf16_where_the_cpu_computes_it_and_the_model_line_says_why(monkeypatch):
    monkeypatch.delenv(loading.DTYPE_VARIABLE)
    cpu = torch.device("cpu")
    monkeypatch.setattr(loading, "native_bf16", lambda: "AMX")
    assert loading.resolve_dtype(None, cpu) == torch.bfloat16 and loading.resolve_dtype("fp32", cpu) == torch.float32
    assert loading.dtype_shown(None, cpu, torch.bfloat16) == "bfloat16 (this CPU computes bf16 with AMX)"
    monkeypatch.setattr(loading, "native_bf16", lambda: None)
    assert loading.resolve_dtype(None, cpu) == torch.float32
    assert loading.dtype_shown(None, cpu, torch.float32) == "float32 (this CPU has no native bf16)"
    assert loading.dtype_shown("fp32", cpu, torch.float32) == "float32"
    monkeypatch.setenv(loading.DTYPE_VARIABLE, "bf16")
    assert loading.resolve_dtype(None, cpu) == torch.bfloat16
    # this machine's answer is the CPU's own flags
    assert (cpu_linear.native_bf16() is not None) == bool(
        torch.cpu.get_capabilities().get("amx_bf16") or torch.cpu.get_capabilities().get("avx512_bf16")
    )


@pytest.mark.parametrize("kind, tolerance", [(PackedLinear, 0.02), (Int8Linear, 0.03), (Int4Linear, 0.15)])
def test_each_kernel_computes_the_layer(kind, tolerance):
    """Relative to the bf16 layer's own output, on rows of one (decoding) and of many (a prompt)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(4 * INT4_GROUP, 96, bias=True).to(torch.bfloat16)
    swapped = kind(linear)
    for rows in (1, 37):
        x = torch.randn(2, rows, 4 * INT4_GROUP, dtype=torch.bfloat16)
        want, got = linear(x).float(), swapped(x).float()
        assert got.shape == want.shape and got.dtype == torch.float32
        assert (got - want).norm() / want.norm() < tolerance


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_layers_that_read_one_input_are_merged_and_each_still_gets_its_own_output(bits):
    """q, k and v become one layer read in one pass; each gives what its own layer gave, also when it is
    called on an input its siblings were not (the merged layer computes again, never a stale output)."""
    torch.manual_seed(0)
    width = 2 * INT4_GROUP
    attention = torch.nn.Module()
    for name, out in (("q_proj", width), ("k_proj", 32), ("v_proj", 32), ("o_proj", width)):
        setattr(attention, name, torch.nn.Linear(width, out, bias=name != "o_proj").to(torch.bfloat16))
    plain = {name: getattr(attention, name) for name in ("q_proj", "k_proj", "v_proj")}
    assert (
        swap_linears(attention, bits, [])
        == {
            None: "4 linear layers: bf16 prepacked for oneDNN",
            8: "4 linear layers: int8 weights (torch's int8 kernel)",
            4: "4 linear layers: int4 weights",
        }[bits]
    )
    assert all(isinstance(getattr(attention, name), SiblingLinear) for name in plain)
    assert len([m for m in attention.modules() if isinstance(m, (PackedLinear, Int8Linear, Int4Linear))]) == 2
    tolerance = 0.15 if bits == 4 else 0.03
    x, other = torch.randn(2, 3, width, dtype=torch.bfloat16), torch.randn(1, 1, width, dtype=torch.bfloat16)
    for name in ("q_proj", "k_proj", "v_proj", "k_proj"):  # k twice: the second call reads the shared output
        for rows in (x, other) if name == "k_proj" else (x,):
            want, got = plain[name](rows).float(), getattr(attention, name)(rows).float()
            assert got.shape == want.shape and (got - want).norm() / want.norm() < tolerance, name


def test_bf16_layers_are_prepacked_and_compute_what_plain_bf16_layers_compute(llama_dir):
    """The same next-token logits as the model's own bf16 layers, within bf16's rounding (two bf16 kernels add in
    other orders: a random model's near-even logits may then pick other tokens, so no token-for-token claim here)."""
    packed = MetaModel.from_pretrained(str(llama_dir), dtype="bf16", speculative="off")
    layer = packed.llma.model.layers[0]
    assert isinstance(layer.mlp.up_proj, PackedLinear) and isinstance(layer.self_attn.k_proj, SiblingLinear)
    head = packed.llma.lm_head  # prepacked too; untied here, so its weights' values are in the packed copy alone
    assert type(head) is PackedLinear and head.weight.shape == (head.out_features, head.in_features)
    assert head.weight.is_meta and not any(p.is_meta for p in packed.llma.parameters())
    assert packed.engine.summary().cpu_kernels == (
        "14 linear layers: bf16 prepacked for oneDNN; the output layer: bf16 prepacked"
    )
    plain = MetaModel.from_pretrained(str(llama_dir), dtype="fp32").llma.to(torch.bfloat16)  # fp32 keeps F.linear
    ids = packed.tokenizer.hf("What is the capital of France?", return_tensors="pt").input_ids
    with torch.inference_mode():
        want, got = (m(input_ids=ids).logits[0, -1].float() for m in (plain, packed.llma))
    assert (got - want).norm() / want.norm() < 0.02


@pytest.mark.parametrize("quant", [None, 8])
def test_the_cpu_kernels_keep_the_cache_the_batch_the_schema_and_the_guesses(llama_dir, quant):
    model = MetaModel.from_pretrained(str(llama_dir), dtype="bf16", quant=quant)
    assert model.engine.summary().cpu_kernels.startswith("14 linear layers")
    engine, greedy = model.engine, Sampling(max_new_tokens=16, temperature=0.0)
    first = collect(engine.stream(Request("Hello there", greedy, session="s")))
    turn = "Hello there" + first.text + " And then?"
    again = collect(engine.stream(Request(turn, greedy, session="s")))
    assert again.end.cached_tokens > 0 and again.text == collect(engine.stream(Request(turn, greedy))).text

    prompts = [f"Question {i}:" for i in range(3)]
    alone = [collect(engine.stream(Request(p, greedy))).text for p in prompts]
    engine.start_batching(4)
    try:
        assert [a.text for a in engine.complete([Request(p, greedy) for p in prompts])] == alone
    finally:
        engine.stop_batching()

    schema = {
        "type": "object",
        "properties": {"n": {"enum": [1, 2, 3]}},
        "required": ["n"],
        "additionalProperties": False,
    }
    held = collect(
        engine.stream(Request("JSON:", Sampling(max_new_tokens=40), answer_format=AnswerFormat("json_schema", schema)))
    )
    assert json.loads(held.text)["n"] in (1, 2, 3)

    quoting = "the cat sat on the mat and the cat sat on the mat and the cat"
    guessed = collect(engine.stream(Request(quoting, greedy)))
    plain = MetaModel.from_pretrained(str(llama_dir), dtype="bf16", quant=quant, speculative="off")
    assert guessed.text == collect(plain.engine.stream(Request(quoting, greedy))).text


def test_compile_keeps_transformers_layers_and_answers(llama_dir):
    """--compile leaves the layers to inductor (it packs weights itself, and cannot lower oneDNN's prepacked ones)."""
    model = MetaModel.from_pretrained(str(llama_dir), dtype="bf16", compile=True, speculative="off")
    assert type(model.llma.model.layers[0].mlp.up_proj) is torch.nn.Linear and not model.engine.summary().cpu_kernels
    assert model.generate(["Hello"], max_gen_len=3)[0] is not None


def test_a_thread_done_computing_hands_its_workers_back():
    """The OpenMP workers a thread's parallel region started end when it hands them back, and start again with its
    next region (model/cpu_threads.py)."""
    if torch.get_num_threads() < 2 or cpu_threads._libgomp() is None:
        pytest.skip("one thread, or no libgomp: no workers to hand back")
    tasks = lambda: set(os.listdir("/proc/self/task"))  # noqa: E731
    seen = {}

    def compute_then_hand_back():
        before = tasks()
        assert torch.ones(4096, 4096).sum() == 4096 * 4096  # a parallel region: the workers start
        seen["started"] = tasks() - before
        cpu_threads.hand_back_workers()
        seen["left"] = seen["started"] & tasks()
        assert torch.ones(4096, 4096).sum() == 4096 * 4096  # and start again

    thread = threading.Thread(target=compute_then_hand_back)
    thread.start()
    thread.join()
    assert len(seen["started"]) >= torch.get_num_threads() - 1
    assert len(seen["started"]) - len(seen["left"]) >= torch.get_num_threads() - 1
