"""LLaMA2-Accessory's import path for the model, `from model import MetaModel` (Accessory: `accessory.model.meta`)
and `from model import get_transform` (`accessory.data.transform`): a face of local_chat/model/. Importing it registers
the demo model's vision tower with transformers."""

from local_chat.errors import UserError
from local_chat.model.answer_stream import AnswerStream
from local_chat.model.footprint import weight_bytes
from local_chat.model.generation import ModelInputs, generate_tokens
from local_chat.model.image import TRANSFORMS, get_transform
from local_chat.model.meta import MetaModel

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
