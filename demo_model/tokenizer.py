"""The demo model's tokenizer: a byte-level BPE trained on its own samples, digits one per token."""

from __future__ import annotations

import random

from . import data
from .recipe import CHAT_TEMPLATE, SPECIAL_TOKENS, VOCAB_SIZE
from .samples import segments

# ----- tokenizer -----


def train_tokenizer(rng: random.Random, held_out: set):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["".join(t for t, _ in segments(data.training_sample(rng, held_out))) for _ in range(4000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Digits one per token (arithmetic is learnt digit by digit), then GPT-2's byte-level pre-tokenizer.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
