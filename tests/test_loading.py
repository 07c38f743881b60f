"""MetaModel.from_pretrained: every checkpoint format, Accessory's legacy arguments, and bad input."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from fixtures import tiny_models
from local_chat.errors import UserError
from local_chat.model.meta import MetaModel

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def loaded(checkpoints):
    return {name: MetaModel.from_pretrained(str(path)) for name, path in checkpoints.items()}


def test_all_formats_continue_a_prompt_identically(loaded):
    answers = {name: m.generate([PROMPT], max_gen_len=24)[0] for name, m in loaded.items()}
    assert answers["hf"] and answers["accessory"] == answers["hf"] and answers["meta"] == answers["hf"]
    ids = torch.tensor([loaded["hf"].tokenizer.encode(PROMPT)])
    reference = loaded["hf"].llma(ids).logits
    for name in ("accessory", "meta"):
        torch.testing.assert_close(loaded[name].llma(ids).logits, reference)


def test_loaded_model_is_an_ordinary_transformers_llama(loaded):
    from transformers import LlamaForCausalLM

    for m in loaded.values():
        assert type(m.llma) is LlamaForCausalLM
    assert loaded["accessory"].engine.info["format"] == "LLaMA2-Accessory (2 shards)"
    assert loaded["meta"].engine.info["format"] == "Meta (2 shards)"


def test_vocab_size_comes_from_the_weights_when_params_say_minus_one(loaded, checkpoints):
    assert json.loads((checkpoints["meta"] / "params.json").read_text())["vocab_size"] == -1
    assert loaded["meta"].llma.config.vocab_size == loaded["hf"].llma.config.vocab_size


def test_consolidated_checkpoints_get_exactly_one_bos(loaded):
    for name in ("accessory", "meta"):
        tokenizer = loaded[name].tokenizer
        ids = tokenizer.encode(PROMPT, bos=True, eos=False)
        assert ids[0] == tokenizer.bos_id and ids.count(tokenizer.bos_id) == 1
        assert tokenizer.decode(ids) == PROMPT


def test_accessory_checkpoint_with_hf_tokenizer_files_also_gets_one_bos(tmp_path, byte_tokenizer):
    hf_only = tiny_models.train_byte_level_tokenizer()
    model = tiny_models.random_llama(len(hf_only), seed=3)
    folder = tiny_models.save_accessory(model, tmp_path / "acc", hf_tokenizer=hf_only, shards=1)
    loaded = MetaModel.from_pretrained(str(folder))
    ids = loaded.tokenizer.encode("<s>Hello", bos=True)  # BOS written in the text and asked for: still one
    assert ids.count(loaded.tokenizer.bos_id) == 1 and ids[0] == loaded.tokenizer.bos_id


def test_default_dtype_and_device_on_cpu(loaded):
    assert loaded["hf"].llma.dtype == torch.float32 and loaded["hf"].device.type == "cpu"
    bf16 = MetaModel.from_pretrained(str(loaded["hf"].engine.info["path"]), dtype="bf16")
    assert bf16.llma.dtype == torch.bfloat16


def test_legacy_arguments_llama_type_config_and_tokenizer_path(tmp_path, checkpoints, sp_llama, sp_model_file):
    bare = tmp_path / "legacy"
    bare.mkdir()
    for shard in checkpoints["accessory"].glob("consolidated.*"):
        shutil.copy(shard, bare / shard.name)
    base = tmp_path / "params.json"
    base.write_text(json.dumps(tiny_models.meta_params(sp_llama.config) | {"norm_eps": 1.0}))
    fix = tmp_path / "fix.json"
    fix.write_text(json.dumps({"norm_eps": 1e-5}))  # merged left to right: this one wins
    legacy = MetaModel.from_pretrained(
        str(bare),
        llama_type="llama",
        llama_config=[str(base), str(fix)],
        tokenizer_path=str(sp_model_file),
        max_seq_len=2048,
    )
    assert legacy.llma.config.rms_norm_eps == 1e-5
    reference = MetaModel.from_pretrained(str(checkpoints["accessory"]))
    assert legacy.generate([PROMPT], max_gen_len=16) == reference.generate([PROMPT], max_gen_len=16)


def test_later_pretrained_paths_override_earlier_ones(tmp_path, checkpoints, sp_llama, sp_model_file):
    tuned = tiny_models.random_llama(sp_llama.config.vocab_size, seed=7)
    # A "delta" folder holding only the output layer of another model: later weights win.
    delta = tmp_path / "delta"
    delta.mkdir()
    output = tiny_models.meta_state_dict(tuned)["output.weight"]
    torch.save({"model": {"llma.output.weight": output}}, delta / "consolidated.00-of-01.model.pth")
    merged = MetaModel.from_pretrained([str(checkpoints["accessory"]), str(delta)])
    torch.testing.assert_close(merged.llma.lm_head.weight, output)
    torch.testing.assert_close(merged.llma.model.embed_tokens.weight, sp_llama.model.embed_tokens.weight)


def test_max_seq_len_is_capped_by_the_position_limit(checkpoints):
    assert MetaModel.from_pretrained(str(checkpoints["hf"]), max_seq_len=100_000).max_seq_len == 1024
    assert MetaModel.from_pretrained(str(checkpoints["hf"]), max_seq_len=256).max_seq_len == 256


# ----- bad input: one clear sentence each -----


def _copy(src, dst, skip=()):
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in skip:
            shutil.copy(f, dst / f.name)
    return dst


def expect_user_error(match, *args, **kwargs):
    with pytest.raises(UserError, match=match) as info:
        MetaModel.from_pretrained(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_missing_path(tmp_path):
    expect_user_error("does not exist; check --pretrained_path", str(tmp_path / "nope"))


def test_folder_without_checkpoint_says_what_was_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    message = expect_user_error("No checkpoint found", str(tmp_path))
    assert (
        "config.json" in message and "consolidated.00-of-01.model.pth" in message and "consolidated.00.pth" in message
    )


def test_missing_accessory_shard_says_which(tmp_path, checkpoints):
    folder = _copy(checkpoints["accessory"], tmp_path / "acc", skip=("consolidated.01-of-02.model.pth",))
    expect_user_error(r"found 1 of 2, consolidated\.01-of-02\.model\.pth absent", str(folder))


def test_missing_last_meta_shard_is_caught_by_shapes(tmp_path, checkpoints):
    folder = _copy(checkpoints["meta"], tmp_path / "meta", skip=("consolidated.01.pth",))
    expect_user_error(
        r"'tok_embeddings.weight' has shape \(\d+, 32\) but the model config expects \(\d+, 64\)", str(folder)
    )


def _meta_with_params(tmp_path, checkpoints, **changes):
    folder = _copy(checkpoints["meta"], tmp_path / "meta")
    params = json.loads((folder / "params.json").read_text())
    (folder / "params.json").write_text(json.dumps(params | changes))
    return folder


def test_params_that_do_not_match_the_weights_name_the_tensor_and_both_shapes(tmp_path, checkpoints):
    folder = _meta_with_params(tmp_path, checkpoints, n_kv_heads=4)
    expect_user_error(
        r"'layers.0.attention.wk.weight' has shape \(32, 64\) but the model config expects \(64, 64\)", str(folder)
    )


def test_more_layers_in_config_than_in_weights(tmp_path, checkpoints):
    folder = _meta_with_params(tmp_path, checkpoints, n_layers=3)
    expect_user_error("lacks .* tensors the model config needs", str(folder))


def test_an_unknown_llama_type_lists_what_is_supported(checkpoints):  # Accessory's own: test_accessory_peft.py
    message = expect_user_error(
        "llama_type 'llama_nonsense' is not supported", str(checkpoints["accessory"]), llama_type="llama_nonsense"
    )
    assert "llama" in message and "LLaVA" in message


def test_no_meta_json_asks_for_llama_type(tmp_path, checkpoints):
    folder = _copy(checkpoints["accessory"], tmp_path / "acc", skip=("meta.json",))
    expect_user_error("pass --llama_type llama", str(folder))


def test_tiktoken_tokenizer_is_one_clear_sentence(tmp_path, checkpoints):
    folder = _copy(checkpoints["meta"], tmp_path / "meta")
    (folder / "tokenizer.model").write_text("IQ== 0\nIg== 1\nIw== 2\n")
    expect_user_error("tiktoken", str(folder))


def test_bad_dtype_and_quant(checkpoints):
    expect_user_error("Unknown dtype 'fp64'", str(checkpoints["hf"]), dtype="fp64")
    expect_user_error("--quant takes 4 or 8", str(checkpoints["hf"]), quant=3)


def test_quant_on_the_cpu_needs_no_bitsandbytes(checkpoints, no_bitsandbytes):
    """torch's own int4 kernel (model/cpu_linear.py); tests/test_bad_input.py: where bitsandbytes is still needed."""
    model = MetaModel.from_pretrained(str(checkpoints["hf"]), quant=4)
    assert model.engine.summary().cpu_kernels.endswith("int4 weights")


