"""The families of 2025-26 that tests/text_families.py adds to its own (DeepSeek V3.1, whose markers the R1 distills
there share, with the checkpoint's template and llama.cpp's copy of it, GLM-4.5/4.6, GLM-4.7-Flash, Kimi K2, MiniMax
M2, Seed-OSS, Granite 4.0-H, LFM2 dense (LFM2.5-1.2B) and MoE (LFM2.5-8B-A1B) and Nemotron Nano 2) and Qwen2.5, each
a tiny random model of its real class with its published template (tests/chat_templates, SOURCES.md) and its special
tokens, and `Family`'s strings for what a trained one writes."""

from __future__ import annotations

DEEPSEEK = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
]
KIMI = [
    "[BOS]",
    "[EOS]",
    "[PAD]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|media_start|>",
    "<|media_content|>",
    "<|media_pad|>",
    "<|media_end|>",
]
GLM = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
GLM_ADDED = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<tool_response>",
    "</tool_response>",
]
MINIMAX = ["]~!b[", "]~b]", "[e~[", "<pad>"]
MINIMAX_ADDED = ["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"]
SEED = [
    "<seed:bos>",
    "<seed:eos>",
    "<seed:pad>",
    "<seed:think>",
    "</seed:think>",
    "<seed:tool_call>",
    "</seed:tool_call>",
    "<seed:cot_budget_reflect>",
    "</seed:cot_budget_reflect>",
]
GRANITE = ["<|end_of_text|>", "<|pad|>", "<|start_of_role|>", "<|end_of_role|>"]
GRANITE_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
LFM2 = [
    "<|pad|>",
    "<|startoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|tool_list_start|>",
    "<|tool_list_end|>",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<|tool_response_start|>",
    "<|tool_response_end|>",
]
NEMOTRON = ["<s>", "</s>", "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>"]
NEMOTRON_ADDED = ["<think>", "</think>", "<TOOLCALL>", "</TOOLCALL>", "<AVAILABLE_TOOLS>", "</AVAILABLE_TOOLS>"]
THINK = ["<think>", "</think>"]
QWEN_CALL_MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def deepseek_v3_1(tokenizer_of, sizes):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    tokenizer = tokenizer_of(DEEPSEEK, DEEPSEEK[0], DEEPSEEK[1], DEEPSEEK[1], THINK, adds_bos=False)
    return DeepseekV3ForCausalLM(_deepseek_v3(DeepseekV3Config, sizes(tokenizer))), tokenizer, [DEEPSEEK[1]]


def deepseek_v3_1_llamacpp(tokenizer_of, sizes):
    return deepseek_v3_1(tokenizer_of, sizes)  # the same checkpoint, with llama.cpp's copy of its template


def kimi_k2(tokenizer_of, sizes):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    tokenizer = tokenizer_of(KIMI, "[BOS]", "<|im_end|>", "[PAD]")
    return DeepseekV3ForCausalLM(_deepseek_v3(DeepseekV3Config, sizes(tokenizer))), tokenizer, ["<|im_end|>", "[EOS]"]


def glm4_moe(tokenizer_of, sizes):
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    tokenizer = tokenizer_of(GLM, "[gMASK]", "<|endoftext|>", "<|endoftext|>", GLM_ADDED)
    config = Glm4MoeConfig(
        **sizes(tokenizer), moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1
    )
    return Glm4MoeForCausalLM(config), tokenizer, ["<|endoftext|>", "<|user|>", "<|observation|>"]


def glm4_moe_lite(tokenizer_of, sizes):
    from transformers import Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM

    tokenizer = tokenizer_of(GLM, "[gMASK]", "<|endoftext|>", "<|endoftext|>", GLM_ADDED)
    return (
        Glm4MoeLiteForCausalLM(_mla(Glm4MoeLiteConfig, sizes(tokenizer))),
        tokenizer,
        ["<|endoftext|>", "<|user|>", "<|observation|>"],
    )


def minimax_m2(tokenizer_of, sizes):
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

    tokenizer = tokenizer_of(MINIMAX, "]~!b[", "[e~[", "<pad>", MINIMAX_ADDED)
    config = MiniMaxM2Config(**sizes(tokenizer, intermediate_size=32), num_local_experts=4, num_experts_per_tok=2)
    # as the checkpoints' config.json has them (vLLM reads them)
    config.rotary_dim, config.scoring_func, config.use_routing_bias = config.head_dim, "sigmoid", True
    return MiniMaxM2ForCausalLM(config), tokenizer, ["[e~["]


