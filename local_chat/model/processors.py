"""A checkpoint's processor (models that see or hear): loaded with PIL image processors where it can have them,
without the part transformers would make with torchvision (a video processor: the chat sends images only;
Phi-4-multimodal's image processor: it hears), Voxtral's through mistral-common (voxtral.py), and picklable to the web
server's process even where its class was made here. A processor that cannot load is one sentence."""

from __future__ import annotations

import functools
import importlib.util
import json
import types
from pathlib import Path

import torch
from transformers.processing_utils import ProcessorMixin

from local_chat.errors import UserError, described

from .voxtral import VoxtralChatProcessor, is_voxtral, voxtral_processor


def load_processor(folder: Path, config, remote: dict):
    """The folder's processor, with PIL image processors where it can have them. Without torchvision, which
    transformers' video processors need (Qwen2-VL's, say), a processor that also takes videos loads without its
    video processor: the chat sends images only; a model that hears whose image processor needs it
    (Phi-4-multimodal's) loads without its image processor: it hears, and takes no image here."""
    if is_voxtral(config):  # its prompts are mistral-common's
        return voxtral_processor(folder)
    try:
        return _auto_processor(folder, remote, backend="pil")
    except ImportError:  # a part with no PIL backend: transformers' own choice (torchvision where it loads)
        try:
            return _auto_processor(folder, remote)
        except ImportError:
            processor = _without_torchvision(folder, config, remote)
            if processor is None:
                raise
            return processor


def _auto_processor(folder: Path, remote: dict, **backend):
    """AutoProcessor's processor; a part whose backends do not load here (an image processor that needs torchvision:
    Llama 4's, Phi-4-multimodal's) is an ImportError."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(folder, **backend, **remote)
    except ValueError as exc:
        if "Missing optional dependencies" in str(exc):
            raise ImportError(str(exc)) from exc
        raise


def _without_torchvision(folder: Path, config, remote: dict):
    """The processor less its part that needs torchvision, or None where none can be left out."""
    if saved_processor_class(folder) == "PixtralProcessor":
        return pixtral_processor_class().from_pretrained(folder, backend="pil", **remote)
    processor_class = registered_processor_class(config)
    parts = processor_class.get_attributes() if processor_class is not None else []
    if "video_processor" in parts:
        return images_only(processor_class).from_pretrained(folder, backend="pil", **remote)
    if "image_processor" in parts and hasattr(config, "audio_config"):  # it hears without its eyes
        return sounds_only(processor_class).from_pretrained(folder, **remote)
    return None


def text_tokenizer(processor):
    """The tokenizer the engine streams and holds text with: the processor's own, or Voxtral's tekken.json converted
    (its processor's is mistral-common's, which renders prompts)."""
    return processor.text_tokenizer if isinstance(processor, VoxtralChatProcessor) else processor.tokenizer


def saved_processor_class(folder: Path) -> str | None:
    """The processor class a checkpoint's processor_config.json names, or None."""
    try:
        return json.loads((folder / "processor_config.json").read_text()).get("processor_class")
    except (OSError, ValueError):
        return None


@functools.cache
def pixtral_processor_class():
    """Pixtral's processor (Ministral 3's, Mistral Small 3's): transformers refuses it without torchvision, which it
    needs for one helper only, the image size after resizing; its PIL image processor's module has the same one."""
    import sys

    name = "transformers.models.pixtral.image_processing_pixtral"
    if importlib.util.find_spec("torchvision") is None and name not in sys.modules:
        from transformers.models.pixtral import image_processing_pil_pixtral as pil

        stand_in = types.ModuleType(name)
        stand_in.get_resize_output_image_size = pil.get_resize_output_image_size
        sys.modules[name] = stand_in
    from transformers.models.pixtral.processing_pixtral import PixtralProcessor

    class Pixtral(PixtralProcessor):
        def __reduce__(self):  # the web server's process makes its module stand in too before it unpickles one
            return _rebuilt, (pixtral_processor_class, (), self.__dict__)

    Pixtral.__name__ = PixtralProcessor.__name__  # what a saved processor_config.json names
    return Pixtral


