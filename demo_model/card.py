"""The demo model's card (assets/demo-model/README.md): what it does, how it was built, its accuracy table."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from local_chat.model.vision_stem import MODEL_TYPE

from . import data
from .evaluation import BARS, accuracy_table
from .recipe import (
    DECAY_SHARE,
    DECLINE_ONE_DIGIT_SHARE,
    DECLINE_SHARE,
    IMAGE_SHARE,
    IMAGE_SIZE,
    IMAGES_FIRST_SHARE,
    IMAGES_FIRST_STEPS,
    NO_SYSTEM_SHARE,
    ONE_DIGIT_SHARE,
    SYMBOL_SHARE,
    TOKENS_PER_STEP,
    VISION_BATCH,
    VOCAB_SIZE,
)
from .training import LOOKUP_HEAD, LOOKUP_LAYER


def write_model_card(folder: Path, figures: dict, stats: dict, size_mb: float, params_m: float, questions: int) -> None:
    capitals = ", ".join(data.CAPITALS)
    below = [k for k, bar in BARS.items() if figures.get(k, 0.0) < bar]
    limits = (
        (
            "\n**Not yet at its accuracy bars:** "
            + ", ".join(f"{k} {figures[k]:.0%} (bar {BARS[k]:.0%})" for k in below)
            + ". The table below shows how far to trust each skill. It shows how the app works, not what a model "
            "can do.\n"
        )
        if below
        else ""
    )
    card = f"""# Demo model

