"""--quant 4 and 8 on the CPU (torch's int8 and int4 kernels, model/cpu_linear.py; bitsandbytes' under an unmerged
LoRA adapter): they load, answer, shrink the weights to about llama.cpp's Q8_0 and Q4_0 bytes, and stay quiet."""

import logging

import pytest

from fixtures import tiny_models
from local_chat.model.footprint import weight_bytes
from local_chat.model.meta import MetaModel

pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def wide_llama_dir(tmp_path_factory, byte_tokenizer):
    """Wide enough that quantization constants are a realistic share of the weights."""
    model = tiny_models.random_llama(
        len(byte_tokenizer),
        seed=2,
        hidden_size=512,
        intermediate_size=1536,
        num_attention_heads=8,
        num_key_value_heads=8,
    )
    return tiny_models.save_hf(model, tmp_path_factory.mktemp("wide"), hf_tokenizer=byte_tokenizer)


@pytest.fixture(scope="module")
def bf16_block_bytes(wide_llama_dir):
    return weight_bytes(MetaModel.from_pretrained(str(wide_llama_dir), dtype="bf16").llma.model.layers)


@pytest.mark.parametrize("quant, goal", [(4, 0.29), (True, 0.29), (8, 0.51)])
def test_quantized_model_loads_answers_and_shrinks(wide_llama_dir, bf16_block_bytes, quant, goal, caplog):

    from local_chat.model.cpu_linear import Int4Linear, Int8Linear

    with caplog.at_level(logging.INFO):
        model = MetaModel.from_pretrained(str(wide_llama_dir), quant=quant)
        pieces = list(model.stream_generate("The quick brown fox", max_gen_len=8))
    linear = Int4Linear if quant in (4, True) else Int8Linear
    attention = model.llma.model.layers[0].self_attn
    assert isinstance(attention.o_proj, linear) and isinstance(attention.q_proj.merged, linear)  # q, k, v: one layer
    assert model.llma.lm_head.weight.dtype == model.llma.model.embed_tokens.weight.dtype  # the model's precision
    assert pieces[-1]["completion_tokens"] == 8 and pieces[-1]["text"]
    ratio = weight_bytes(model.llma.model.layers) / bf16_block_bytes
    assert ratio <= goal, f"{quant}-bit blocks take {ratio:.3f} of bf16"
    assert model.engine.info["quant"] == f"{4 if quant is True else quant}-bit"
    assert model.engine.summary().cpu_kernels.startswith("14 linear layers: int")  # 2 layers of 7
    # No notice at import, and no cast warning on every 8-bit layer call.
    assert not [r for r in caplog.records if r.name.startswith("bitsandbytes") and r.levelno >= logging.WARNING]


def test_quantized_accessory_checkpoint(checkpoints):
    model = MetaModel.from_pretrained(str(checkpoints["accessory"]), quant=4)
    assert model.generate(["Hello"], max_gen_len=4)[0] is not None


def test_a_quantized_model_batches_answers_that_run_at_once(wide_llama_dir):
    import threading

    from local_chat.engine import Request, Sampling, collect

    model = MetaModel.from_pretrained(str(wide_llama_dir), quant=4)
    assert model.engine.start_batching(2).startswith("continuous batching")
    try:
        requests = [Request(f"Question {i}:", Sampling(40, temperature=0.0)) for i in range(3)]
        alone = [collect(model.engine.stream(r)) for r in requests]
        together = [None] * 3

        def answer(i):
            together[i] = collect(model.engine.stream(requests[i]))

        threads = [threading.Thread(target=answer, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        batched = model.engine.batcher.answers
    finally:
        model.engine.stop_batching()
    assert [a.text for a in together] == [a.text for a in alone]
    assert batched >= 1 and all(a.end.finish_reason in ("stop", "length") for a in together)
