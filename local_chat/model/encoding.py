"""`PromptEncoder`: a model's prompts (with their images) in, the tensors its forward pass takes out."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from PIL import Image

from local_chat.errors import NO_EYES_HERE, NO_HEARING, UserError
from local_chat.voice.clips import Clip

from .generation import ModelInputs
from .image import shape_image
from .processors import left_out_part
from .vision_inputs import as_image_list, batch_inputs
from .vision_inputs import encode as encode_with_processor
from .vision_inputs import hears as processor_hears


def _side(size) -> int | None:
    """The side in an image processor's `size` or `crop_size` (a dict, or transformers' SizeDict)."""
    if size is None:
        return None
    get = size.get if isinstance(size, dict) else lambda key: getattr(size, key, None)
    side = get("height") or get("shortest_edge")
    return int(side) if side else None


class PromptEncoder:
    """Tokenizes prompts for the model `llma` with its `tokenizer`, and for a vision model its `processor`."""

    def __init__(self, llma, tokenizer, processor=None):
        self.llma, self.tokenizer, self.processor = llma, tokenizer, processor

    @property
    def sees_images(self) -> bool:
        return self.processor is not None and "image_processor" in self.processor.get_attributes()

    @property
    def hears(self) -> bool:
        """Whether the model takes sound clips (its processor makes audio features and has an audio marker)."""
        return self.processor is not None and processor_hears(self.processor)

    @property
    def image_size(self) -> int:
        """The side of the vision tower's square input (what Accessory's transforms resize to)."""
        image_processor = self.processor.image_processor
        for size in (getattr(image_processor, "crop_size", None), getattr(image_processor, "size", None)):
            side = _side(size)
            if side:
                return side
        side = getattr(self.llma.config.vision_config, "image_size", None)
        if side is None:  # variable resolution (Gemma 4's): the largest square its budget of patches takes
            patches = (
                getattr(image_processor, "max_soft_tokens", 256)
                * getattr(image_processor, "pooling_kernel_size", 1) ** 2
            )
            side = math.isqrt(patches) * getattr(image_processor, "patch_size", 16)
        return int(side)

    @property
    def image_transform(self) -> str | None:
        """The Accessory transform this model was trained with (its config's `image_transform`), or None: its
        processor fits each image to the model itself (tiling, dynamic resolution)."""
        return getattr(self.llma.config, "image_transform", None)

    @property
    def chat_renderer(self):
        """What renders this model's chat template: its processor where it has one with a template (typed parts, image
        markers), else its Hugging Face tokenizer; None without a chat template."""
        if self.processor is not None and getattr(self.processor, "chat_template", None):
            return self.processor
        hf = getattr(self.tokenizer, "hf", None)
        return hf if getattr(hf, "chat_template", None) else None

    def prepare_inputs(self, prompts: Sequence[str], images=None, image_transform: str | None = None) -> ModelInputs:
        """Tokenize a batch (left-padded). `images`: for each prompt None, an image or a list of images (a
        conversation's, in the order of their markers in the prompt); a vision model's processor tokenizes every
        prompt, with or without images, as its `apply_chat_template` does."""
        if images is not None and len(images) != len(prompts):
            raise UserError(
                f"Got {len(images)} images for {len(prompts)} prompts; pass one image (or None) per prompt."
            )
        rows, extras = [], []
        for prompt, image in zip(prompts, images if images is not None else [None] * len(prompts)):
            ids, extra = self.encode(prompt, image, image_transform)
            rows.append(ids)
            extras.append(extra)
        width = max(len(r) for r in rows)
        pad, device = self.tokenizer.pad_id, self.llma.device
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        family = batch_inputs(extras, [len(r) for r in rows], width, self.llma, input_ids, mask)
        return ModelInputs(input_ids, mask, family)

    def prompt_length(self, prompt: str, image=None, image_transform: str | None = None) -> int:
        """How many tokens `prompt` (with `image`, an image or a list: their image tokens included) takes."""
        return len(self.encode(prompt, image, image_transform)[0])

    def encode(self, prompt: str, images, image_transform: str | None) -> tuple[list[int], dict]:
        """One prompt's token ids and its processor's other outputs."""
        if isinstance(images, torch.Tensor):
            return self._encode_with_tensor(prompt, images)
        media = as_image_list(images)
        if any(isinstance(m, Clip) for m in media) and not self.hears:
            raise UserError(NO_HEARING)
        if any(not isinstance(m, Clip) for m in media) and not self.sees_images:
            if left_out_part(self.processor) == "image_processor":
                raise UserError(NO_EYES_HERE)
            raise UserError(
                "This model cannot see images; send the message without an image, or load a vision model "
                "(a Hugging Face vision-language folder with --pretrained_path)."
            )
        if self.processor is None:
            return self.tokenizer.encode(prompt, bos=True, eos=False), {}
        transform = image_transform if image_transform not in (None, "auto") else self.image_transform
        if transform is not None and self.sees_images:  # an Accessory transform: each image squared first
            mean = getattr(self.processor.image_processor, "image_mean", None) or (0.5, 0.5, 0.5)
            media = [m if isinstance(m, Clip) else shape_image(m, transform, self.image_size, mean) for m in media]
        return encode_with_processor(self.processor, prompt, media, self.llma.dtype, self.llma.device)

    def _encode_with_tensor(self, prompt: str, pixels: torch.Tensor) -> tuple[list[int], dict]:
        """An image the caller already transformed, Accessory style ([3, H, W] or [1, 3, H, W]): the processor only
        lays out the image tokens, and these pixels replace its own."""
        if not self.sees_images:
            return self.encode(prompt, [pixels], None)  # the sentence for a text-only model
        size = self.image_size
        pixels = pixels if pixels.dim() == 4 else pixels[None]
        if tuple(pixels.shape[-2:]) != (size, size):
            raise UserError(
                f"The image tensor is {tuple(pixels.shape[-2:])} but this model takes {size}x{size}; "
                "build it with get_transform(..., model.llma.image_size)."
            )
        ids, extra = encode_with_processor(
            self.processor, prompt, [Image.new("RGB", (size, size))], self.llma.dtype, self.llma.device
        )
        if tuple(extra["pixel_values"].shape) != tuple(pixels.shape):
            raise UserError("This model's processor does not take a transformed image tensor; pass the PIL image.")
        extra["pixel_values"] = pixels.to(self.llma.device, dtype=self.llma.dtype)
        return ids, extra
