"""The demo build's vision stage alone, then how well its first four image tokens read on new images.

    PYTHONPATH=. python experiments/vision_binding/stage.py [--steps 1200]

Prints, on 500 new images: the count read off the class token, each shape token's colour or "not" (the colour word
or "not" its output-layer logits rank highest), and the share of images whose three shape tokens are all right.
"""
import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "assets"))
import build_demo_model as build  # noqa: E402
import demo_data as data  # noqa: E402


def read_slots(model, processor, word_ids, rng, images: int = 500) -> dict:
    pictures = [build.as_seen(rng, *data.shapes_image(rng)) for _ in range(images)]
    pixels = processor.image_processor([p.image for p in pictures], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        logits = build.slot_logits(model, build.vision_features(model, pixels)[0])
    counts = [word_ids[str(n)] for n in (1, 2, 3)]
    answers = build.answer_word_ids(word_ids)
    count_right, slot_right, all_right = 0, 0, 0
    for picture, row in zip(pictures, logits):
        wanted = build.slot_targets(picture.shapes, word_ids)
        count_right += counts[row[0, counts].argmax()] == wanted[0][0]
        right = [answers[row[slot, answers].argmax()] == wanted[slot][1] for slot in (1, 2, 3)]
        slot_right += sum(right)
        all_right += all(right)
    return {"count": count_right / images, "per slot": slot_right / (3 * images), "all three": all_right / images}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=build.VISION_STEPS)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rng = random.Random(0)
    held_out = data.held_out_pairs(0)
    tokenizer = build.train_tokenizer(rng, held_out)
    processor = build.new_processor(tokenizer)
    model = build.new_model(tokenizer, 0)
    started = time.time()
    build.pretrain_vision(model, tokenizer, processor, rng, args.steps, log_every=200)
    print(f"vision stage: {time.time() - started:.0f} s")
    model.eval()
    figures = read_slots(model, processor, build.word_ids_of(tokenizer), random.Random(12345))
    print("  ".join(f"{k} {v:.1%}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
