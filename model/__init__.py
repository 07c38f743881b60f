"""The inference core: `MetaModel` (loading and generation) and Accessory's image transforms."""

from . import vision_stem  # noqa: F401  (registers the demo model's vision tower with transformers)
from .answer_stream import AnswerStream
from .errors import UserError
from .footprint import weight_bytes
from .generation import ModelInputs, generate_tokens
from .image import TRANSFORMS, get_transform
from .meta import MetaModel

__all__ = [
    "MetaModel",
    "UserError",
    "get_transform",
    "TRANSFORMS",
    "ModelInputs",
    "AnswerStream",
    "generate_tokens",
    "weight_bytes",
]