def test_cuda_asked_without_a_gpu(checkpoints):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    expect_user_error("no CUDA GPU is visible; use --device cpu", str(checkpoints["hf"]), device="cuda")


def test_hf_config_without_weights(tmp_path, checkpoints):
    folder = _copy(checkpoints["hf"], tmp_path / "hf", skip=("model.safetensors",))
    expect_user_error("no weights", str(folder))


def test_vision_asked_of_a_text_model(checkpoints):
    expect_user_error("text-only", str(checkpoints["hf"]), with_visual=True)
    expect_user_error("text-only", str(checkpoints["meta"]), with_visual=True)


def test_checkpoint_holding_pickled_objects_is_refused(tmp_path, checkpoints):
    folder = _copy(checkpoints["accessory"], tmp_path / "acc")

    import argparse  # any object that is not a tensor: loading it would mean running pickled code

    torch.save({"model": {"llma.x": argparse.Namespace(a=1)}}, folder / "consolidated.00-of-02.model.pth")
    expect_user_error(
        r"consolidated.00-of-02.model.pth holds pickled Python objects .* \(weights_only=True\)", str(folder)
    )


def test_hf_weights_holding_a_pickled_command_are_refused_without_running_it(tmp_path, byte_llama_dir):
    from safetensors.torch import load_file

    folder = _copy(byte_llama_dir, tmp_path / "hf", skip=("model.safetensors",))
    marker = tmp_path / "code-ran"

    class Command:  # unpickling it would run a shell command
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    torch.save(load_file(byte_llama_dir / "model.safetensors") | {"extra": Command()}, folder / "pytorch_model.bin")
    expect_user_error("pytorch_model.bin holds pickled Python objects", str(folder))
    assert not marker.exists()


