"""A GGUF file through our app beside llama.cpp's own server (`python -m bench.run --only gguf`).

The files are bench/cpu.py's: a random Llama of Qwen2.5-0.5B's shape with a 32,000-piece sentencepiece tokenizer,
converted by llama.cpp's converter to GGUF bf16 and Q8_0. Each is served by llama.cpp's server (xllamacpp, as many
threads as cores) and by our app with `--pretrained_path FILE.gguf` (llama.cpp inside its model process,
engine/llama_cpp.py), one at a time and each twice in turn, and measured through each one's /v1/completions as
bench/cpu.py measures: decode tokens/s, and the time to the first token of a new 32-token prompt (what the app adds:
the prompt tokenized here, the pipe between its two processes, the HTTP hop to llama.cpp; a long prompt's prefill
varies by more).
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from .cpu import app_server, convert, decode_rate, first_token, llama_server, long_prompts, sentencepiece_llama
from .models import SHAPES

KINDS = ("bf16", "q8_0")
SHORT_PROMPT = 32  # tokens of the prompts whose first token is timed: what the app adds, not llama.cpp's prefill
ROUNDS = 2  # each server started this many times, in turn (llama.cpp's, ours, llama.cpp's, ...): a drift of the
# machine's speed falls on both; a 2-core machine's rates vary by about 3% from one start to the next
PROMPTS_PER_REPEAT = 4  # new prompts whose first token is timed, for each of --cpu_repeats (one first token varies
# by tens of ms: the medians of 3 differed by 20 ms from run to run)


def run(settings) -> dict[str, float]:
    if importlib.util.find_spec("xllamacpp") is None:
        print('bench gguf: xllamacpp is not installed (pip install -e ".[gguf]"); skipping', file=sys.stderr)
        return {}
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
        folder = sentencepiece_llama(SHAPES[settings.cpu_shapes[0]], Path(tmp) / "model")
        count = PROMPTS_PER_REPEAT * settings.cpu_repeats
        prompts = long_prompts(folder, replace(settings, cpu_prompt_tokens=SHORT_PROMPT, cpu_repeats=count))
        for kind in KINDS:
            file = convert(folder, kind, Path(tmp) / f"model-{kind}.gguf")
            servers = {"theirs": llama_server, "ours": lambda file: app_server(file, [])}
            rates, firsts = {who: [] for who in servers}, {who: [] for who in servers}
            for _ in range(ROUNDS if settings.cpu_repeats > 1 else 1):
                for who, server in servers.items():
                    with server(file) as url:
                        rates[who].append(decode_rate(url, settings))
                        firsts[who].append(first_token(url, prompts))
            ours, theirs = statistics.median(rates["ours"]), statistics.median(rates["theirs"])
            extra = statistics.median(firsts["ours"]) - statistics.median(firsts["theirs"])
            results[f"gguf_{kind}_over_llamacpp"] = ours / theirs
            results[f"gguf_{kind}_first_token_extra_ms"] = 1000 * extra
            results[f"gguf_{kind}_tok_s"] = ours
            results[f"gguf_llamacpp_{kind}_tok_s"] = theirs
    return results
