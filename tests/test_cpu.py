"""On a machine without a GPU: the default dtype follows the CPU (bf16 where it computes bf16 natively), and the linear
layers run on torch's CPU kernels (model/cpu_linear.py): prepacked bf16, int8 and int4 weights. They compute what
`F.linear` computes (within their rounding), and the answers keep what the plain model gives: the same greedy tokens
as plain bf16 layers, the session's cache across turns, the batch, answers held to a schema, guessed tokens."""

import json

import pytest
import tiny_models
import torch

from local_chat.engine import AnswerFormat, Request, Sampling, collect
from local_chat.model import cpu_linear, loading
from local_chat.model.cpu_linear import INT4_GROUP, Int4Linear, Int8Linear, PackedLinear
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


def test_bf16_layers_are_prepacked_and_compute_what_plain_bf16_layers_compute(llama_dir):
    """The same next-token logits as the model's own bf16 layers, within bf16's rounding (two bf16 kernels add in
    other orders: a random model's near-even logits may then pick other tokens, so no token-for-token claim here)."""
    packed = MetaModel.from_pretrained(str(llama_dir), dtype="bf16", speculative="off")
    assert isinstance(packed.llma.model.layers[0].mlp.up_proj, PackedLinear)
    assert type(packed.llma.lm_head) is torch.nn.Linear
    assert packed.engine.summary().cpu_kernels == "14 linear layers: bf16 prepacked for oneDNN"
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
