"""Tiny random vision-language models of the popular families, each of its real transformers class, saved with
its real processor class, its family's special tokens and its published chat template (tests/chat_templates/,
sources in tests/chat_templates/SOURCES.md), as a Hugging Face folder that `MetaModel.from_pretrained` loads.

Hidden sizes are at most 64 and the language models have 2 layers; images are small (32-64 pixels a side) so
that a test runs in seconds. The tokenizer is a byte-level BPE trained on a few sentences with the family's
special tokens added (the real vocabularies are far too large to ship).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path

import torch
from tiny_models import CORPUS, TEXT_CONFIG

from local_chat.model.processors import broken_torchvision, images_only, pixtral_processor_class

TEMPLATES = Path(__file__).resolve().parent / "chat_templates"
FAMILIES = (
    "llava",
    "llava_next",
    "qwen2_vl",
    "qwen2_5_vl",
    "glm4v",
    "idefics3",
    "gemma3",
    "gemma4",
    "mistral3",
    "mllama",
    "paligemma",
)


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def family_tokenizer(
    specials: list[str],
    bos: str,
    eos: str,
    pad: str,
    adds_bos: bool = True,
    extra_special_tokens: dict | None = None,
    vocab_size: int = 400,
):
    """A byte-level BPE `PreTrainedTokenizerFast` whose special tokens are the family's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    named = list(dict.fromkeys([pad, bos, eos, "<unk>"]))
    others = [s for s in specials if s not in named]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=named + others, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        unk_token="<unk>",
        pad_token=pad,
        additional_special_tokens=others,
        extra_special_tokens=extra_special_tokens or {},
    )


