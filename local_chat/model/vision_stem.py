"""The demo model's vision tower: CLIP's vision transformer with a small convolutional stem in place of its patch
embedding, registered with transformers as "clip_conv_stem_vision_model" when `model` is imported.

Why: CLIP cuts the image into patches and embeds each with one linear map. Trained from scratch on the demo's few
minutes of CPU, such a tower learnt every patch's colour (98%) but never which shape it held (32% on three kinds,
chance); four 3x3 convolutions with stride 2 learnt shapes within 1,000 steps (an experiment of November 2026 on
a branch that was not kept). The stem turns the image into the same grid of tokens as CLIP's patches, so the
processor, the number of image tokens and everything after the embedding are CLIP's.
"""

from __future__ import annotations

import math

from torch import nn
from transformers import AutoConfig, AutoModel, CLIPVisionConfig, CLIPVisionModel
from transformers.models.clip.modeling_clip import CLIPVisionEmbeddings

MODEL_TYPE = "clip_conv_stem_vision_model"


class ConvStemCLIPVisionConfig(CLIPVisionConfig):
    """CLIPVisionConfig plus `stem_channels`: the widths of the stem's convolutions before the last one, which
    gives `hidden_size`. There are log2(patch_size) convolutions, each halving the image side."""

    model_type = MODEL_TYPE

    def __init__(self, stem_channels: list[int] | None = None, **kwargs):
        super().__init__(**kwargs)
        convolutions = int(math.log2(self.patch_size))
        if 2**convolutions != self.patch_size:
            raise ValueError(f"The conv stem needs a power-of-two patch_size, not {self.patch_size}.")
        self.stem_channels = list(stem_channels or [16 * 2**i for i in range(convolutions - 1)])
        if len(self.stem_channels) != convolutions - 1:
            raise ValueError(f"stem_channels needs {convolutions - 1} widths for patch_size {self.patch_size}.")


class ConvStem(nn.Sequential):
    """3x3 convolutions with stride 2 and GELU between them, the last one linear (as CLIP's patch embedding is)."""

    def __init__(self, config: ConvStemCLIPVisionConfig):
        widths = [config.num_channels, *config.stem_channels, config.hidden_size]
        layers = []
        for index, (width_in, width_out) in enumerate(zip(widths, widths[1:])):
            layers += [nn.GELU()] if index else []
            layers.append(nn.Conv2d(width_in, width_out, kernel_size=3, stride=2, padding=1))
        super().__init__(*layers)

    @property
    def weight(self):
        """The last convolution's weight: CLIP's embedding code reads `patch_embedding.weight` for the input's dtype
        and initialises it as it would the patch embedding (normal, std 0.02: about PyTorch's own for that layer)."""
        return self[-1].weight


class ConvStemCLIPVisionEmbeddings(CLIPVisionEmbeddings):
    def __init__(self, config: ConvStemCLIPVisionConfig):
        super().__init__(config)
        self.patch_embedding = ConvStem(config)


class ConvStemCLIPVisionModel(CLIPVisionModel):
    config: ConvStemCLIPVisionConfig
    config_class = ConvStemCLIPVisionConfig

    def __init__(self, config: ConvStemCLIPVisionConfig):
        super().__init__(config)
        self.embeddings = ConvStemCLIPVisionEmbeddings(config)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, nn.Conv2d):  # the stem's: PyTorch's default, which keeps the activations' scale
            module.reset_parameters()
        else:
            super()._init_weights(module)


AutoConfig.register(MODEL_TYPE, ConvStemCLIPVisionConfig)
AutoModel.register(ConvStemCLIPVisionConfig, ConvStemCLIPVisionModel)
