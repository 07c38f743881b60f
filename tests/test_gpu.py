"""CUDA paths, run where a GPU is visible (CI has none: these skip there). `pytest tests/test_gpu.py` on a GPU
machine repeats the checks first run by hand on an H100 (2026-11-22): the launcher in bf16 and with --quant,
torchrun over NCCL, accelerate's device map, and images, sessions and Stop through the API;
--compile's answers on CUDA since 2026-11-24; the plain launch's CUDA graphs since 2026-11-26. Only the launcher
tests need the app's own dependencies (gradio): the rest run with torch and transformers alone."""

import json
import threading

import pytest
import torch
from PIL import Image, ImageDraw

from local_chat.defaults import DEMO_MODEL
from local_chat.model.compiled import StaticDecoding
from local_chat.model.meta import MetaModel
from local_chat.templates.multi_turn import default_conversation
from local_chat.templates.single_turn import format_prompt

PROMPTS = ["What is the capital of France?", "Who are you?"]

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible"),
    pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built"),
]


@pytest.mark.parametrize("flags", [["--dtype", "bf16"], ["--quant", "4"], ["--quant", "8"]], ids=" ".join)
def test_launcher_on_cuda(tmp_path, flags):
    from fixtures.app_server import generate

    written = generate(tmp_path, "out", "--prompts", *PROMPTS, "--device", "cuda", *flags)
    records = [json.loads(line) for line in written.splitlines()]
    assert records[0]["response"].strip() == "The capital of France is Paris."
    assert all(r["finish_reason"] == "stop" and r["response"].strip() for r in records)


def test_torchrun_one_rank_over_nccl_writes_what_one_process_writes(tmp_path):
    from fixtures.app_server import TORCHRUN, generate

    flags = ["--prompts", *PROMPTS, "--device", "cuda"]
    one_rank = [*TORCHRUN[:-1], "1"]
    assert generate(tmp_path, "torchrun", *flags, launcher=one_rank) == generate(tmp_path, "alone", *flags)


def answers(model: MetaModel) -> list[str]:
    """Greedy answers about an image, a plain question, and a second turn that reuses the first turn's cache."""
    image = Image.new("RGB", (224, 224), "white")
    ImageDraw.Draw(image).ellipse((40, 40, 180, 180), fill="red")
    said = [
        last(model, format_prompt({"instruction": "What is in the image?"}, sys_name="alpaca"), image=image),
        last(model, format_prompt({"instruction": "What is the capital of Italy?"}, sys_name="alpaca")),
    ]
    conversation = default_conversation()
    for question in ("What is 2 plus 3?", "What is the capital of Spain?"):
        conversation.append_message(conversation.roles[0], question)
        conversation.append_message(conversation.roles[1], None)
        answer = last(
            model, conversation.get_prompt(), session="chat", additional_stop_symbols=conversation.stop_symbols
        )
        conversation.messages[-1][1] = answer
        said.append(answer)
    return said


def last(model: MetaModel, prompt: str, **kwargs) -> str:
    return list(model.stream_generate(prompt, max_gen_len=40, **kwargs))[-1]["text"]


@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs", "eager"])
def test_cuda_answers_as_the_cpu_does_and_stop_stops(cuda_graphs):
    on_cpu = answers(MetaModel.from_pretrained(str(DEMO_MODEL), with_visual=True, device="cpu", dtype="fp32"))
    model = MetaModel.from_pretrained(
        str(DEMO_MODEL), with_visual=True, device="cuda", dtype="fp32", cuda_graphs=cuda_graphs
    )
    assert answers(model) == on_cpu
    assert not torch.backends.cuda.cudnn_sdp_enabled()  # see model/meta.py: avoid_cudnn_attention
    assert (model.engine.graphs is not None) == cuda_graphs, model.engine.info["cuda_graphs"]
    if cuda_graphs:  # every step replayed: none fell back to eager
        assert model.engine.graphs.forward.recorded() == {"graphs": [(1, 256)], "eager": []}
    assert_cancel_stops(model)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cuda_graphs_give_eager_tokens_in_two_length_buckets(dtype):
    """Greedy answers replayed from CUDA graphs have the tokens of eager steps, for a prompt whose static cache is
    256 tokens long and one whose cache is 512, asked twice (the second time replayed only). In fp32 against the
    plain eager path (a dynamic cache); in bf16, where attending over a longer masked cache may round differently,
    against eager steps over the same static cache: the kernels the graphs replay, so the very same tokens."""
    eager = MetaModel.from_pretrained(str(DEMO_MODEL), device="cuda", dtype=dtype, cuda_graphs=False)
    graphed = MetaModel(eager.llma, eager.tokenizer, max_seq_len=eager.max_seq_len)
    if dtype == "bf16":
        eager.engine.decoding.graphs = StaticDecoding(eager.llma, eager.max_seq_len, eager.llma)  # not recorded
    questions = ["What is the capital of France?", "Summarize this. " + "The sky is blue and the sea is deep. " * 15]
    prompts = [format_prompt({"instruction": question}, sys_name="alpaca") for question in questions]
    lengths = [graphed.engine.graphs.cache_length(len(graphed.tokenizer.encode(p, bos=True)) + 64) for p in prompts]
    assert lengths == [256, 512]

    def tokens(model):
        return [list(model.stream_generate(p, max_gen_len=64))[-1]["token_ids"] for p in prompts]

    expected = tokens(eager)
    assert tokens(graphed) == expected
    assert tokens(graphed) == expected
    assert sorted(graphed.engine.graphs.forward.recorded()["graphs"]) == [(1, 256), (1, 512)]
    assert_cancel_stops(graphed)


def test_compiled_cuda_answers_as_eager_does_and_stop_stops():
    eager = answers(MetaModel.from_pretrained(str(DEMO_MODEL), with_visual=True, device="cuda", dtype="fp32"))
    model = MetaModel.from_pretrained(str(DEMO_MODEL), with_visual=True, device="cuda", dtype="fp32", compile=True)
    assert answers(model) == eager  # each token read back while the next step runs (model/generation.py)
    assert_cancel_stops(model)


def assert_cancel_stops(model: MetaModel) -> None:
    cancel = threading.Event()
    for count, piece in enumerate(
        model.stream_generate("Tell me a story.", max_gen_len=200, temperature=0.8, seed=1, cancel=cancel)
    ):
        if count == 2:
            cancel.set()
    assert piece["finish_reason"] == "cancelled" and piece["completion_tokens"] <= count + 3


def test_device_map_auto_answers_as_one_gpu_does():
    one_gpu = answers(MetaModel.from_pretrained(str(DEMO_MODEL), with_visual=True, device="cuda", dtype="bf16"))
    spread = MetaModel.from_pretrained(str(DEMO_MODEL), with_visual=True, device="auto", dtype="bf16")
    assert answers(spread) == one_gpu