def text_config(tokenizer, **overrides) -> dict:
    """A 2-layer language model 64 wide, with the tokenizer's vocabulary and special ids (`overrides` win)."""
    return (
        dict(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        | overrides
    )


def _sharpen(model) -> None:
    """Larger output logits than the default init, so that greedy answers vary from token to token and the image
    changes them; matrices some families initialize to zeros (Gemma 3's image projection) drawn at random."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20)
        for name, weight in model.named_parameters():
            if (weight.dim() >= 2 or "gate" in name) and not weight.any():  # and Mllama's cross-attention gates
                weight.normal_(std=0.5)


def _save(model, processor, folder: Path, template_in: str | None, chat_template: str | None) -> Path:
    """Save the model and processor with the chat template where the family publishes it: "processor"
    (chat_template.jinja, beside the processor), "tokenizer" (tokenizer_config.json), "legacy_json"
    (chat_template.json, the older processor layout) or None (no template)."""
    folder.mkdir(parents=True, exist_ok=True)
    if template_in == "tokenizer":
        processor.tokenizer.chat_template = chat_template
    elif template_in in ("processor", "legacy_json"):
        processor.chat_template = chat_template
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    if (
        "video_processor" not in processor.get_attributes()
        and "video_processor" in inspect.signature(type(processor).__init__).parameters
    ):  # built without torchvision: the checkpoint describes it all the same
        describe_video_processor(folder)
    if template_in == "legacy_json":
        (folder / "chat_template.jinja").unlink()
        (folder / "chat_template.json").write_text(json.dumps({"chat_template": chat_template}))
    return folder


def build(name: str, folder: Path, seed: int = 0, template_in: str | None = None) -> Path:
    """The tiny `name` model (one of FAMILIES) saved in `folder`; `template_in` moves its chat template (see
    `_save`), default: where the family publishes it."""
    torch.manual_seed(seed)
    model, processor, chat_template, published_in = BUILDERS[name]()
    model.eval()
    _sharpen(model)
    return _save(model, processor, folder, template_in or published_in, chat_template)


def _llava():
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = family_tokenizer(["<image>"], "<s>", "</s>", "<pad>")
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=LlamaConfig(**text_config(tok, **TEXT_CONFIG)),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    processor = LlavaProcessor(
        CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        tok,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    return LlavaForConditionalGeneration(config), processor, template("llava"), "tokenizer"


def _llava_next():
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    tok = family_tokenizer(["<image>"], "<s>", "</s>", "<pad>")
    pinpoints = [[32, 64], [64, 32], [64, 64]]
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    config = LlavaNextConfig(
        vision_config=vision,
        text_config=LlamaConfig(**text_config(tok, **TEXT_CONFIG)),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        image_grid_pinpoints=pinpoints,
    )
    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, image_grid_pinpoints=pinpoints
    )
    processor = LlavaNextProcessor(
        image_processor, tok, patch_size=8, vision_feature_select_strategy="default", num_additional_image_tokens=1
    )
    return LlavaNextForConditionalGeneration(config), processor, template("llava"), "processor"


def _qwen_tokenizer():
    return family_tokenizer(
        ["<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
        "<|endoftext|>",
        "<|im_end|>",
        "<|endoftext|>",
        adds_bos=False,
    )


# the vision tower of the tiny Qwen2.5-VL and Qwen3-VL
QWEN_VISION = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    out_hidden_size=64,
    spatial_merge_size=2,
    temporal_patch_size=2,
)


def _qwen_vl(version: str, tok=None, vision_depth: int = 2):
    """`tok`: the tokenizer (default: `_qwen_tokenizer`'s); `vision_depth`: the vision tower's blocks (llama.cpp's
    converter names the merger's layers by block, so it needs at least 3)."""
    import transformers as tf

    tok = tok or _qwen_tokenizer()
    ids = {
        k: tok.convert_tokens_to_ids(t)
        for k, t in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }
    text = text_config(tok, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    if version == "2":
        vision = dict(
            depth=vision_depth,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_chans=3,
        )
        config = tf.Qwen2VLConfig(text_config=text, vision_config=vision, **ids)
        model = tf.Qwen2VLForConditionalGeneration(config)
        processor_class, image_class = tf.Qwen2VLProcessor, tf.Qwen2VLImageProcessor
    else:
        vision = QWEN_VISION | dict(patch_size=14, in_channels=3, window_size=56, fullatt_block_indexes=[1])
        config = tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
        model = tf.Qwen2_5_VLForConditionalGeneration(config)
        processor_class, image_class = tf.Qwen2_5_VLProcessor, tf.Qwen2VLImageProcessor
    sizes = dict(min_pixels=28 * 28, max_pixels=56 * 56 * 4, patch_size=14, merge_size=2, temporal_patch_size=2)
    if torchvision_loads():
        processor = processor_class(
            image_processor=image_class(**sizes), tokenizer=tok, video_processor=tf.Qwen2VLVideoProcessor(**sizes)
        )
    else:  # its video processor cannot be built without torchvision: saved less it, then described (`_save`)
        processor = images_only(processor_class)(image_processor=tf.Qwen2VLImageProcessorPil(**sizes), tokenizer=tok)
    return model, processor, template("qwen2_vl"), "processor"


def _qwen3_vl():
    """Qwen3-VL (Instruct): Qwen3's markers and tool calls, with its vision tokens."""
    import transformers as tf

    from bench.families import qwen_tokenizer

    vision_tokens = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    tok = qwen_tokenizer(template("qwen3_vl"), specials=vision_tokens)
    ids = dict(
        zip(
            ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"),
            map(tok.convert_tokens_to_ids, vision_tokens),
        )
    )
    text = text_config(tok, head_dim=16, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]})
    vision = QWEN_VISION | dict(patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[1])
    model = tf.Qwen3VLForConditionalGeneration(tf.Qwen3VLConfig(text_config=text, vision_config=vision, **ids))
    sizes = dict(patch_size=16, merge_size=2, temporal_patch_size=2)
    sizes["size"] = {"shortest_edge": 32 * 32, "longest_edge": 64 * 64 * 4}
    processor = images_only(tf.Qwen3VLProcessor)(image_processor=tf.Qwen2VLImageProcessorPil(**sizes), tokenizer=tok)
    return model, processor, template("qwen3_vl"), "processor"


def _glm4v():
    """GLM-4.1V-Thinking: GLM's role tokens, its image between <|begin_of_image|> and <|end_of_image|>, answers
    `<think>...</think><answer>...</answer>`."""
    import transformers as tf
    from tokenizers import AddedToken

    roles = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
    vision_tokens = ["<|begin_of_image|>", "<|end_of_image|>", "<|image|>"]
    video_tokens = ["<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]
    tok = family_tokenizer(roles + vision_tokens + video_tokens, "[gMASK]", "<|endoftext|>", "<|endoftext|>", False)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in GLM_V_ADDED])
    ids = {
        key: tok.convert_tokens_to_ids(token)
        for key, token in zip(("image_start_token_id", "image_end_token_id", "image_token_id"), vision_tokens)
    } | {
        key: tok.convert_tokens_to_ids(token)
        for key, token in zip(("video_start_token_id", "video_end_token_id", "video_token_id"), video_tokens)
    }
    text = text_config(tok, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]})
    text["eos_token_id"] = [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, image_size=28)
    model = tf.Glm4vForConditionalGeneration(tf.Glm4vConfig(text_config=text, vision_config=vision, **ids))
    sizes = dict(patch_size=14, merge_size=2, temporal_patch_size=2)
    sizes["size"] = {"shortest_edge": 28 * 28, "longest_edge": 56 * 56 * 4}
    processor = images_only(tf.Glm4vProcessor)(image_processor=tf.Glm4vImageProcessorPil(**sizes), tokenizer=tok)
    return model, processor, template("glm4v"), "processor"


