"""Voxtral (Mistral's models that hear): a folder with tekken.json and no Jinja chat template, whose prompts
mistral-common renders (`VoxtralProcessor.apply_chat_template`, through transformers' `MistralCommonBackend`).

The chat layer renders a conversation to text first and tokenizes it with its media after (as for every family), so
`VoxtralChatProcessor` does mistral-common's work in those two steps, with the same tokens in the end:
- `apply_chat_template(..., tokenize=False)`: mistral-common's rendering, decoded with its control tokens as text,
  each recording one `[BEGIN_AUDIO][AUDIO]` (as Qwen2-Audio's template writes one marker a clip);
- called on that text with the clips: each marker becomes mistral-common's own tokens for its clip, the text between
  control tokens is encoded as mistral-common encodes it (tekken, no BOS or EOS), and the features are the
  processor's own (30-second chunks of 128 mel bins).
The engine's own tokenizer (streamed text, grammars) is transformers' conversion of tekken.json (`tekken_tokenizer`).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import io
import re
from pathlib import Path

import numpy as np
import torch
from transformers import BatchFeature, VoxtralProcessor

from local_chat.errors import UserError

BEGIN_AUDIO, AUDIO = "[BEGIN_AUDIO]", "[AUDIO]"
AUDIO_MARKER = BEGIN_AUDIO + AUDIO  # one recording in the rendered text
_AUDIO_RUN = re.compile(re.escape(BEGIN_AUDIO) + f"(?:{re.escape(AUDIO)})+")
RENDERED_BY = "mistral-common"  # what stands for the chat template: the rendering is mistral-common's


@functools.cache
def _silence_base64() -> str:
    """A WAV of one silent sample: what a recording is rendered as (its tokens are compacted to one marker)."""
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(1, dtype=np.float32), 16_000, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()


class VoxtralChatProcessor(VoxtralProcessor):
    """Voxtral's processor, rendering and tokenizing as the chat layer asks (see the module's text);
    `text_tokenizer`: the engine's tokenizer (`tekken_tokenizer`)."""

    text_tokenizer = None

    def __init__(self, feature_extractor, tokenizer):
        super().__init__(feature_extractor, tokenizer)
        self.chat_template = RENDERED_BY
        tekken = self._instruct.tokenizer
        self._control = {tekken.id_to_piece(i): i for i in range(tekken.num_special_tokens)}
        names = sorted(self._control, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(name) for name in names) + ")")

    @property
    def _instruct(self):
        """mistral-common's instruct tokenizer (its tekken tokenizer and audio encoder)."""
        return self.tokenizer.tokenizer.instruct_tokenizer

    def apply_chat_template(self, conversation, chat_template=None, tools=None, tokenize=False, **kwargs):
        if tokenize:  # transformers' own path, in one step
            return super().apply_chat_template(conversation, chat_template, tools, tokenize=True, **kwargs)
        kwargs.pop("add_generation_prompt", None)  # mistral-common's prompt always ends ready for the answer
        silence = {"type": "audio", "base64": _silence_base64()}
        chat = [
            {**m, "content": [silence if p.get("type") == "audio" else p for p in m["content"]]}
            if isinstance(m.get("content"), list)
            else m
            for m in conversation
        ]
        answered = chat[-1].get("role") == "assistant" and not kwargs.get("continue_final_message")
        if answered:  # a finished answer, written as mistral-common writes the earlier ones: its text, then EOS
            kwargs["continue_final_message"] = True
        ids = self.tokenizer.apply_chat_template(chat, tools=tools, tokenize=True, return_dict=False, **kwargs)
        ids += [self._instruct.tokenizer.eos_id] if answered else []
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return _AUDIO_RUN.sub(AUDIO_MARKER, text)

    def __call__(self, text=None, images=None, audio=None, sampling_rate=None, add_special_tokens=False, **kwargs):
        """The token ids of a rendered prompt (`apply_chat_template`'s text) with its recordings (16 kHz arrays, one
        for each `[BEGIN_AUDIO][AUDIO]`), and their features."""
        clips = list(audio or [])
        shown = text.count(AUDIO_MARKER)
        if shown != len(clips):
            raise UserError(f"The prompt has {shown} recordings ({AUDIO_MARKER}) for {len(clips)}; give one each.")
        tekken, ids, heard = self._instruct.tokenizer, [], iter(clips)
        if add_special_tokens:
            ids.append(tekken.bos_id)
        rate = sampling_rate or self.feature_extractor.sampling_rate
        for piece in self._split.split(text.replace(AUDIO_MARKER, BEGIN_AUDIO)):
            if piece == BEGIN_AUDIO:
                ids += self._audio_tokens(next(heard), rate)
            elif piece in self._control:
                ids.append(self._control[piece])
            elif piece:
                ids += tekken.encode(piece, bos=False, eos=False)
        data = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        if clips:
            settings = dict(self.audio_kwargs)
            chunk_positions = settings.pop("max_source_positions")
            data["input_features"] = self._retrieve_input_features(clips, chunk_positions, **settings)
        return BatchFeature(data)

    def _audio_tokens(self, samples: np.ndarray, rate: int) -> list[int]:
        """mistral-common's tokens for one recording: [BEGIN_AUDIO] and an [AUDIO] per 80 ms of its 30-second
        chunks."""
        from mistral_common.tokens.tokenizers.audio import Audio

        encoder = self._instruct.audio_encoder
        return encoder.encode_audio(Audio(np.asarray(samples, dtype=np.float32), rate, "wav")).tokens


def is_voxtral(config) -> bool:
    return getattr(config, "model_type", None) == "voxtral"


def voxtral_processor(folder: Path) -> VoxtralChatProcessor:
    """The folder's `VoxtralChatProcessor` (mistral-common is what renders Voxtral's prompts)."""
    from transformers import AutoProcessor

    if importlib.util.find_spec("mistral_common") is None:
        raise UserError(
            f"{folder} holds a Voxtral model, whose prompts mistral-common renders, and it is not installed; "
            "install the voxtral extra (pip install -e '.[voxtral]')."
        )
    loaded = AutoProcessor.from_pretrained(folder)
    processor = VoxtralChatProcessor(loaded.feature_extractor, loaded.tokenizer)
    processor.text_tokenizer = tekken_tokenizer(folder, processor)
    return processor


def tekken_tokenizer(folder: Path, processor: VoxtralChatProcessor):
    """transformers' conversion of the folder's tekken.json (a fast tokenizer: streamed text, grammars), with the
    control tokens mistral-common names (BOS, EOS, padding, unknown)."""
    from transformers import TokenizersBackend

    tekken = processor._instruct.tokenizer
    named = dict(bos_token=tekken.bos_id, eos_token=tekken.eos_id, pad_token=tekken.pad_id, unk_token=tekken.unk_id)
    return TokenizersBackend.from_pretrained(folder, **{k: tekken.id_to_piece(i) for k, i in named.items()})
