"""The 2026 text families as tiny random models of their real classes, each with its published chat template (kept in
tests/chat_templates, sources in SOURCES.md) and its special tokens, saved as a Hugging Face folder: gpt-oss, Gemma 4
(text class), SmolLM3, Ministral 3, a DeepSeek-R1 distill (Qwen2), Llama 3.1 and Qwen3.5 (hybrid linear attention),
and those of tests/more_families.py. `build(..., flipped=True)` makes the same model with its markers' kinds swapped
(the special ones plain added tokens, the plain ones special), as uploads and conversions of one model differ.
`FAMILIES[name]` says how each writes a reasoning and answer, and a call (`Family`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import more_families as more
import torch
from vlm_families import family_tokenizer, template

from bench.families import QWEN_ADDED, QWEN_SPECIAL, TEXT_CONFIG

HARMONY = [
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
]
GEMMA4 = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<|turn>",
    "<turn|>",
    "<|channel>",
    "<channel|>",
    "<|think|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|image|>",
]
MISTRAL = [
    "<pad>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[THINK]",
    "[/THINK]",
    "[IMG]",
]
LLAMA3 = [
    "<|finetune_right_pad_id|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]
CHATML = QWEN_SPECIAL


@dataclass(frozen=True)
class Family:
    """How a family writes: `think(reasoning, answer)` and `call(name, arguments JSON)` as its model would, each
    ending with the token that ends the answer (`end`, else the call's own)."""

    name: str
    end: str
    thought: str  # "{r}" the reasoning, "{a}" the answer
    called: str | None  # "{n}" the function, "{j}" its arguments as JSON; None: the family has no calls we parse
    specials: tuple[str, ...]
    thinking: dict | None = None  # chat_template_kwargs that turn its reasoning on, where it is off by default
    call_end: str | None = None  # the token that ends a call, where it is not `end`
    off: dict | str = dataclasses.field(default_factory=lambda: {"enable_thinking": False})  # its template's own
    # switch turned off: its variables, or the flag its system prompt ends with
    arguments_as_text: bool = False  # its template joins a call's arguments to its text (JSON), as OpenAI sends them
    calls_in_text: bool = False  # its template renders no calls back: a call goes back as the text the model wrote

    def think(self, reasoning: str, answer: str) -> str:
        return self.thought.replace("{r}", reasoning).replace("{a}", answer)

    def call(self, name: str, arguments: str) -> str:
        return self.called.replace("{n}", name).replace("{j}", arguments)


FAMILIES = {
    "gpt_oss": Family(
        "gpt_oss",
        "<|return|>",
        "<|channel|>analysis<|message|>{r}<|end|><|start|>assistant<|channel|>final<|message|>{a}",
        "<|channel|>analysis<|message|>I call it.<|end|><|start|>assistant to=functions.{n}<|channel|>commentary json"
        "<|message|>{j}<|call|>",
        tuple(HARMONY),
        off={"reasoning_effort": "none"},
    ),
    "gemma4_text": Family(
        "gemma4_text",
        "<turn|>",
        "<|channel>thought\n{r}<channel|>{a}",
        "<|tool_call>call:{n}{j}<tool_call|>",
        tuple(GEMMA4),
    ),
    "smollm3": Family(
        "smollm3",
        "<|im_end|>",
        "<think>\n{r}\n</think>\n{a}",
        '<think>\nI call it.\n</think>\n<tool_call>\n{"name": "{n}", "arguments": {j}}\n</tool_call>',
        tuple(CHATML + QWEN_ADDED),
    ),
    "ministral3": Family("ministral3", "</s>", "[THINK]{r}[/THINK]{a}", "[TOOL_CALLS]{n}[ARGS]{j}", tuple(MISTRAL)),
    "r1_distill_qwen": Family(
        "r1_distill_qwen",
        "<｜end▁of▁sentence｜>",
        "{r}\n</think>\n\n{a}",
        None,
        tuple(more.DEEPSEEK + more.THINK),
    ),
    "llama3_1": Family("llama3_1", "<|eot_id|>", "{a}", '{"name": "{n}", "parameters": {j}}', tuple(LLAMA3)),
    "qwen3_5": Family(
        "qwen3_5",
        "<|im_end|>",
        "{r}\n</think>\n\n{a}",
        "I call it.\n</think>\n\n<tool_call>\n<function={n}>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
        "</tool_call>",
        tuple(CHATML + QWEN_ADDED),
    ),
    "deepseek_v3_1": Family(
        "deepseek_v3_1",
        "<｜end▁of▁sentence｜>",
        "{r}</think>{a}",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{j}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        tuple(more.DEEPSEEK + more.THINK),
        thinking={"thinking": True},
        off={"thinking": False},
        arguments_as_text=True,
    ),
    "kimi_k2": Family(
        "kimi_k2",
        "<|im_end|>",
        "{a}",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.{n}:0<|tool_call_argument_begin|>{j}"
        "<|tool_call_end|><|tool_calls_section_end|>",
        tuple(more.KIMI),
    ),
    "glm4_moe": Family(
        "glm4_moe",
        "<|user|>",
        "\n<think>{r}</think>\n{a}",
        "\n<think>I call it.</think>\n<tool_call>{n}\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "</tool_call>",
        tuple(more.GLM + more.GLM_ADDED),
        call_end="<|observation|>",
    ),
    "glm4_moe_lite": Family(
        "glm4_moe_lite",
        "<|user|>",
        "{r}</think>{a}",
        "I call it.</think><tool_call>{n}<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
        tuple(more.GLM + more.GLM_ADDED),
        call_end="<|observation|>",
    ),
    "minimax_m2": Family(
        "minimax_m2",
        "[e~[",
        "{r}\n</think>\n\n{a}",
        'I call it.\n</think>\n\n<minimax:tool_call>\n<invoke name="{n}">\n<parameter name="city">Paris</parameter>\n'
        "</invoke>\n</minimax:tool_call>",
        tuple(more.MINIMAX + more.MINIMAX_ADDED),
    ),
    "seed_oss": Family(
        "seed_oss",
        "<seed:eos>",
        "<seed:think>{r}</seed:think>{a}",
        "<seed:think>I call it.</seed:think>\n<seed:tool_call>\n<function={n}>\n<parameter=city>Paris</parameter>\n"
        "</function>\n</seed:tool_call>",
        tuple(more.SEED),
        off={"thinking_budget": 0},
    ),
    "granite4": Family(
        "granite4",
        "<|end_of_text|>",
        "{a}",
        '<tool_call>\n{"name": "{n}", "arguments": {j}}\n</tool_call>',
        tuple(more.GRANITE + more.GRANITE_ADDED),
    ),
    "lfm2_moe": Family(
        "lfm2_moe",
        "<|im_end|>",
        "<think>{r}</think>{a}",
        '<|tool_call_start|>[{n}(city="Paris")]<|tool_call_end|>',
        tuple(more.LFM2 + more.THINK),
    ),
    "lfm2": Family(
        "lfm2",
        "<|im_end|>",
        "<think>{r}</think>{a}",
        '<|tool_call_start|>[{n}(city="Paris")]<|tool_call_end|>',
        tuple(more.LFM2 + more.THINK),
        calls_in_text=True,
    ),
    "nemotron_h": Family(
        "nemotron_h",
        "<SPECIAL_12>",
        "{r}\n</think>\n\n{a}\n",
        'I call it.\n</think>\n\n<TOOLCALL>[{"name": "{n}", "arguments": {j}}]</TOOLCALL>\n',
        tuple(more.NEMOTRON + more.NEMOTRON_ADDED),
        off="/no_think",
    ),
    "qwen2_5": Family(
        "qwen2_5",
        "<|im_end|>",
        "{a}",
        '<tool_call>\n{"name": "{n}", "arguments": {j}}\n</tool_call>',
        tuple(CHATML + more.QWEN_CALL_MARKERS),
    ),
}
FAMILIES["deepseek_v3_1_llamacpp"] = dataclasses.replace(
    FAMILIES["deepseek_v3_1"], name="deepseek_v3_1_llamacpp", arguments_as_text=False
)
OLDER = ("gpt_oss", "gemma4_text", "smollm3", "ministral3", "r1_distill_qwen", "llama3_1", "qwen3_5")


def build(name: str, folder: Path, seed: int = 0, flipped: bool = False, **sizes) -> Path:
    """The tiny `name` model (one of FAMILIES) with its published template, saved in `folder`; `flipped`: its
    markers' kinds swapped (see the module); `sizes` (such as head_dim) change those of tests/more_families.py's
    families."""
    torch.manual_seed(seed)
    tokenizer_of = functools.partial(_tokenizer, flipped=flipped)
    if name in OLDER:
        model, tokenizer, ends = _BUILDERS[name](tokenizer_of)
    else:
        model, tokenizer, ends = getattr(more, name)(tokenizer_of, lambda tok, **own: _sizes(tok, **(sizes | own)))
    tokenizer.chat_template = template("gemma4" if name == "gemma4_text" else name)
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    from transformers import GenerationConfig

    ids = [tokenizer.convert_tokens_to_ids(t) for t in ends]
    GenerationConfig(eos_token_id=ids, pad_token_id=tokenizer.pad_token_id).save_pretrained(folder)
    return folder


def _sizes(tokenizer, **overrides) -> dict:
    return (
        TEXT_CONFIG
        | dict(
            vocab_size=len(tokenizer),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            tie_word_embeddings=False,
            head_dim=16,
            max_position_embeddings=4096,  # SmolLM3's default system prompt alone is 900 tokens here
        )
        | overrides
    )


def _tokenizer(specials, bos, eos, pad, added=(), adds_bos=False, flipped=False):
    """The family's tokenizer: `specials` special, `added` plain added tokens (`flipped`: the other way round, but for
    the beginning, end and padding tokens)."""
    from tokenizers import AddedToken

    if flipped:
        named = (bos, eos, pad)
        specials, added = [*named, *added], [s for s in specials if s not in named]
    tokenizer = family_tokenizer(list(specials), bos, eos, pad, adds_bos=adds_bos)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tokenizer


def _gpt_oss(tokenizer_of):
    from transformers import GptOssConfig, GptOssForCausalLM

    tokenizer = tokenizer_of(HARMONY, "<|startoftext|>", "<|return|>", "<|endoftext|>")
    config = GptOssConfig(
        **_sizes(tokenizer, intermediate_size=64), num_local_experts=4, num_experts_per_tok=2, sliding_window=64
    )
    return GptOssForCausalLM(config), tokenizer, ["<|return|>", "<|call|>", "<|endoftext|>"]


def _gemma4_text(tokenizer_of):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    tokenizer = tokenizer_of(GEMMA4, "<bos>", "<eos>", "<pad>")
    # its full-attention layers wider than its sliding ones, as Gemma 4's are
    config = Gemma4TextConfig(**_sizes(tokenizer, sliding_window=64, global_head_dim=32))
    return Gemma4ForCausalLM(config), tokenizer, ["<eos>", "<turn|>"]


def _smollm3(tokenizer_of):
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    tokenizer = tokenizer_of(CHATML, "<|im_start|>", "<|im_end|>", "<|endoftext|>", QWEN_ADDED)
    return SmolLM3ForCausalLM(SmolLM3Config(**_sizes(tokenizer))), tokenizer, ["<|im_end|>", "<|endoftext|>"]


def _ministral3(tokenizer_of):
    from transformers import Ministral3Config, Ministral3ForCausalLM

    tokenizer = tokenizer_of(MISTRAL, "<s>", "</s>", "<pad>")
    return Ministral3ForCausalLM(Ministral3Config(**_sizes(tokenizer))), tokenizer, ["</s>"]


def _r1_distill_qwen(tokenizer_of):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    deepseek = more.DEEPSEEK
    tokenizer = tokenizer_of(deepseek, deepseek[0], deepseek[1], deepseek[1], more.THINK)
    config = Qwen2Config(**{k: v for k, v in _sizes(tokenizer).items() if k != "head_dim"})
    return Qwen2ForCausalLM(config), tokenizer, [deepseek[1]]


def _llama3_1(tokenizer_of):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer_of(LLAMA3, "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>")
    return (
        LlamaForCausalLM(LlamaConfig(**_sizes(tokenizer))),
        tokenizer,
        ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"],
    )


def _qwen3_5(tokenizer_of):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tokenizer = tokenizer_of(CHATML, "<|im_start|>", "<|im_end|>", "<|endoftext|>", QWEN_ADDED)
    config = Qwen3_5TextConfig(
        **_sizes(tokenizer, num_hidden_layers=4),
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
    )
    return Qwen3_5ForCausalLM(config), tokenizer, ["<|im_end|>", "<|endoftext|>"]


_BUILDERS = {
    "gpt_oss": _gpt_oss,
    "gemma4_text": _gemma4_text,
    "smollm3": _smollm3,
    "ministral3": _ministral3,
    "r1_distill_qwen": _r1_distill_qwen,
    "llama3_1": _llama3_1,
    "qwen3_5": _qwen3_5,
}