def seed_oss(tokenizer_of, sizes):
    from transformers import SeedOssConfig, SeedOssForCausalLM

    tokenizer = tokenizer_of(SEED, "<seed:bos>", "<seed:eos>", "<seed:pad>", adds_bos=False)
    return SeedOssForCausalLM(SeedOssConfig(**sizes(tokenizer))), tokenizer, ["<seed:eos>"]


def granite4(tokenizer_of, sizes):
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    tokenizer = tokenizer_of(GRANITE, "<|end_of_text|>", "<|end_of_text|>", "<|pad|>", GRANITE_ADDED, adds_bos=False)
    config = GraniteMoeHybridConfig(
        **sizes(tokenizer, intermediate_size=32, num_hidden_layers=2),
        layer_types=["mamba", "attention"],
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=64,
        mamba_n_heads=4,
        mamba_d_head=32,
        mamba_d_state=16,
        mamba_chunk_size=16,
        position_embedding_type="rope",
    )
    return GraniteMoeHybridForCausalLM(config), tokenizer, ["<|end_of_text|>"]


def lfm2_moe(tokenizer_of, sizes):
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM

    tokenizer = tokenizer_of(LFM2, "<|startoftext|>", "<|im_end|>", "<|pad|>", THINK, adds_bos=False)
    config = Lfm2MoeConfig(
        **sizes(tokenizer, num_hidden_layers=3),
        layer_types=["conv", "full_attention", "conv"],
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        num_dense_layers=1,
    )
    return Lfm2MoeForCausalLM(config), tokenizer, ["<|im_end|>"]


def lfm2(tokenizer_of, sizes):
    from transformers import Lfm2Config, Lfm2ForCausalLM

    tokenizer = tokenizer_of(LFM2, "<|startoftext|>", "<|im_end|>", "<|pad|>", THINK, adds_bos=False)
    config = Lfm2Config(**sizes(tokenizer, num_hidden_layers=3), layer_types=["conv", "full_attention", "conv"])
    return Lfm2ForCausalLM(config), tokenizer, ["<|im_end|>"]


def nemotron_h(tokenizer_of, sizes):
    from transformers import NemotronHConfig, NemotronHForCausalLM

    tokenizer = tokenizer_of(NEMOTRON, "<s>", "<SPECIAL_12>", "</s>", NEMOTRON_ADDED, adds_bos=False)
    config = NemotronHConfig(
        **sizes(tokenizer),
        layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"],
        mamba_num_heads=4,
        mamba_head_dim=32,
        ssm_state_size=16,
        n_groups=1,
        chunk_size=16,
    )
    return NemotronHForCausalLM(config), tokenizer, ["<SPECIAL_12>", "</s>"]


def qwen2_5(tokenizer_of, sizes):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.families import QWEN_SPECIAL

    # Qwen2.5's tokenizer has Qwen's call markers but no <think>
    tokenizer = tokenizer_of(QWEN_SPECIAL, "<|im_start|>", "<|im_end|>", "<|endoftext|>", QWEN_CALL_MARKERS)
    config = Qwen2Config(**{k: v for k, v in sizes(tokenizer).items() if k != "head_dim"})
    return Qwen2ForCausalLM(config), tokenizer, ["<|im_end|>", "<|endoftext|>"]


def _deepseek_v3(config_class, sizes: dict):
    """DeepSeek V3's config (Kimi K2's too), with the routing its checkpoints' config.json names (vLLM reads it)."""
    config = _mla(config_class, sizes)
    config.topk_method, config.scoring_func = "noaux_tc", "sigmoid"
    return config


def _mla(config_class, sizes: dict):
    """A multi-head latent attention model's config (DeepSeek V3's, GLM-4.7-Flash's) at the tiny sizes, its query
    and key heads `head_dim` wide (half of it rotary)."""
    head = sizes.get("head_dim", 16)
    wide = head >= 64  # as vLLM takes it: its latent 512 wide, its rotary part 64 (576 in all)
    sizes = {k: v for k, v in sizes.items() if k != "head_dim"}
    return config_class(
        **sizes | dict(num_key_value_heads=sizes["num_attention_heads"], intermediate_size=64),  # no grouped heads
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=512 if wide else 16,
        q_lora_rank=32,
        qk_rope_head_dim=64 if wide else head // 2,
        qk_nope_head_dim=64 if wide else head // 2,
        v_head_dim=head,
    )
