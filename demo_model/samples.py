"""How a sample becomes tokens: prompt and answer segments through the project's own templates, then batches
of input ids, labels, the images as the model sees them and where colour answers look."""

from __future__ import annotations

from typing import NamedTuple

import torch

from local_chat.templates.multi_turn import default_conversation
from local_chat.templates.single_turn import format_prompt

from . import data
from .recipe import IMAGE_SIZE, IMAGE_TOKENS, PATCH_SIZE, SEPARATOR, SYSTEM

# ----- text: how a sample becomes prompt and answer segments, through the project's own templates -----


def segments(sample: data.Sample) -> list[tuple[str, bool]]:
    """(text, is_answer) pieces whose concatenation is exactly what the templates render."""
    if sample.template == "alpaca":
        turn = sample.turns[0]
        return [(format_prompt({"instruction": turn.question}, sys_name="alpaca"), False), (" " + turn.answer, True)]
    pieces = [(system_prompt(sample) + "\n\n###", False)]
    for turn in sample.turns:
        pieces += [
            (" Human: " + turn.question + SEPARATOR + " Assistant:", False),
            (" " + turn.answer + SEPARATOR, not turn.stopped),
        ]
    return pieces


def system_prompt(sample: data.Sample) -> str:
    """The conversation template's system prompt of `sample`: its own, else the template's."""
    return SYSTEM if sample.system is None else sample.system


def check_segments_match_templates(sample: data.Sample) -> None:
    text = "".join(t for t, _ in segments(sample))
    if sample.template == "alpaca":
        expected = format_prompt({"instruction": sample.turns[0].question}, "alpaca") + " " + sample.turns[0].answer
    else:
        conv = default_conversation()
        conv.system = system_prompt(sample)
        conv.load_qas([[t.question, t.answer] for t in sample.turns])
        expected = conv.get_prompt()
    assert text == expected, (text, expected)


# ----- training batches -----


class Encoded(NamedTuple):
    ids: list[int]
    labels: list[int]  # -100 outside answers
    # (query, key, word): where a colour answer names the colour ("The circle is" -> " red" or " not"); the asked
    # shape's image token; the word that token reads as, its colour or data.ABSENT
    lookups: list[tuple[int, int, int]]


def encode(sample: data.Sample, tokenizer, image_id: int) -> Encoded:
    """Input ids, labels and lookups; an image's tokens go first, as MetaModel places them."""
    ids, lookups = [tokenizer.bos_token_id], []
    if sample.image is not None:
        ids += [image_id] * IMAGE_TOKENS
    labels = [-100] * len(ids)
    pieces = segments(sample)
    if sample.image is not None:
        pieces[0] = ("\n" + pieces[0][0], False)
    answered = iter(turn for turn in sample.turns if not turn.stopped)
    for text, is_answer in pieces:
        piece_ids = tokenizer.encode(text, add_special_tokens=False)
        if is_answer and (turn := next(answered)).kind == "image_color":
            kind = data.asked_shape(turn)
            at = colour_word_index(kind, tokenizer, piece_ids)
            lookups.append((len(ids) + at - 1, 1 + SLOT_OF[kind], piece_ids[at]))
        ids += piece_ids
        labels += piece_ids if is_answer else [-100] * len(piece_ids)
    if sample.template == "alpaca":
        ids.append(tokenizer.eos_token_id)
        labels.append(tokenizer.eos_token_id)
    return Encoded(ids, labels, lookups)


# Where each shape's image token is among the image tokens (the class token first; see slot_targets).
SLOT_OF = {kind: 1 + i for i, kind in enumerate(data.SHAPES)}


def colour_word_index(kind: str, tokenizer, answer_ids: list[int]) -> int:
    """The index, in a colour answer's tokens, of its colour or data.ABSENT: the word after "The circle is"."""
    prefix = tokenizer.encode(f" The {kind} is", add_special_tokens=False)
    assert answer_ids[: len(prefix)] == prefix, (kind, answer_ids)
    return len(prefix)


class Picture(NamedTuple):
    image: object  # the image as the model sees it
    shapes: list  # its (colour, kind) pairs
    kinds: torch.Tensor | None = None  # per patch, the share of background, circle, square and triangle


def as_seen(rng, image, shapes, kinds_map=None) -> Picture:
    """The image as the model sees it: a lone shape padded or cropped at random, several padded (cropping could cut
    a shape off the side); with its kinds map (data.shapes_image_and_map), also what each patch holds."""
    from local_chat.model.image import shape_image

    transform = rng.choice(("padded_resize", "resized_center_crop")) if len(shapes) == 1 else "padded_resize"
    kinds = None if kinds_map is None else patch_kinds(kinds_map, transform)
    return Picture(shape_image(image, transform, IMAGE_SIZE), shapes, kinds)


def patch_kinds(kinds_map, transform: str) -> torch.Tensor:
    """[patches, 4]: the share of each patch that is background, circle, square and triangle, after `transform`;
    the patches in the order of the vision tower's tokens (row by row)."""
    from PIL import Image

    from local_chat.model.image import shape_image, to_normalized_tensor

    masks = Image.merge(
        "RGB",
        [
            kinds_map.point(lambda value, kind=kind: 255 if value == kind else 0)
            for kind in range(1, len(data.SHAPES) + 1)
        ],
    )  # one channel per kind
    seen = to_normalized_tensor(shape_image(masks, transform, IMAGE_SIZE, pad_color=(0, 0, 0)), (0, 0, 0), (1, 1, 1))
    side = IMAGE_SIZE // PATCH_SIZE
    shapes = torch.stack(
        [channel.contiguous().view(side, PATCH_SIZE, side, PATCH_SIZE).mean(dim=(1, 3)).flatten() for channel in seen],
        dim=1,
    ).clamp(0, 1)
    return torch.cat([(1 - shapes.sum(dim=1, keepdim=True)).clamp(min=0), shapes], dim=1)


def make_batches(
    rng,
    held_out,
    tokenizer,
    image_id,
    processor,
    pool: int,
    token_budget: int,
    image_share: float,
    shares: data.Shares = data.Shares(),
):
    """A pool of samples, grouped by length into batches of about `token_budget` (padded) tokens. Each batch
    comes with its images as the model sees them and their shapes, for the slot loss."""
    samples = [data.training_sample(rng, held_out, image_share, shares) for _ in range(pool)]
    encoded = sorted(((encode(s, tokenizer, image_id), s) for s in samples), key=lambda e: len(e[0].ids))
    batches, current = [], []
    for item in encoded:
        if current and len(item[0].ids) * (len(current) + 1) > token_budget:
            batches.append(current)
            current = []
        current.append(item)
    batches.append(current)
    rng.shuffle(batches)
    for batch in batches:
        width = max(len(e.ids) for e, _ in batch)
        input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        pictures, lookups = [], []
        for row, (e, sample) in enumerate(batch):
            input_ids[row, : len(e.ids)] = torch.tensor(e.ids)
            labels[row, : len(e.labels)] = torch.tensor(e.labels)
            mask[row, : len(e.ids)] = 1
            lookups += [(row, *lookup) for lookup in e.lookups]
            if sample.image is not None:
                pictures.append(as_seen(rng, sample.image, sample.shapes))
        extra = (
            {
                "pixel_values": processor.image_processor([p.image for p in pictures], return_tensors="pt")[
                    "pixel_values"
                ]
            }
            if pictures
            else {}
        )
        yield input_ids, mask, labels, extra, pictures, lookups
