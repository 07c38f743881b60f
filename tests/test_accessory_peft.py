"""LLaMA2-Accessory's llama_peft checkpoints (model/checkpoint.py `fold_peft`): a base in Accessory's format and a
fine-tuned folder holding only llama_peft's tensors (every linear's bias and LoRA pair, the norms), as its training
saves them, in two model-parallel shards split as Accessory's layers split them (accessory/model/peft.py). Their
logits equal a forward written here from Accessory's own formula (accessory/model/LLM/llama_peft.py: `W x + b +
lora_b(lora_a(x))`, unscaled; Meta's interleaved rotary), on the tensors as saved; the guide's loading example runs;
two ranks (gloo) answer as one process does; the other Accessory types are refused in one sentence."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from test_guide_examples import run_example

from fixtures import tiny_models
from fixtures.app_server import generate, generate_here
from local_chat.errors import UserError
from local_chat.model.meta import MetaModel

RANK = 4
COLUMN, ROW = ("wq", "wk", "wv", "w1", "w3"), ("wo", "w2")


def peft_tensors(base: dict[str, torch.Tensor], seed: int = 3) -> dict[str, torch.Tensor]:
    """What llama_peft's training saves: a bias and a LoRA pair per linear, and the tuned norms (none zero)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for key, weight in base.items():
        parts = key.split(".")
        if parts[0] == "layers" and parts[-2] in COLUMN + ROW:
            linear, (out, into) = key.removesuffix(".weight"), weight.shape
            tensors[f"{linear}.bias"] = torch.randn(out, generator=generator) * 0.1
            tensors[f"{linear}.lora_a.weight"] = torch.randn(RANK, into, generator=generator) * 0.1
            tensors[f"{linear}.lora_b.weight"] = torch.randn(out, RANK, generator=generator) * 0.1
        elif key.endswith("norm.weight"):
            tensors[key] = 1 + torch.randn(weight.shape, generator=generator) * 0.1
    return tensors


def shard_dim(key: str) -> int | None:
    """How Accessory's fairscale layers split a tensor across 2 ranks (written here, apart from the loader's)."""
    parts = key.split(".")
    owner = parts[-2]
    if owner in ("lora_a", "lora_b"):
        return {("lora_b", True): 0, ("lora_a", False): 1}.get((owner, parts[-3] in COLUMN))
    if owner in COLUMN:
        return 0
    if owner in ROW:
        return 1 if parts[-1] == "weight" else None
    return {"tok_embeddings": 1, "output": 0}.get(owner)


def save_shards(tensors: dict[str, torch.Tensor], folder, shards: int = 2) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(shards):
        shard = {}
        for key, tensor in tensors.items():
            dim = shard_dim(key)
            shard[f"llma.{key}"] = tensor.chunk(shards, dim)[index].clone() if dim is not None else tensor.clone()
        torch.save({"model": shard}, folder / f"consolidated.{index:02d}-of-{shards:02d}.model.pth")


def reference_logits(state: dict[str, torch.Tensor], params: dict, tokens: list[int]) -> torch.Tensor:
    """Accessory's llama_peft forward over Meta-layout tensors: a linear is `x W^T + b + (x A^T) B^T`."""
    dim, heads, kv_heads, eps = params["dim"], params["n_heads"], params["n_kv_heads"], params["norm_eps"]
    head_dim, length = dim // heads, len(tokens)

    def linear(x, name):
        out = x @ state[f"{name}.weight"].T + state[f"{name}.bias"]
        return out + (x @ state[f"{name}.lora_a.weight"].T) @ state[f"{name}.lora_b.weight"].T

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    angles = torch.outer(
        torch.arange(length).float(), 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    )
    rotation = torch.polar(torch.ones_like(angles), angles)[:, None, :]

    def rotary(x):  # Meta's: pairs of adjacent dimensions as complex numbers
        return torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * rotation).flatten(-2)

    mask = torch.full((length, length), float("-inf")).triu(1)
    h = state["tok_embeddings.weight"][torch.tensor(tokens)]
    for layer in range(params["n_layers"]):
        at = f"layers.{layer}"
        x = rms(h, state[f"{at}.attention_norm.weight"])
        q = rotary(linear(x, f"{at}.attention.wq").view(length, heads, head_dim)).transpose(0, 1)
        k = rotary(linear(x, f"{at}.attention.wk").view(length, kv_heads, head_dim)).transpose(0, 1)
        v = linear(x, f"{at}.attention.wv").view(length, kv_heads, head_dim).transpose(0, 1)
        k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
        scores = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(head_dim) + mask, dim=-1)
        h = h + linear((scores @ v).transpose(0, 1).reshape(length, dim), f"{at}.attention.wo")
        x = rms(h, state[f"{at}.ffn_norm.weight"])
        gated = F.silu(linear(x, f"{at}.feed_forward.w1")) * linear(x, f"{at}.feed_forward.w3")
        h = h + linear(gated, f"{at}.feed_forward.w2")
    return rms(h, state["norm.weight"]) @ state["output.weight"].T


