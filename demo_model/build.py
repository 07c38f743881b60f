"""Build the demo model in assets/demo-model: synthetic data, tokenizer, training and evaluation, on the CPU.

    python -m demo_model            # the full build (about 65 minutes on 2 cores)
    python -m demo_model --quick    # a few steps, to check that the script still runs
    python -m demo_model --eval     # evaluate the shipped model and print the accuracy table
    python -m demo_model --base /tmp/base.pt --out /tmp/m   # keeps the state after the main steps there;
                                                            # the next build given it trains only the later ones

Deterministic from --seed on one machine: the data, the tokenizer and the training all draw from it. On another
machine the data and the tokenizer are the same but the training may not be, and then the model differs a lot:
check the accuracy table before shipping a build. oneDNN is kept below AMX (ONEDNN_MAX_CPU_ISA), whose bf16
kernels round otherwise: on a CPU with AMX, the same seed trained a model right on 72.5% of the held-out sums
with them and 99.3% without.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from local_chat.defaults import DEMO_MODEL

from . import data
from .card import write_model_card
from .evaluation import accuracy_table, evaluate
from .recipe import SYMBOL_STEPS, TOKENS_PER_STEP, VISION_BATCH, VISION_STEPS
from .samples import check_segments_match_templates
from .tokenizer import train_tokenizer
from .training import attention_in_float32, load_base, new_model, new_processor, pretrain_vision, train

# ----- saving -----


def save(model, processor, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.safetensors"):
        old.unlink()
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    model.config.image_transform = "padded_resize"  # how it was trained to see: the app fits images the same way
    model.to(torch.float16).save_pretrained(folder)  # half the size; loaded back in fp32 on the CPU
    processor.save_pretrained(folder)


def output_folder(out: Path | None, quick: bool) -> Path:
    """The folder a build writes to: --out, else the shipped model's, except for --quick, whose 3-step model
    goes to a fresh temporary folder."""
    if out is not None:
        return out
    if quick:
        return Path(tempfile.mkdtemp(prefix="demo-model-quick-"))
    return DEMO_MODEL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="train a few steps only (a smoke test)")
    parser.add_argument("--eval", action="store_true", help="only evaluate the model in --out")
    parser.add_argument("--steps", type=int, default=1500, help="main training steps (default 1500)")
    parser.add_argument(
        "--symbol_steps",
        type=int,
        default=SYMBOL_STEPS,
        help=f"steps after them: sums in symbols, one-digit sums, questions to decline (default {SYMBOL_STEPS})",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the data, the tokenizer and the training")
    parser.add_argument(
        "--eval_samples",
        type=int,
        default=300,
        help="questions per skill (the shipped model's figures at 100 were up to 4 points off)",
    )
    parser.add_argument(
        "--base",
        type=Path,
        help="a file for the state after the main steps: written there by "
        "a build, and resumed from by the next one with the same --seed and --steps, which then "
        "trains only the steps after them (1,000 in 21 minutes instead of 65); delete it "
        "after a change to the main steps",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="model folder (default: assets/demo-model; with --quick, "
        "a temporary folder, so a smoke test never overwrites the shipped model)",
    )
    args = parser.parse_args()
    if args.quick and args.eval and args.out is None:
        parser.error(
            "--quick --eval would rewrite the shipped model's card with 4 questions a skill: "
            "give --out a copy of the model to evaluate"
        )
    args.out = output_folder(args.out, args.quick)
    torch.set_num_threads(2)
    import transformers
    from transformers import AttentionInterface

    transformers.utils.logging.disable_progress_bar()
    from local_chat.model.meta import MetaModel

    if not args.eval:
        started = time.time()
        steps, vision_steps = (3, 2) if args.quick else (args.steps, VISION_STEPS)
        header = {"seed": args.seed, "steps": steps, "vision_steps": vision_steps}
        base = load_base(args.base, header)  # first: a base of another recipe is refused before any work
        rng = random.Random(args.seed)
        held_out = data.held_out_pairs(args.seed)
        for probe in range(20):
            check_segments_match_templates(data.training_sample(random.Random(probe), held_out))
        tokenizer = train_tokenizer(rng, held_out)
        processor = new_processor(tokenizer)
        model = new_model(tokenizer, args.seed)
        AttentionInterface.register("float32_sdpa", attention_in_float32)
        model.set_attn_implementation("float32_sdpa")
        # --quick: small steps too (a step of the recipe's size takes half a minute on a CPU without AVX-512)
        vision_batch, token_budget = (8, 768) if args.quick else (VISION_BATCH, TOKENS_PER_STEP)
        vision = (
            base["header"]["vision"]
            if base
            else pretrain_vision(model, tokenizer, processor, rng, vision_steps, batch=vision_batch)
        )
        save_base_as = (args.base, header | {"vision": vision}) if args.base and not base else None
        stats = (
            train(
                model,
                tokenizer,
                processor,
                rng,
                held_out,
                steps,
                2 if args.quick else args.symbol_steps,
                log_every=1 if args.quick else 50,
                base=base,
                save_base_as=save_base_as,
                token_budget=token_budget,
            )
            | vision
        )
        model.set_attn_implementation("sdpa")
        save(model, processor, args.out)
        skipped = base["header"]["train_seconds"] + vision["vision_seconds"] if base else 0
        stats["build_seconds"] = round(time.time() - started) + skipped
        stats["seed"] = args.seed
        (args.out / "training.json").write_text(json.dumps(stats, indent=1) + "\n")
        print(f"trained in {stats['train_seconds']} s, built in {stats['build_seconds']} s", flush=True)
    demo = MetaModel.from_pretrained(str(args.out), with_visual=True)
    size_mb = sum(f.stat().st_size for f in args.out.glob("*.safetensors")) / 1e6
    questions = 4 if args.quick else args.eval_samples
    # --quick: a 3-step model's answers never end, and its figures mean nothing: short answers keep the check quick
    figures = evaluate(demo, args.seed, n=questions, answer_tokens=8 if args.quick else 64)
    (args.out / "accuracy.json").write_text(json.dumps(figures, indent=1) + "\n")
    stats = json.loads((args.out / "training.json").read_text())
    params_m = sum(p.numel() for p in demo.llma.parameters()) / 1e6
    write_model_card(args.out, figures, stats, size_mb, params_m, questions)
    print(accuracy_table(figures))
    print(f"weights: {size_mb:.1f} MB, in {args.out}")


if __name__ == "__main__":
    main()
