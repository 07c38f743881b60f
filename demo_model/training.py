"""The demo model's training: the model and processor, the vision stage, the slot and lookup losses, the steps."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

from local_chat.model.vision_stem import ConvStemCLIPVisionConfig

from . import data
from .recipe import (
    CHAT_TEMPLATE,
    DECAY_SHARE,
    IMAGE_SHARE,
    IMAGE_SIZE,
    IMAGE_TOKENS,
    IMAGES_FIRST_SHARE,
    IMAGES_FIRST_STEPS,
    LATER_MIX,
    PATCH_SIZE,
    TOKENS_PER_STEP,
    VISION_BATCH,
)
from .samples import as_seen, make_batches

# ----- model -----


def new_model(tokenizer, seed: int):
    from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = ConvStemCLIPVisionConfig(
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    # Three times the usual scale: the vision stage learns its words through this layer, and at std 0.02 a probe
    # of it read the shapes' colours right 49% of the time after 750 steps, at 0.06 61% (an experiment on a branch
    # that was not kept).
    torch.nn.init.normal_(model.lm_head.weight, std=0.06)
    return model


def new_processor(tokenizer):
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="full",
        image_token="<image>",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    )


# ----- the slot loss: the first image tokens are taught to read as the words of what the image shows -----


def slot_targets(shapes, word_ids: dict) -> list[tuple[int, int]]:
    """The two words each of the first four image tokens reads as: the class token the number of shapes (twice),
    then the circle's, the square's and the triangle's token its shape and its colour, or data.ABSENT where there is
    none. With its shape in it, the language model finds a shape's token by what it reads, not by where it is."""
    colour_of = {kind: color for color, kind in shapes}
    count = word_ids[str(len(shapes))]
    return [(count, count)] + [(word_ids[kind], word_ids[colour_of.get(kind, data.ABSENT)]) for kind in data.SHAPES]


def slot_logits(model, image_features: torch.Tensor) -> torch.Tensor:
    """[images, 4, vocabulary]: what the output layer reads off the first four image tokens of each image."""
    return model.lm_head(image_features.reshape(-1, IMAGE_TOKENS, image_features.shape[-1])[:, :4])


def slot_loss(model, image_features: torch.Tensor, pictures, word_ids: dict) -> torch.Tensor:
    """The language model head's mean log-probability of the slot words on the first four image tokens, negated:
    the language model then answers by copying from fixed image tokens, as it copies words from the prompt."""
    logits = slot_logits(model, image_features).float()
    targets = torch.tensor([slot_targets(p.shapes, word_ids) for p in pictures])
    return -torch.log_softmax(logits, dim=-1).gather(-1, targets).mean()


def kinds_loss(probe: torch.nn.Linear, tower_output: torch.Tensor, pictures) -> torch.Tensor:
    """Cross-entropy of a linear probe on each patch token of the vision tower's last layer against the shares of
    background and shape kinds in that patch. Without it the tower learnt each patch's colour and the number of
    shapes, but not which shape a colour belongs to: the colour slots were right in 1% of the images."""
    log_probs = torch.log_softmax(probe(tower_output[:, 1:]).float(), dim=-1)
    return -(torch.stack([p.kinds for p in pictures]) * log_probs).sum(dim=-1).mean()


# One attention head is shown where to look when a colour answer names the colour ("The circle is" -> " red" or
# " not"): the asked shape's image token; what it brings from there must read as that word. Left to find that token
# alone, the language model answered from the number of shapes instead. Only in the first IMAGES_FIRST_STEPS, while
# images dominate: learnt then, the lookup stays. All through the steps it cost the sums (4% at weight 1, 37% at 0.2),
# and started later it was not learnt (lab notes: experiments/vision_binding, in git history at commit 4c7c62a).
LOOKUP_LAYER, LOOKUP_HEAD = 2, 0


