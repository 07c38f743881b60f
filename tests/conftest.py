"""Session-wide fixtures: small random models in every checkpoint format (see fixtures/tiny_models.py)."""

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# no test keeps conversations in the real user's data folder (an app's default --history_db is there)
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="test-data-")
# the models' default dtype as on a CPU without native bf16, whatever CPU runs the suite: the tests that compare
# answers token for token compare fp32 ones; tests/test_cpu.py tests the default and the CPU's kernels
os.environ["LOCAL_CHAT_DTYPE"] = "fp32"

import transformers  # noqa: E402

from fixtures import tiny_models  # noqa: E402

pytest_plugins = ["fast_marks"]  # `python -m pytest -m fast`: the tests that start no server, browser or process

transformers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="session")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def sp_model_file(work) -> Path:
    return tiny_models.train_sentencepiece(work / "sp")


@pytest.fixture(scope="session")
def byte_tokenizer():
    return tiny_models.train_byte_level_tokenizer()


@pytest.fixture(scope="session")
def sp_llama(sp_model_file):
    """A random Llama whose vocabulary is the sentencepiece tokenizer's."""
    import sentencepiece

    return tiny_models.random_llama(sentencepiece.SentencePieceProcessor(model_file=str(sp_model_file)).vocab_size())


@pytest.fixture(scope="session")
def checkpoints(work, sp_llama, sp_model_file) -> dict:
    """The same random Llama as a Hugging Face folder, Accessory shards (2) and Meta shards (2)."""
    return {
        "hf": tiny_models.save_hf(sp_llama, work / "hf", tokenizer_model=sp_model_file),
        "accessory": tiny_models.save_accessory(sp_llama, work / "accessory", tokenizer_model=sp_model_file),
        "meta": tiny_models.save_meta(sp_llama, work / "meta", tokenizer_model=sp_model_file),
    }


@pytest.fixture(scope="session")
def byte_llama_dir(work, byte_tokenizer) -> Path:
    """A random Llama with a byte-level BPE tokenizer and a ChatML chat template, as a Hugging Face folder."""
    model = tiny_models.random_llama(len(byte_tokenizer), seed=1)
    return tiny_models.save_hf(model, work / "byte_llama", hf_tokenizer=byte_tokenizer)


@pytest.fixture(scope="session")
def byte_model(byte_llama_dir):
    from local_chat.model.meta import MetaModel

    return MetaModel.from_pretrained(str(byte_llama_dir))


@pytest.fixture(scope="session")
def llava_dir(work) -> Path:
    return tiny_models.save_tiny_llava(work / "llava")


@pytest.fixture
def no_bitsandbytes(monkeypatch):
    """bitsandbytes made impossible to import, as on a machine where it cannot run."""
    import builtins

    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == "bitsandbytes":
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """(a tiny random Qwen3 of the real class with Qwen3's published template, the hook that forces its answers:
    `forced.again(text, model.tokenizer.hf, "<|im_end|>")`)."""
    yield from forced_qwen3(tmp_path_factory.mktemp("qwen3") / "q")


@pytest.fixture(scope="module")
def qwen3_roomy(tmp_path_factory):
    """`qwen3` with room for tools' prompts and web pages (4,096 positions)."""
    config = tiny_models.TEXT_CONFIG | {"head_dim": 16, "max_position_embeddings": 4096}
    yield from forced_qwen3(tmp_path_factory.mktemp("qwen3-roomy") / "q", config)


def forced_qwen3(folder: Path, config: dict | None = None):
    from local_chat.model.meta import MetaModel

    model = MetaModel.from_pretrained(
        str(tiny_models.save_tiny_qwen3(folder, **({"config": config} if config else {})))
    )
    forced = tiny_models.ForcedAnswer(model.llma, model.tokenizer.hf, "x", "<|im_end|>")
    yield model, forced
    forced.remove()