GLM_V_ADDED = ["<think>", "</think>", "<answer>", "</answer>"]


def _idefics3():
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        LlamaConfig,
    )

    rows = [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
    tok = family_tokenizer(
        ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *rows],
        "<|begin_of_text|>",
        "<end_of_utterance>",
        "<|finetune_right_pad_id|>",
    )
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    config = Idefics3Config(
        vision_config=vision,
        text_config=LlamaConfig(**text_config(tok, **TEXT_CONFIG)).to_dict(),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        scale_factor=2,
    )
    image_processor = Idefics3ImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(image_processor, tok, image_seq_len=4)  # (32 / 8 / 2) ** 2
    return Idefics3ForConditionalGeneration(config), processor, template("idefics3"), "processor"


def _gemma3():
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    tok = family_tokenizer(
        ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"],
        "<bos>",
        "<eos>",
        "<pad>",
        extra_special_tokens={
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        },
    )
    text = Gemma3TextConfig(**text_config(tok, head_dim=16, sliding_window=64))
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"),
        boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
    )
    image_processor = Gemma3ImageProcessor(size={"height": 32, "width": 32})
    processor = Gemma3Processor(image_processor, tok, image_seq_length=4)
    return Gemma3ForConditionalGeneration(config), processor, template("gemma3"), "processor"


def _mllama():
    from transformers import (
        MllamaConfig,
        MllamaForConditionalGeneration,
        MllamaImageProcessor,
        MllamaProcessor,
        MllamaTextConfig,
        MllamaVisionConfig,
    )

    tok = family_tokenizer(
        ["<|image|>", "<|python_tag|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|finetune_right_pad_id|>",
    )
    vision = MllamaVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_global_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        max_num_tiles=4,
        intermediate_layers_indices=[0],
        vision_output_dim=64,
    )
    text = MllamaTextConfig(**text_config(tok, cross_attention_layers=[1]))
    config = MllamaConfig(
        vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids("<|image|>")
    )
    image_processor = MllamaImageProcessor(size={"height": 32, "width": 32}, max_image_tiles=4)
    processor = MllamaProcessor(image_processor, tok)
    return MllamaForConditionalGeneration(config), processor, template("mllama"), "processor"


def _paligemma():
    from transformers import (
        GemmaConfig,
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    tok = family_tokenizer(["<image>"], "<bos>", "<eos>", "<pad>", extra_special_tokens={"image_token": "<image>"})
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        projection_dim=64,
    )
    text = GemmaConfig(**text_config(tok, head_dim=16))
    config = PaliGemmaConfig(
        vision_config=vision,
        text_config=text,
        projection_dim=64,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
    )
    image_processor = SiglipImageProcessor(size={"height": 32, "width": 32})
    image_processor.image_seq_length = 16
    processor = PaliGemmaProcessor(image_processor, tok)
    return PaliGemmaForConditionalGeneration(config), processor, None, None


def torchvision_loads() -> bool:
    """Whether torchvision is installed and imports (PyPI's wheel beside the CPU build of torch does not:
    "operator torchvision::nms does not exist")."""
    return importlib.util.find_spec("torchvision") is not None and broken_torchvision() is None


def describe_video_processor(folder: Path) -> None:
    """Qwen2-VL's video processor in processor_config.json, as transformers saves it with torchvision."""
    config_file = folder / "processor_config.json"
    config = json.loads(config_file.read_text())
    config["video_processor"] = {
        "video_processor_type": "Qwen2VLVideoProcessor",
        "min_pixels": 28 * 28,
        "max_pixels": 56 * 56 * 4,
        "patch_size": 14,
        "merge_size": 2,
        "temporal_patch_size": 2,
    }
    config_file.write_text(json.dumps(config, indent=2))


