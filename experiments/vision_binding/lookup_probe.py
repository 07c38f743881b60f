"""Where a built model looks when it names a shape's colour, teacher-forced on new images.

    PYTHONPATH=. python experiments/vision_binding/lookup_probe.py /tmp/demo-model [--images 100]

For "What color is the SHAPE?" about a shape in the image, at the position where the answer "The SHAPE is ..."
names the colour, prints the share of images where: the lookup head attends most to the asked shape's image token;
the head's own output, read by the output layer, ranks the right colour first among the colours and "not"; the
asked shape's image token reads as the right colour (the slot loss's words); and the model's next word is right.
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
    parser.add_argument("--images", type=int, default=100)
    args = parser.parse_args()
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    import model  # noqa: F401  (registers the vision tower's type)

    processor = AutoProcessor.from_pretrained(args.folder)
    llava = LlavaForConditionalGeneration.from_pretrained(args.folder, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    tokenizer = processor.tokenizer
    word_ids = build.word_ids_of(tokenizer)
    answers = build.answer_word_ids(word_ids)
    attention = llava.model.language_model.layers[build.LOOKUP_LAYER].self_attn
    head_inputs = {}
    attention.o_proj.register_forward_pre_hook(lambda module, inputs: head_inputs.update(x=inputs[0]))
    head = build.head_columns(attention, build.LOOKUP_HEAD)[0]
    rng = random.Random(3)
    right = dict.fromkeys(("looks at the asked token", "head reads the colour", "token reads the colour",
                           "answer"), 0)
    for _ in range(args.images):
        image, shapes = data.shapes_image(rng)
        _, kind = rng.choice(shapes)
        turn = data.colour_turn(kind, shapes)
        encoded = build.encode(data.Sample([turn], "conversation", image, shapes), tokenizer,
                               tokenizer.convert_tokens_to_ids("<image>"))
        query, key, word = encoded.lookups[-1]
        picture = build.as_seen(rng, image, shapes)
        pixels = processor.image_processor([picture.image], return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            out = llava(input_ids=torch.tensor([encoded.ids]), pixel_values=pixels, output_attentions=True)
            brought = torch.nn.functional.linear(head_inputs["x"][0, query, head], attention.o_proj.weight[:, head])
            head_read = llava.lm_head(brought)
            token_read = build.slot_logits(llava, build.vision_features(llava, pixels)[0])[0, key - 1]
        looked = out.attentions[build.LOOKUP_LAYER][0, build.LOOKUP_HEAD, query]
        right["looks at the asked token"] += looked.argmax() == key
        right["head reads the colour"] += answers[head_read[answers].argmax()] == word
        right["token reads the colour"] += answers[token_read[answers].argmax()] == word
        right["answer"] += out.logits[0, query].argmax() == word
    for name, count in right.items():
        print(f"{name}: {int(count) / args.images:.0%}")


if __name__ == "__main__":
    main()