def capture_lookup_inputs(model) -> dict:
    """Keeps the hidden states and rotary embeddings that go into the lookup layer's attention, for lookup_loss."""
    captured = {}

    def keep(module, args, kwargs):
        captured.update(hidden=kwargs["hidden_states"], rotary=kwargs["position_embeddings"])

    model.model.language_model.layers[LOOKUP_LAYER].self_attn.register_forward_pre_hook(keep, with_kwargs=True)
    return captured


def head_columns(attention, head: int) -> tuple[slice, slice]:
    """The columns of one attention head in the query and output weights, and in the key and value weights."""
    width, key_head = attention.head_dim, head // attention.num_key_value_groups
    return slice(head * width, (head + 1) * width), slice(key_head * width, (key_head + 1) * width)


def answer_word_ids(word_ids: dict) -> list[int]:
    """What an image token's colour reads as, and what a lookup brings: the colours and data.ABSENT."""
    return [word_ids[w] for w in (*data.COLORS, data.ABSENT)]


def lookup_head(
    scaling: float,
    weights: tuple,
    captured: dict,
    lookups: list[tuple[int, int, int, int]],
    readout: torch.Tensor,
    query: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each (row, query, key, word) of `lookups`: the lookup head's attention scores from the query position over
    the positions before it, and what it brings there, read by `readout` (the output layer's rows of the answer
    words). `weights` are the head's query, key, value and output weights; `query` replaces its query states."""
    from transformers.models.llama.modeling_llama import rotate_half

    query_weight, key_weight, value_weight, out_weight = weights
    rows, queries = torch.tensor([(row, position) for row, position, _, _ in lookups]).T
    batch = len(captured["hidden"])
    hidden, (cos, sin) = captured["hidden"][rows], (r.expand(batch, -1, -1)[rows] for r in captured["rotary"])
    key_states = torch.nn.functional.linear(hidden, key_weight)
    key_states = key_states * cos + rotate_half(key_states) * sin
    at = torch.arange(len(rows))
    query_states = torch.nn.functional.linear(hidden[at, queries], query_weight) if query is None else query
    query_states = query_states * cos[at, queries] + rotate_half(query_states) * sin[at, queries]
    scores = torch.einsum("nd,ntd->nt", query_states, key_states).float() * scaling
    scores = scores.masked_fill(torch.arange(scores.shape[1]) > queries[:, None], float("-inf"))
    values = torch.nn.functional.linear(hidden, value_weight)
    brought = torch.einsum("nt,ntd->nd", torch.softmax(scores, dim=-1).to(values.dtype), values)
    return scores, torch.nn.functional.linear(torch.nn.functional.linear(brought, out_weight), readout)


def lookup_head_weights(attention) -> tuple:
    """The lookup head's query, key, value and output weights in the lookup layer's `attention`."""
    head, kv = head_columns(attention, LOOKUP_HEAD)
    return (
        attention.q_proj.weight[head],
        attention.k_proj.weight[kv],
        attention.v_proj.weight[kv],
        attention.o_proj.weight[:, head],
    )


def lookup_targets(lookups: list[tuple[int, int, int, int]], answers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """What each lookup should attend to (its key) and read as (the index of its word among `answers`)."""
    return torch.tensor([key for _, _, key, _ in lookups]), torch.tensor([answers.index(w) for *_, w in lookups])


def lookup_loss(model, captured: dict, lookups: list[tuple[int, int, int, int]], answers: list[int]) -> torch.Tensor:
    """For each (row, query, key, word): the cross-entropy of the lookup head's attention from the query position
    over the positions before it, against the key (the asked shape's image token), plus the cross-entropy of what
    the head brings, read by the output layer among the `answers` words (the colours and data.ABSENT), against the
    word (that token's colour, or data.ABSENT)."""
    attention = model.model.language_model.layers[LOOKUP_LAYER].self_attn
    # Among the answer words only, and the output layer only reads (detached): over the whole vocabulary, and with the
    # output layer trained by it, this loss started near 7 and the sums fell to 1.5%.
    scores, read = lookup_head(
        attention.scaling, lookup_head_weights(attention), captured, lookups, model.lm_head.weight[answers].detach()
    )
    keys, targets = lookup_targets(lookups, answers)
    return torch.nn.functional.cross_entropy(scores, keys) + torch.nn.functional.cross_entropy(read.float(), targets)


def learning_rate_factor(step: int, steps: int, decay_share: float = DECAY_SHARE) -> float:
    """Warm up, hold the peak, then anneal to a tenth over the last `decay_share` of the steps (warmup-stable-decay)."""
    warmup = max(1, min(100, steps // 10))
    decay_start = steps * (1 - decay_share)
    decayed = min(1.0, max(0.0, step - decay_start) / (steps - decay_start))
    return min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * decayed)))


def word_ids_of(tokenizer) -> dict:
    """The token of each slot word: the colours, the shapes, data.ABSENT, and the counts 1 to 3."""
    ids = {w: tokenizer.encode(" " + w, add_special_tokens=False)[0] for w in (*data.COLORS, *data.SHAPES, data.ABSENT)}
    return ids | {str(n): tokenizer.encode(str(n), add_special_tokens=False)[-1] for n in (1, 2, 3)}


def take_step(loss: torch.Tensor, params, optimizer, schedule) -> float:
    """Backward, clip, one optimizer and schedule step; returns the loss."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def log_progress(
    name: str, step: int, steps: int, losses: list[float], every: int, started: float, lookup_losses: list[float] = ()
) -> None:
    if step % every == 0 or step == steps:
        recent, lookups = losses[-every:], lookup_losses[-every:]
        lookup = f"  lookup {sum(lookups) / len(lookups):.3f}" if lookups else ""
        print(
            f"{name} {step}/{steps}  loss {sum(recent) / len(recent):.4f}{lookup}  {time.time() - started:.0f}s",
            flush=True,
        )


def vision_features(model, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the image tokens as the language model gets them, [images, IMAGE_TOKENS, width]; the vision tower's last
    layer, which the projector reads)."""
    outputs = model.model.get_image_features(
        pixel_values=pixels, vision_feature_layer=-1, vision_feature_select_strategy="full"
    )
    return torch.stack(list(outputs.pooler_output)), outputs.hidden_states[-1]


def attention_in_float32(module, query, key, value, attention_mask, **kwargs):
    """The model's attention in float32 under the training's bfloat16 autocast. On 2 cores of an AVX512-BF16 CPU,
    PyTorch's CPU flash attention runs forward and backward in about 3/4 of the time in float32 that it takes in
    bfloat16, and it is a third of a step: a full build's steps took 1.0 s instead of 1.28 s."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(query.dtype), weights


def pretrain_vision(
    model, tokenizer, processor, rng, steps: int, log_every: int = 100, batch: int = VISION_BATCH
) -> dict:
    """Before the language model: the vision tower, the projector and the output layer alone learn the slot loss
    on batches of images, which cost a fifth of a language model step; the tower also learns what each patch holds
    (kinds_loss), through a probe thrown away after."""
    word_ids = word_ids_of(tokenizer)
    probe = torch.nn.Linear(model.config.vision_config.hidden_size, 1 + len(data.SHAPES))
    params = [
        *model.model.vision_tower.parameters(),
        *model.model.multi_modal_projector.parameters(),
        *model.lm_head.parameters(),
        *probe.parameters(),
    ]
    optimizer = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate_factor(step, steps))
    started, losses = time.time(), []
    for step in range(1, steps + 1):
        pictures = [as_seen(rng, *data.shapes_image_and_map(rng)) for _ in range(batch)]
        pixels = processor.image_processor([p.image for p in pictures], return_tensors="pt")["pixel_values"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            features, tower_output = vision_features(model, pixels)
            loss = slot_loss(model, features, pictures, word_ids) + kinds_loss(probe, tower_output, pictures)
        losses.append(take_step(loss, params, optimizer, schedule))
        log_progress("vision step", step, steps, losses, log_every, started)
    return {"vision_steps": steps, "vision_seconds": round(time.time() - started)}


def save_base(path: Path, header: dict, model, optimizer, schedule, rng) -> None:
    """Everything the steps after the main ones start from, so that `--base` can skip the main ones."""
    torch.save(
        {
            "header": header,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "rng": rng.getstate(),
            "torch_rng": torch.get_rng_state(),
        },
        path,
    )
    print(f"saved the state after the main steps in {path}", flush=True)


def load_base(path: Path | None, header: dict) -> dict | None:
    """The state `save_base` kept in `path` for a build with this `header`; None when there is none yet."""
    if path is None or not path.exists():
        return None
    state = torch.load(path)
    found = {k: v for k, v in state["header"].items() if k in header}
    if found != header:
        sys.exit(
            f"{path} holds the main steps of a build with {found}, not {header}: delete it or give another --base."
        )
    print(f"resuming after the main steps from {path}", flush=True)
    return state


def train(
    model,
    tokenizer,
    processor,
    rng,
    held_out,
    steps: int,
    symbol_steps: int,
    log_every: int = 50,
    base: dict | None = None,
    save_base_as: tuple[Path, dict] | None = None,
    token_budget: int = TOKENS_PER_STEP,
) -> dict:
    """`steps` steps on the mix, then `symbol_steps` at the annealed rate with more of the sums as users type them.
    From `base` (`load_base`), only the latter; `save_base_as` (path, header) keeps the state between them.
    `token_budget`: the (padded) tokens of a step."""
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    word_ids = word_ids_of(tokenizer)
    projected = {}
    model.model.multi_modal_projector.register_forward_hook(lambda module, args, out: projected.update(out=out))
    captured = capture_lookup_inputs(model)
    answers = answer_word_ids(word_ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate_factor(step, steps))
    model.train()
    started, step, losses, lookup_losses = time.time(), 0, [], []
    if base is not None:
        model.load_state_dict(base["model"])
        optimizer.load_state_dict(base["optimizer"])
        schedule.load_state_dict(base["schedule"])
        rng.setstate(base["rng"])
        torch.set_rng_state(base["torch_rng"])
        step, started = steps, started - base["header"]["train_seconds"]  # the figures count the main steps too
    total = steps + symbol_steps
    while step < total:
        symbol_phase = step >= steps
        phase_end = total if symbol_phase else steps
        for input_ids, mask, labels, extra, pictures, lookups in make_batches(
            rng,
            held_out,
            tokenizer,
            image_id,
            processor,
            pool=256,
            token_budget=token_budget,
            image_share=IMAGES_FIRST_SHARE if step < IMAGES_FIRST_STEPS else IMAGE_SHARE,
            shares=LATER_MIX if symbol_phase else data.Shares(),
        ):
            with torch.autocast("cpu", dtype=torch.bfloat16):  # the forward only: about 1.3x the steps of fp32
                loss = model(input_ids=input_ids, attention_mask=mask, labels=labels, **extra).loss
                if pictures:
                    loss = loss + slot_loss(model, projected["out"], pictures, word_ids)
                if lookups and step < IMAGES_FIRST_STEPS:
                    looked_up = lookup_loss(model, captured, lookups, answers)
                    lookup_losses.append(looked_up.item())
                    loss = loss + looked_up
            losses.append(take_step(loss, model.parameters(), optimizer, schedule))
            step += 1
            log_progress(
                "step", step, total, losses, log_every, started, lookup_losses if step <= IMAGES_FIRST_STEPS else ()
            )
            if step == steps:
                print(f"loss at step {steps}, before the symbol steps: {losses[-1]:.4f}", flush=True)
                if save_base_as is not None:
                    path, header = save_base_as
                    header = header | {"train_seconds": round(time.time() - started)}
                    save_base(path, header, model, optimizer, schedule, rng)
            if step >= phase_end:
                break
    model.eval()
    return {
        "steps": steps,
        "symbol_steps": symbol_steps,
        "train_seconds": round(time.time() - started),
        "final_loss": round(losses[-1], 4),
    }