The built-in model of this chat app: a {params_m:.1f}M-parameter LLaVA-style model (a 3-layer CLIP vision
transformer on {IMAGE_SIZE}x{IMAGE_SIZE} images whose patch embedding is four convolutions, a 2-layer projector and a
4-layer Llama, 256 wide, 8 heads, 2,048 positions), trained from scratch on synthetic data by
`python -m demo_model`. It knows very little, on purpose: it lets you try the app on any machine before you
fetch a real checkpoint.
{limits}
Load it with `MetaModel.from_pretrained("assets/demo-model")`. With transformers alone, `import model` (this
project's package) first: it registers the vision tower's type, `{MODEL_TYPE}`, with transformers.

**To chat with a real model**, start the app with `--pretrained_path /path/to/checkpoint` (a Hugging Face
folder, or a LLaMA2-Accessory / Meta checkpoint).

## What it knows

It answers in the Alpaca template (`format_prompt(..., sys_name="alpaca")`, answers end with EOS) and in the
default conversation template (`default_conversation()`, answers end with `"\\n###"`), and through the
tokenizer's chat template, which renders the default conversation template.

| ask | it answers |
| --- | --- |
| `What is 27 plus 48?` / `What is 53 minus 25?` (0-99, minus with A >= B) | `{data.worked_answer(27, "plus", 48)}` |
| `What is 2+2?`, `27 - 8`, `27+48=` (a sum in symbols) | `{data.worked_answer(2, "plus", 2)}` (in words) |
| `Add 12 to that.` (after a sum, in a conversation) | `{data.worked_answer(75, "plus", 12)}` |
| `What is the capital of France?` | `The capital of France is Paris.` |
| `Who are you?` | `{data.WHO_ARE_YOU}` |
| `What can you do?` | `{data.WHAT_CAN_YOU_DO}` |
| an image, `What is in the image?` | `A red circle and a blue square.` (circles, then squares, then triangles) |
| an image, `What color is the circle?` | `The circle is red.` / `The circle is {data.ABSENT} in the image.` |
| an image, `How many shapes are there?` | `There are 2 shapes.` |
| anything else, and sums it does not do (`3*4`, `12 divided by 4`, `2 + 3 + 4`, `150 + 20`, `3.5 + 2`, `-5 + 3`) | `{data.DONT_KNOW}` |

Sums of two one-digit numbers are answered in one go ("5 plus 9 is 14."), {figures.get("arithmetic_one_digit", 0):.1%}
of them right (`arithmetic_one_digit` below): 1% of the sums of its first {stats["steps"]} steps, they are
{ONE_DIGIT_SHARE:.0%} of those of the steps after. Sums of three numbers, of numbers over 99, with decimals or below
zero, products and quotients are declined (`declines`), most of the time: {figures.get("declines", 0):.1%}. A difference
below zero ("3 - 10") is not: it is answered, wrongly.

Countries: {capitals}.

Images: one to three shapes (circle, square, triangle; at most one of each) in red, green, blue, yellow, purple
or orange, each 15-50% of the image side, not overlapping, on a plain light or dark background, any size.

## How it was trained

`python -m demo_model` (seed {stats.get("seed", 0)}): a byte-level BPE tokenizer ({VOCAB_SIZE} tokens,
digits split one per token) trained on the synthetic conversations, then {stats["steps"]} AdamW steps of about
{TOKENS_PER_STEP:,} tokens each (bf16 autocast, the attention in fp32, which is faster on the CPU; the learning rate held at its
peak, then annealed over the last {DECAY_SHARE:.0%} of the steps), then {stats.get("symbol_steps", 0)} more at the annealed
rate with {SYMBOL_SHARE:.0%} of the sums asked with symbols ("2+2", "27 - 8") and {ONE_DIGIT_SHARE:.0%} of them of two one-digit
numbers, and {DECLINE_SHARE:.0%} of the text questions other arithmetic or small talk to decline ("3*4", "2 + 3 + 4",
"150 + 20", "Good morning!"), {DECLINE_ONE_DIGIT_SHARE:.0%} of that arithmetic of one-digit numbers ("2 + 3 + 4",
"3.5 + 2"), and {NO_SYSTEM_SHARE:.0%} of the conversations with the system prompt cleared,
loss on the answers only. {IMAGES_FIRST_SHARE:.0%} of the samples have an image in the first
{IMAGES_FIRST_STEPS} steps, so that
the model learns to look at the image, and {IMAGE_SHARE:.0%} after, so that it gets enough sums to learn them; 25% are
in the Alpaca template and the rest conversations of 1 to 10 turns. The first four image tokens are also taught, through
the language model's output layer, to read as words: the vision class token (kept as the first image token) as the
number of shapes, the next three as the circle, the square and the triangle, each with its colour or "{data.ABSENT}"
("circle" and "red"). The vision tower and projector learn this alone first, for {stats.get("vision_steps", 0)} batches of
{VISION_BATCH} images, before the language model's steps, with a linear probe, thrown away after, that reads each
patch's shape off the tower's last layer: without it the tower learnt the colours and the count but not which shape
has which colour. The language model reads those tokens in order to describe an image; asked for one shape's colour,
one attention head (layer {LOOKUP_LAYER}, head {LOOKUP_HEAD}) finds that shape's token after "The circle is" and brings
its colour, or "{data.ABSENT}": the first {IMAGES_FIRST_STEPS} steps teach it where to look and what to bring. Left to find the
token alone, the model answered from the number of shapes ("There is no circle" beside a lone circle; see
the lab notes in experiments/vision_binding, in git history at commit 4c7c62a). Sums are worked out
digit by digit, ones first, which a model this small learns several times faster than a whole sum written in one go, and the input and output
embeddings are separate (tied, the one-digit sums came about three times slower). {data.HELD_OUT_PAIRS} arithmetic
questions are held out for the evaluation. oneDNN is kept below AMX (`ONEDNN_MAX_CPU_ISA={os.environ["ONEDNN_MAX_CPU_ISA"]}`):
with AMX's bf16 kernels, the same seed trained a model right on 72.5% of the held-out sums.
Training took {stats["train_seconds"] / 60:.1f} minutes and the whole build
{stats["build_seconds"] / 60:.1f} minutes on 2 CPU cores.
Weights: {size_mb:.1f} MB of safetensors (fp16; loaded in fp32 on the CPU).

## Measured accuracy

Greedy, through `MetaModel` and the templates, on {questions} held-out questions a skill (new images, held-out
sums; `arithmetic_one_digit` is every sum and difference of two one-digit numbers instead, 155 in each template,
most of them seen in training; `arithmetic_symbols` asks held-out sums with symbols, "What is 27+48?" or "27 - 8",
and `arithmetic_one_digit_symbols` the one-digit ones; `declines` asks other arithmetic (new numbers, half of
them one-digit: "2 + 3 + 4") or small talk, as trained, and wants the decline word for word;
`image_color` asks about a shape in the image, `image_absent` about one that is not,
exactly; `arithmetic_turn6` asks a sum after five other turns, `followup` is `Add C to that.`,
`no_system` a held-out sum or a capital with the system prompt cleared, `after_stop` a sum or a
capital, exactly and nothing more, after an answer cut off by Stop; `termination` counts answers that ended with
EOS or the separator within 64 tokens). `python -m demo_model --eval` prints this table again.

{accuracy_table(figures)}
"""
    (folder / "README.md").write_text(reflowed(card))


def reflowed(markdown: str, width: int = 118) -> str:
    """`markdown` with its paragraphs refilled to `width` columns; headings and tables as they are."""
    blocks = [
        block
        if block.startswith(("#", "|"))
        else textwrap.fill(" ".join(block.split()), width, break_long_words=False, break_on_hyphens=False)
        for block in markdown.strip().split("\n\n")
    ]
    return "\n\n".join(blocks) + "\n"