PEAK_MEMORY_SCRIPT = """
import sys, threading, time
from local_chat.model.meta import MetaModel
import sentencepiece, transformers  # imported before the baseline: only the weights should count
from transformers import LlamaForCausalLM, LlamaConfig
with __import__("torch").device("meta"):
    LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=64, num_attention_heads=4))

def anon_mib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) / 1024

peak, done = [0.0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anon_mib())
        time.sleep(0.002)

baseline = anon_mib()
sampler = threading.Thread(target=sample)
sampler.start()
model = MetaModel.from_pretrained(sys.argv[1])
done.set()
sampler.join()
weights = sum(p.numel() * p.element_size() for p in model.llma.parameters()) / 2**20
print((peak[0] - baseline) / weights)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc to read memory use")
def test_loading_sharded_checkpoint_peaks_near_one_copy_of_the_weights(tmp_path, sp_model_file):
    import subprocess
    import sys

    model = tiny_models.random_llama(
        400, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8
    )
    folder = tiny_models.save_accessory(model, tmp_path / "acc", tokenizer_model=sp_model_file, shards=2)
    params = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(params | {"multiple_of": 256}))
    del model
    result = subprocess.run(
        [sys.executable, "-c", PEAK_MEMORY_SCRIPT, str(folder)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    peak_over_weights = float(result.stdout.strip().splitlines()[-1])
    assert peak_over_weights < 1.6, f"loading peaked at {peak_over_weights:.2f}x the weights"