@pytest.fixture(scope="module")
def peft(work, sp_llama, sp_model_file, checkpoints):
    """(base folder, fine-tuned folder, params.json, the peft config, every tensor as saved)."""
    base = tiny_models.meta_state_dict(sp_llama)
    tuned = peft_tensors(base)
    folder = work / "alpaca_llamaPeft_normBiasLora"
    save_shards(tuned, folder)
    config = work / "llamaPeft_normBiasLora.json"
    config.write_text(json.dumps({"lora_rank": RANK, "bias_tuning": True}))
    return checkpoints["meta"], folder, checkpoints["meta"] / "params.json", config, base | tuned


def test_a_base_and_its_llama_peft_folder_give_accessorys_logits(peft):
    base, tuned, params, config, state = peft
    model = MetaModel.from_pretrained([str(base), str(tuned)], llama_type="llama_peft", llama_config=[params, config])
    tokens = model.tokenizer.encode("The best programming language in the world is", bos=True, eos=False)
    with torch.no_grad():
        logits = model.llma(torch.tensor([tokens])).logits[0].float()
    expected = reference_logits(state, json.loads(params.read_text()), tokens)
    assert torch.allclose(logits, expected, atol=1e-4, rtol=1e-4), (logits - expected).abs().max()
    plain = MetaModel.from_pretrained(str(base)).llma(torch.tensor([tokens])).logits[0]
    assert not torch.allclose(plain, logits, atol=1e-2)  # the fine-tuning shows


def test_the_guides_legacy_example_loads_a_llama_peft_checkpoint(peft, sp_model_file, tmp_path):
    base, tuned, params, config, state = peft
    whole = tmp_path / "finetuned"  # one folder holding every tensor, as the guide's example names one
    save_shards(state, whole)
    result = run_example(
        "legacy",
        {
            "/path/to/llama/7B/params.json": params,
            "configs/model/finetune/sg/llamaPeft_normBiasLora.json": config,
            "/path/to/tokenizer.model": sp_model_file,
            "/path/to/pretrained": whole,
        },
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_two_ranks_answer_as_one_process_does(peft, tmp_path):
    base, tuned, params, config, _ = peft
    flags = ["--prompts", "Tell me a story.", "--pretrained_path", str(base), str(tuned), "--llama_type",
             "llama_peft", "--llama_config", str(params), str(config), "--template", "alpaca", "--temperature", "0",
             "--max_new_tokens", "16"]  # fmt: skip
    one = generate_here(tmp_path, "one", *flags)
    assert generate(tmp_path, "two", *flags, "--n_gpus", "2", "--device", "cpu") == one


@pytest.mark.parametrize(
    "llama_type, sentence",
    [
        ("llama_ens5", "multimodal models"),
        ("llama_qformerv2_peft", "pass a Hugging Face vision folder"),
        ("mixtral_peft", "is not read from Accessory's format"),
        ("llama_adapter", "pass the model as a Hugging Face folder instead"),
    ],
)
def test_the_other_accessory_types_are_one_sentence(checkpoints, llama_type, sentence):
    with pytest.raises(UserError, match=sentence):
        MetaModel.from_pretrained(str(checkpoints["accessory"]), llama_type=llama_type)
