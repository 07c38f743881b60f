"""A tiny LLaVA answers about an image through both Accessory transforms, from PIL images and from tensors."""

import json

import pytest
import torch
from PIL import Image

from fixtures import tiny_models
from local_chat.errors import UserError
from local_chat.model.image import CLIP_MEAN, get_transform, shape_image
from local_chat.model.meta import MetaModel
from local_chat.model.vision_stem import MODEL_TYPE, ConvStemCLIPVisionModel


@pytest.fixture(scope="module")
def llava(llava_dir):
    return MetaModel.from_pretrained(str(llava_dir), with_visual=True, max_seq_len=2048)


def red_square_on_wide_canvas() -> Image.Image:
    img = Image.new("RGB", (120, 60), (240, 240, 240))
    img.paste((220, 20, 20), (70, 10, 110, 50))
    return img


def test_vision_model_reports_its_image_size(llava):
    assert llava.engine.sees_images and llava.llma.image_size == 32 == llava.engine.encoder.image_size


@pytest.mark.parametrize("transform", ["padded_resize", "resized_center_crop"])
def test_llava_answers_about_an_image_with_each_transform(llava, transform):
    pieces = list(
        llava.stream_generate(
            "What is in the image?", image=red_square_on_wide_canvas(), max_gen_len=10, image_transform=transform
        )
    )
    assert pieces[-1]["completion_tokens"] >= 1 and pieces[-1]["end_of_content"]


def test_the_image_changes_the_answer(llava):
    blank = llava.generate(["What is in the image?"], images=[Image.new("RGB", (32, 32), "black")], max_gen_len=12)
    red = llava.generate(["What is in the image?"], images=[red_square_on_wide_canvas()], max_gen_len=12)
    inputs = llava.engine.encoder.prepare_inputs(["What is in the image?"], [red_square_on_wide_canvas()])
    image_id = llava.processor.tokenizer.convert_tokens_to_ids("<image>")
    assert (inputs.input_ids == image_id).sum() == 16  # (32 / 8) ** 2 patches, placed before the prompt
    assert inputs.input_ids[0, 0] == llava.tokenizer.bos_id and inputs.input_ids[0, 1] == image_id
    assert blank != red


def test_the_demo_models_conv_stem_tower_loads_and_gives_clips_patch_grid(tmp_path):
    folder = tiny_models.save_tiny_llava(tmp_path / "stem", conv_stem=True)
    assert json.loads((folder / "config.json").read_text())["vision_config"]["model_type"] == MODEL_TYPE
    stem = MetaModel.from_pretrained(str(folder), with_visual=True, max_seq_len=2048)
    assert isinstance(stem.llma.model.vision_tower, ConvStemCLIPVisionModel)
    inputs = stem.engine.encoder.prepare_inputs(["What is in the image?"], [red_square_on_wide_canvas()])
    assert (inputs.input_ids == stem.processor.tokenizer.convert_tokens_to_ids("<image>")).sum() == 16
    blank = stem.generate(["What is in the image?"], images=[Image.new("RGB", (32, 32), "black")], max_gen_len=12)
    assert blank != stem.generate(["What is in the image?"], images=[red_square_on_wide_canvas()], max_gen_len=12)


def test_transforms_pad_or_crop_before_the_processor(llava):
    img = red_square_on_wide_canvas()
    padded = shape_image(img, "padded_resize", 32)
    cropped = shape_image(img, "resized_center_crop", 32)
    assert padded.size == cropped.size == (32, 32)
    assert padded.getpixel((16, 1)) == tuple(int(c * 255) for c in CLIP_MEAN)  # padding colour is the mean
    assert cropped.getpixel((16, 1)) != padded.getpixel((16, 1))


@pytest.mark.parametrize("transform", ["padded_resize", "resized_center_crop"])
def test_accessory_tensor_path_equals_the_processor_path(llava, transform):
    img = red_square_on_wide_canvas()
    tensor = get_transform(transform, llava.llma.image_size)(img)
    processed = llava.engine.encoder.prepare_inputs(["x"], [img], image_transform=transform).extra["pixel_values"]
    torch.testing.assert_close(tensor[None], processed, atol=1e-5, rtol=0)
    from_tensor = llava.generate(["What is in the image?"], images=tensor[None], max_gen_len=10)
    from_pil = llava.generate(["What is in the image?"], images=[img], max_gen_len=10, image_transform=transform)
    assert from_tensor == from_pil


def test_prompt_that_already_has_the_placeholder_is_left_alone(llava):
    img = red_square_on_wide_canvas()
    placed = llava.engine.encoder.prepare_inputs(["USER: <image>\nWhat is it? ASSISTANT:"], [img]).input_ids
    image_id = llava.processor.tokenizer.convert_tokens_to_ids("<image>")
    assert (placed == image_id).sum() == 16 and placed[0, 1] != image_id


def test_text_only_question_to_a_vision_model(llava):
    assert list(llava.stream_generate("Hello", max_gen_len=5))[-1]["completion_tokens"] == 5


def test_wrong_size_tensor_is_one_clear_error(llava):
    with pytest.raises(UserError, match=r"this model takes 32x32; build it with get_transform"):
        llava.generate(["x"], images=torch.zeros(1, 3, 224, 224))


def test_quantized_llava_keeps_the_vision_side_in_full_precision(llava_dir):
    from local_chat.model.cpu_linear import Int4Linear

    model = MetaModel.from_pretrained(str(llava_dir), with_visual=True, quant=4)
    quantized = [n for n, m in model.llma.named_modules() if isinstance(m, Int4Linear)]
    assert quantized and not [n for n in quantized if "vision_tower" in n or "projector" in n or "lm_head" in n]
    assert model.generate(["What is in the image?"], images=[red_square_on_wide_canvas()], max_gen_len=4)


def test_the_flags_offer_the_models_own_transforms_and_auto():
    """The flags' list is written out (they load no torch); it must name model.image's transforms, and auto."""
    from local_chat.defaults import IMAGE_TRANSFORMS
    from local_chat.model.image import TRANSFORMS

    assert IMAGE_TRANSFORMS == ("auto", *TRANSFORMS)


def test_the_prompt_panel_shows_where_the_images_went(llava, tmp_path):
    """The page's "Prompt sent to the model" shows the processor's marker for each image the template left out."""
    from fixtures.app_server import submit
    from local_chat.ui.chat import Cancels
    from local_chat.ui.chat_tab import ChatTab
    from local_chat.ui.history import SavedChats

    path = tmp_path / "red.png"
    Image.new("RGB", (32, 32), "red").save(path)
    chat = ChatTab(llava.engine, Cancels(), "default", "auto", SavedChats(None))
    marker = llava.engine.summary().image_marker
    assert marker.strip() == llava.processor.image_token
    _, _, prompt, *_ = submit(chat, {"text": "What is it?", "files": [str(path), str(path)]})
    assert prompt.startswith(marker * 2 + "A chat between") and prompt.count(marker.strip()) == 2
    _, _, prompt, *_ = submit(chat, "What is it?")
    assert marker.strip() not in prompt