def registered_processor_class(config):
    """The processor class transformers registers for `config`'s model type, or None."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    return PROCESSOR_MAPPING.get(type(config), None)


class _WithoutPart(ProcessorMixin):
    """Between a processor and transformers' `ProcessorMixin`: the part its `__init__` passes on (None) as `left_out`
    names it, by name or in its place among the others (Qwen2.5-Omni's video processor, second), is left out."""

    left_out = "video_processor"

    def __init__(self, *args, **kwargs):
        kwargs.pop(self.left_out, None)
        own = type(self).__mro__[1].get_attributes()  # the processor's own parts, the one left out among them
        if self.left_out in own and len(args) > own.index(self.left_out):
            at = own.index(self.left_out)
            args = args[:at] + args[at + 1 :]
        super().__init__(*args, **kwargs)


@functools.cache
def without_part(processor_class, part: str):
    """`processor_class` with no `part` to load or check (its "video_processor" or "image_processor", which need
    torchvision): the other parts, the text and the chat template are its own."""

    class Without(processor_class, _WithoutPart):
        left_out = part
        __init__ = _optional(processor_class.__init__, part)

        @classmethod
        def get_attributes(cls) -> list[str]:
            return [name for name in processor_class.get_attributes() if name != part]

        @classmethod
        def _get_arguments_from_pretrained(cls, *args, **kwargs):
            """The parts as loaded, with None in the left-out part's place, so that an `__init__` that takes it
            before others (Qwen2.5-Omni's video processor, second; Phi-4-multimodal's image processor, first) gets
            each part in its own."""
            parts = list(super()._get_arguments_from_pretrained(*args, **kwargs))
            at = processor_class.get_attributes().index(part)
            return parts[:at] + [None] + parts[at:]

        def __reduce__(self):  # made here, the class pickles as how to make it (the web server's process gets one)
            return _rebuilt, (without_part, (processor_class, part), self.__dict__)

    Without.__name__ = processor_class.__name__  # what a saved processor_config.json names
    return Without


def left_out_part(processor) -> str | None:
    """The part a processor was loaded without (`without_part`), or None."""
    return processor.left_out if isinstance(processor, _WithoutPart) else None


def images_only(processor_class):
    """`processor_class` with no video processor (the chat sends images only)."""
    return without_part(processor_class, "video_processor")


def sounds_only(processor_class):
    """`processor_class` with no image processor (Phi-4-multimodal's needs torchvision): the model hears, and takes
    no image here."""
    return without_part(processor_class, "image_processor")


def _optional(init, part: str):
    """A processor's `__init__` whose `part` defaults to None (Gemma 4's asks for a video processor): the same code,
    so that transformers still reads its parameters from it."""
    code, defaults = init.__code__, init.__defaults__ or ()
    names = code.co_varnames[1 : code.co_argcount]
    if part not in names or names.index(part) != len(names) - len(defaults) - 1:
        return init  # it has a default already (Qwen2-VL's), or required parameters follow it
    optional = types.FunctionType(code, init.__globals__, init.__name__, (None, *defaults), init.__closure__)
    optional.__kwdefaults__ = init.__kwdefaults__
    return optional


def _rebuilt(make_class, args: tuple, state: dict):
    """A processor of a class made here (`make_class(*args)`), as pickle brings it to another process."""
    processor = object.__new__(make_class(*args))
    processor.__dict__.update(state)
    return processor


def broken_torchvision() -> str | None:
    """Why an installed torchvision does not import (PyPI's wheel beside the CPU build of torch: "operator
    torchvision::nms does not exist"), or None. transformers then fails to import every image processor."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision  # noqa: F401
    except Exception as exc:
        return described(exc)
    return None


def missing_package_error(folder: Path, model_type: str, exc: ImportError) -> UserError:
    if (problem := broken_torchvision()) is not None:
        return UserError(
            f"torchvision is installed but does not load beside torch {torch.__version__} ({problem}), "
            "and transformers' image processors fail with it: pip uninstall torchvision, or install the "
            "release built for this torch."
        )
    text = str(exc)
    if "torchvision" in text.lower() or "video processor" in text.lower():  # processors made for torchvision only
        return UserError(
            f"{folder} holds a {model_type} model, whose processor needs torchvision, which is not "
            f"installed or does not load beside torch {torch.__version__}: pip install the torchvision "
            "release built for this torch (pytorch.org lists them), or load another model."
        )
    first_line = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return UserError(
        f"{folder} holds a {model_type} model that needs a package this machine lacks ({first_line}); "
        "install it with pip, or load another model."
    )
