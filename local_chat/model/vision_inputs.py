"""A vision model's (or a model that hears) inputs, made by its own processor: where the image and audio tokens go,
how many, at what resolution.

The chat template (rendered by the processor, see `conversation.ChatTemplateConversation`) puts each image's
marker in the turn it belongs to; the processor expands the markers into the family's image tokens and makes the
pixel inputs (tiles, dynamic resolution). What comes out is split by what each step of generation needs:

- per-token inputs, aligned with the prompt's tokens (Gemma 3's and PaliGemma's `token_type_ids`, Mllama's
  `cross_attention_mask`, Qwen2-VL's `mm_token_type_ids`): the prefill takes the rows of the tokens it runs, and
  Mllama's decode steps repeat its last row;
- image and sound inputs (pixel values, image sizes, grids, tiles; a clip's audio features and their mask): the
  prefill takes them only while image or audio tokens are among the tokens it runs (a session's cache may hold them
  already);
- Qwen2-VL's (and Qwen2.5-Omni's) 3-D rotary positions, computed here from the whole prompt for every request
  (transformers keeps them on the model, shared by every conversation), and their offset for the decode steps.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from local_chat.errors import UserError
from local_chat.voice.clips import Clip, resampled

TRAINING_ONLY = ("labels",)  # processor outputs that only training uses (PaliGemma's labels, say)
# Processors that lay out the image tokens themselves when the prompt has none (PaliGemma's "<image>... <bos>prompt\n").
PLACE_IMAGES_THEMSELVES = ("PaliGemmaProcessor",)
# The processors' inputs of sound clips: never per token, whatever their length (a clip's frames may equal the prompt's)
SOUND_INPUTS = ("input_features", "feature_attention_mask", "input_features_mask", "audio_input_features",
                "audio_embed_sizes", "audio_attention_mask")  # fmt: skip
# Per-token inputs the decode steps need too (one more row per step: the last one repeated).
DECODE_ROWS = ("cross_attention_mask",)


@dataclass
class FamilyInputs:
    """The processor's inputs for one left-padded batch, beside its token ids."""

    per_token: dict = field(default_factory=dict)  # [batch, tokens, ...]
    images: dict = field(default_factory=dict)
    rope_positions: torch.Tensor | None = None  # [3, batch, tokens] (Qwen2-VL's multimodal rotary positions)
    rope_deltas: torch.Tensor | None = None  # [batch, 1]: decode positions are the token count plus this

    def prefill(self, start: int, with_images: bool) -> dict:
        """The inputs of a prefill that runs the tokens from `start` on."""
        extra = {key: value[:, start:] for key, value in self.per_token.items()}
        if self.rope_positions is not None:
            extra["position_ids"] = self.rope_positions[:, :, start:]
        return {**extra, **(self.images if with_images else {})}

    def decode(self) -> dict:
        """The inputs every decode step takes besides its token and position."""
        return {key: value[:, -1:] for key, value in self.per_token.items() if key in DECODE_ROWS}

    def decode_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The position ids of a decode step whose tokens go to `positions` ([batch, 1], counted from 0)."""
        if self.rope_deltas is None:
            return positions
        return (positions + self.rope_deltas)[None].expand(3, -1, -1)

    def __bool__(self) -> bool:
        return bool(self.per_token or self.images or self.rope_positions is not None)


def image_marker(processor) -> str:
    """What goes in front of a prompt that has no image marker of its own (Accessory's way: the image first)."""
    return "" if type(processor).__name__ in PLACE_IMAGES_THEMSELVES else f"{processor.image_token}\n"


def as_image_list(images) -> list:
    """One prompt's images: None, one image, or a list of them, as a list."""
    if images is None:
        return []
    return list(images) if isinstance(images, (list, tuple)) else [images]


def encode(processor, prompt: str, media: Sequence, dtype: torch.dtype, device) -> tuple[list[int], dict]:
    """Token ids and the other inputs for one prompt and its media (images, and sound `Clip`s for a model that hears,
    each kind in the order of its markers), exactly as `processor.apply_chat_template(..., tokenize=True)` makes
    them from the same conversation: a prompt that starts with BOS gets no second one."""
    images = [m for m in media if not isinstance(m, Clip)]
    clips = [m for m in media if isinstance(m, Clip)]
    marker = getattr(processor, "image_token", None)
    if images and marker not in prompt:
        prompt = image_marker(processor) * len(images) + prompt
    bos = getattr(processor.tokenizer, "bos_token", None)
    sound = _sound(processor, prompt, clips)
    try:
        batch = processor(
            text=prompt,
            images=images or None,
            return_tensors="pt",
            add_special_tokens=not (bos and prompt.startswith(bos)),
            **sound,
        )
    except ValueError as error:
        shown = prompt.count(marker)
        if shown == 0 and len(images) > 1:  # a processor that lays out one image itself (PaliGemma's)
            raise UserError(
                f"This model takes one image per conversation, and this one has {len(images)}; start a "
                "new conversation for another image."
            )
        if shown != len(images):
            raise UserError(
                f"The prompt has {shown} image marker{'s' if shown != 1 else ''} ({marker}) for "
                f"{len(images)} image{'s' if len(images) != 1 else ''}; give one image per marker."
            )
        raise UserError(f"This model's processor cannot take this image: {error}")
    ids = batch.pop("input_ids")[0].tolist()
    batch.pop("attention_mask", None)
    extra = {
        k: v.to(device, dtype=dtype if v.is_floating_point() else None)
        for k, v in batch.items()
        if k not in TRAINING_ONLY and torch.is_tensor(v)
    }
    return ids, extra


def sound_extractor(processor):
    """What makes a processor's audio features (its `feature_extractor`, Phi-4-multimodal's `audio_processor`), or
    None: a processor of a model that does not hear."""
    names = [name for name in ("feature_extractor", "audio_processor") if name in processor.get_attributes()]
    return getattr(processor, names[0]) if names else None


def hears(processor) -> bool:
    """Whether a processor takes sound clips: it makes audio features and has an audio marker."""
    return sound_extractor(processor) is not None and bool(getattr(processor, "audio_token", None))


def _sound(processor, prompt: str, clips: list[Clip]) -> dict:
    """The processor's arguments for a prompt's sound clips (a processor that `hears`), resampled to its feature
    extractor's rate (none without clips); a prompt whose audio markers do not match its clips is one sentence."""
    if not clips:
        return {}
    marker = processor.audio_token
    shown = prompt.count(marker)
    if shown != len(clips):
        raise UserError(
            f"The prompt has {shown} audio marker{'s' if shown != 1 else ''} ({marker}) for {len(clips)} "
            f"recording{'s' if len(clips) != 1 else ''}; give one recording per marker."
        )
    rate = sound_extractor(processor).sampling_rate
    return {"audio": [resampled(clip, rate).samples for clip in clips], "sampling_rate": rate}


def batch_inputs(
    rows: list[dict], lengths: list[int], width: int, model, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> FamilyInputs:
    """One batch's `FamilyInputs` from each prompt's processor outputs (`rows`, for prompts `lengths` tokens long,
    left-padded to `width`)."""
    inputs = FamilyInputs()
    keys = dict.fromkeys(key for row in rows for key in row)
    for key in keys:
        values = [row[key] for row in rows if key in row]
        aligned = all(v.dim() >= 2 and v.shape[1] == n for v, n in zip(values, lengths))
        if len(values) == len(rows) and aligned and key not in SOUND_INPUTS:
            inputs.per_token[key] = torch.cat([_left_pad(v, width) for v in values])
        else:
            inputs.images[key] = torch.cat(values)
    rope_index = getattr(getattr(model, "model", None), "get_rope_index", None)
    grids = dict(image_grid_thw=inputs.images.get("image_grid_thw"), video_grid_thw=inputs.images.get("video_grid_thw"))
    if rope_index is not None and "mm_token_type_ids" in inputs.per_token:
        inputs.rope_positions, inputs.rope_deltas = rope_index(
            input_ids, inputs.per_token["mm_token_type_ids"], **grids, attention_mask=attention_mask
        )
    elif rope_index is not None and "audio_seqlens" in inspect.signature(rope_index).parameters:
        # Qwen2.5-Omni's: a clip's tokens take positions by its time (25 a second), every prompt 3-D ones
        clips = inputs.images.get("feature_attention_mask")
        inputs.rope_positions, inputs.rope_deltas = rope_index(
            input_ids, **grids, attention_mask=attention_mask, audio_seqlens=None if clips is None else clips.sum(-1)
        )
    return inputs


def _left_pad(value: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - value.shape[1]
    if missing == 0:
        return value
    return torch.cat([value.new_zeros((value.shape[0], missing, *value.shape[2:])), value], dim=1)