def save_llama4_files(folder: Path) -> Path:
    """A tiny Llama 4 folder with its processor's files as its checkpoints publish them: its image processor has a
    torchvision backend only, so without torchvision it can be described but not built."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    tok = family_tokenizer(
        ["<|image|>", "<|patch|>", "<|image_start|>", "<|image_end|>", "<|eot|>"],
        "<|begin_of_text|>",
        "<|eot|>",
        "<|finetune_right_pad|>",
    )
    text = text_config(tok, intermediate_size_mlp=128, head_dim=16, num_local_experts=2)
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        vision_output_dim=64,
        projector_input_dim=64,
        projector_output_dim=64,
    )
    Llama4ForConditionalGeneration(Llama4Config(text_config=text, vision_config=vision)).save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "processor_config.json").write_text(
        json.dumps(
            {
                "processor_class": "Llama4Processor",
                "image_processor": {"image_processor_type": "Llama4ImageProcessor", "max_patches": 16},
            }
        )
    )
    return folder


def _gemma4():
    """Gemma 4 (vision): its soft image tokens between <|image> and <image|>, a variable number per image; its
    processor also takes audio and video (the video part built only where torchvision loads)."""
    import transformers as tf
    from text_families import GEMMA4

    named = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>"}
    named |= {"audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
    specials = [*GEMMA4, "<|image>", "<image|>", "<|audio|>", "<|audio>", "<audio|>", "<|video|>"]
    tok = family_tokenizer(specials, "<bos>", "<eos>", "<pad>", adds_bos=False, extra_special_tokens=named)
    ids = {f"{k}_id": tok.convert_tokens_to_ids(t) for k, t in (("image_token", "<|image|>"), ("boi_token", "<|image>"),
           ("eoi_token", "<image|>"), ("video_token", "<|video|>"), ("audio_token", "<|audio|>"),
           ("boa_token", "<|audio>"))} | {"eoa_token_index": tok.convert_tokens_to_ids("<audio|>")}  # fmt: skip
    text = text_config(tok, head_dim=16, global_head_dim=32, sliding_window=64, max_position_embeddings=4096)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    vision |= dict(num_key_value_heads=2, head_dim=16, patch_size=8, pooling_kernel_size=2, position_embedding_size=256)
    config = tf.Gemma4Config(text_config=text, vision_config=vision, audio_config=None, **ids)
    image_processor = tf.Gemma4ImageProcessorPil(patch_size=8, max_soft_tokens=70, pooling_kernel_size=2)
    parts = dict(feature_extractor=tf.Gemma4AudioFeatureExtractor(), image_processor=image_processor, tokenizer=tok)
    processor_class = tf.Gemma4Processor if torchvision_loads() else images_only(tf.Gemma4Processor)
    if torchvision_loads():
        parts["video_processor"] = tf.Gemma4VideoProcessor()
    processor = processor_class(**parts, image_seq_length=70)
    return tf.Gemma4ForConditionalGeneration(config), processor, template("gemma4"), "processor"


def _mistral3():
    """Ministral 3 (Mistral3ForConditionalGeneration: a Pixtral vision tower, Ministral 3's reasoning template):
    [IMG] tokens row by row, [IMG_BREAK] between rows, [IMG_END] last."""
    import transformers as tf
    from text_families import MISTRAL

    tok = family_tokenizer([*MISTRAL, "[IMG_BREAK]", "[IMG_END]"], "<s>", "</s>", "<pad>", adds_bos=False)
    text = text_config(tok, model_type="ministral3", head_dim=16, max_position_embeddings=4096)
    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    vision |= dict(num_attention_heads=2, head_dim=16, patch_size=8, image_size=64)
    image_id = tok.convert_tokens_to_ids("[IMG]")
    config = tf.Mistral3Config(text_config=text, vision_config=vision, image_token_index=image_id, spatial_merge_size=2)
    image_processor = tf.PixtralImageProcessorPil(size={"longest_edge": 64}, patch_size=8)
    processor = pixtral_processor_class()(
        image_processor=image_processor, tokenizer=tok, patch_size=8, spatial_merge_size=2
    )
    return tf.Mistral3ForConditionalGeneration(config), processor, template("ministral3"), "tokenizer"


BUILDERS = {
    "llava": _llava,
    "llava_next": _llava_next,
    "qwen2_vl": lambda: _qwen_vl("2"),
    "qwen2_5_vl": lambda: _qwen_vl("2.5"),
    "qwen3_vl": _qwen3_vl,
    "glm4v": _glm4v,
    "gemma4": _gemma4,
    "mistral3": _mistral3,
    "idefics3": _idefics3,
    "gemma3": _gemma3,
    "mllama": _mllama,
    "paligemma": _paligemma,
}
