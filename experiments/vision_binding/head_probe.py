"""Can one attention head learn the lookup on a built model's frozen inputs?

    PYTHONPATH=. python experiments/vision_binding/head_probe.py assets/demo-model [--steps 400] [--layer 2] [--oracle]

Trains only the lookup head's own query, key, value and output weights (copies of layer --layer's lookup head), with
lookup_loss's two terms on the model's layer inputs (no gradient into the model), then prints, on 20 new batches,
the share of lookups where the head attends most to the asked shape's image token and where what it brings reads
as the right word (the colour or data.ABSENT). With --oracle the query is a
learnt vector per asked shape instead: whether the image tokens hold what the lookup needs, whatever the query knows.
"""
import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "assets"))
import build_demo_model as build  # noqa: E402
import demo_data as data  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--layer", type=int, default=build.LOOKUP_LAYER)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--oracle", action="store_true")
    args = parser.parse_args()
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    import model  # noqa: F401  (registers the vision tower's type)

    torch.set_num_threads(2)
    torch.manual_seed(0)  # the --oracle vectors' start
    build.LOOKUP_LAYER = args.layer
    processor = AutoProcessor.from_pretrained(args.folder)
    tokenizer = processor.tokenizer
    llava = LlavaForConditionalGeneration.from_pretrained(args.folder, dtype=torch.float32).eval()
    captured = build.capture_lookup_inputs(llava)
    attention = llava.model.language_model.layers[args.layer].self_attn
    weights = [torch.nn.Parameter(w.detach().clone()) for w in build.lookup_head_weights(attention)]
    oracle = torch.nn.Parameter(torch.randn(len(data.SHAPES), attention.head_dim) * 0.1)
    optimizer = torch.optim.Adam([*weights, oracle], lr=args.lr)
    word_ids = build.word_ids_of(tokenizer)
    answers = build.answer_word_ids(word_ids)
    readout = llava.lm_head.weight[answers].detach()
    image_id, held_out = tokenizer.convert_tokens_to_ids("<image>"), data.held_out_pairs(0)

    def lookups_of(rng):
        """The lookups of each new batch, after the model's forward has filled `captured`."""
        for input_ids, mask, _, extra, _, lookups in build.make_batches(
                rng, held_out, tokenizer, image_id, processor, 256, build.TOKENS_PER_STEP, build.IMAGES_FIRST_SHARE):
            if lookups:
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                    llava(input_ids=input_ids, attention_mask=mask, **extra)
                yield lookups

    def head_on(lookups):
        """(loss, attends right, reads right) for each lookup: build.lookup_loss's terms, with the head's copies."""
        keys, targets = build.lookup_targets(lookups, answers)
        first_slot = 1 + build.SLOT_OF[data.SHAPES[0]]  # where the first shape's token is, after <s>
        query = oracle[keys - first_slot] * 10 if args.oracle else None
        scores, read = build.lookup_head(attention.scaling, weights, captured, lookups, readout, query)
        loss = torch.nn.functional.cross_entropy(scores, keys) + torch.nn.functional.cross_entropy(read, targets)
        return loss, scores.argmax(-1) == keys, read.argmax(-1) == targets

    step, rng = 0, random.Random(123)
    while step < args.steps:
        for lookups in lookups_of(rng):
            loss = head_on(lookups)[0]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 50 == 0:
                print(f"step {step}  loss {loss.item():.3f}", flush=True)
            if step >= args.steps:
                break
    attends, reads, total = 0, 0, 0
    with torch.no_grad():
        for _, lookups in zip(range(20), lookups_of(random.Random(999))):
            _, attended, read = head_on(lookups)
            attends, reads, total = attends + attended.sum().item(), reads + read.sum().item(), total + len(lookups)
    print(f"attends {attends / total:.0%}, reads {reads / total:.0%} of {total} lookups")


if __name__ == "__main__":
    main()
