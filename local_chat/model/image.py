"""Accessory's image transforms (`padded_resize`, `resized_center_crop`), written with PIL and torch.

torchvision is not a dependency: its wheel from PyPI does not load beside the CPU build of torch the README installs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from PIL import Image

from local_chat.errors import UserError

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
TRANSFORMS = ("padded_resize", "resized_center_crop")


def pad_to_square(img: Image.Image, color: Sequence[float] = CLIP_MEAN) -> Image.Image:
    """Pad the short side evenly with `color` (RGB in [0, 1]), as LLaVA and Accessory do."""
    width, height = img.size
    if width == height:
        return img
    side = max(width, height)
    square = Image.new(img.mode, (side, side), tuple(int(c * 255) for c in color))
    square.paste(img, ((side - width) // 2, (side - height) // 2))
    return square


def resize_shortest_side(img: Image.Image, size: int) -> Image.Image:
    width, height = img.size
    scale = size / min(width, height)
    new_size = (max(size, round(width * scale)), max(size, round(height * scale)))
    return img.resize(new_size, Image.Resampling.BICUBIC)


def center_crop(img: Image.Image, size: int) -> Image.Image:
    width, height = img.size
    left, top = (width - size) // 2, (height - size) // 2
    return img.crop((left, top, left + size, top + size))


def shape_image(img: Image.Image, transform_type: str, size: int, pad_color=CLIP_MEAN) -> Image.Image:
    """The geometric part of a transform: an RGB `size` x `size` image, padded or cropped as asked."""
    if transform_type not in TRANSFORMS:
        raise UserError(f"Unknown image transform {transform_type!r}; choose one of: {', '.join(TRANSFORMS)}.")
    img = img.convert("RGB")
    if transform_type == "padded_resize":
        return pad_to_square(img, pad_color).resize((size, size), Image.Resampling.BICUBIC)
    return center_crop(resize_shortest_side(img, size), size)


def to_normalized_tensor(img: Image.Image, mean=CLIP_MEAN, std=CLIP_STD) -> torch.Tensor:
    """A [3, H, W] float tensor, scaled to [0, 1] then normalized."""
    data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    pixels = data.view(img.size[1], img.size[0], 3).permute(2, 0, 1).float() / 255.0
    return (pixels - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]


def get_transform(transform_type: str, image_size: int = 224) -> Callable[[Image.Image], torch.Tensor]:
    """Accessory's `get_transform`: PIL image -> normalized [3, image_size, image_size] tensor (CLIP mean/std)."""
    if transform_type not in TRANSFORMS:
        raise UserError(f"Unknown image transform {transform_type!r}; choose one of: {', '.join(TRANSFORMS)}.")

    def transform(img: Image.Image) -> torch.Tensor:
        return to_normalized_tensor(shape_image(img, transform_type, image_size))

    return transform
