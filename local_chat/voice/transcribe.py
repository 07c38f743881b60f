"""Speech in: `--stt_model DIR`, a Whisper folder (transformers' `WhisperForConditionalGeneration` and its processor),
turns a recording into text, on the CPU of the web server's process, loaded once. Clips longer than Whisper's 30 s
window are transcribed window after window by transformers' own long-form decoding."""

from __future__ import annotations

import threading
from pathlib import Path

from local_chat.errors import UserError, described

from .clips import Clip, resampled


class Transcriber:
    """A Whisper model and its processor: `transcribe(clip)` is the clip's text."""

    def __init__(self, folder: str):
        if not Path(folder, "config.json").is_file():
            raise UserError(
                f"--stt_model {folder} has no config.json; give a Whisper folder (such as openai/whisper-small)."
            )
        from transformers import AutoConfig, WhisperForConditionalGeneration, WhisperProcessor

        try:
            model_type = AutoConfig.from_pretrained(folder).model_type
            if model_type != "whisper":
                raise UserError(f"--stt_model {folder} is a {model_type} model; give a Whisper folder.")
            self.processor = WhisperProcessor.from_pretrained(folder)
            self.model = WhisperForConditionalGeneration.from_pretrained(folder).eval()
        except (OSError, ValueError, KeyError) as error:
            if isinstance(error, UserError):
                raise
            raise UserError(
                f"--stt_model {folder} cannot be loaded ({described(error)}); give a Whisper folder."
            ) from None
        self.name = Path(folder).name
        self.rate = self.processor.feature_extractor.sampling_rate
        self.multilingual = bool(getattr(self.model.generation_config, "is_multilingual", False))
        self._lock = threading.Lock()

    def transcribe(
        self, clip: Clip, language: str | None = None, prompt: str | None = None, task: str = "transcribe"
    ) -> str:
        """The clip's text; `language` (ISO 639-1, multilingual models) is else detected; `prompt` (words the
        recording holds: names, terms) guides the spelling; `task` "translate": its text in English (Whisper's
        translation, multilingual models)."""
        import torch

        if (language or task != "transcribe") and not self.multilingual:
            raise UserError(f"{self.name} hears English only; leave the language out, and it does not translate.")
        samples = resampled(clip, self.rate).samples
        past_one_window = len(samples) > self.processor.feature_extractor.n_samples  # long-form: not cut, not padded
        whole = dict(truncation=False, padding="longest") if past_one_window else {}
        features = self.processor(samples, sampling_rate=self.rate, return_tensors="pt", return_attention_mask=True,
                                  **whole)  # fmt: skip
        options = {"language": language, "task": task} if self.multilingual else {}
        options["num_beams"] = 1  # greedy: transformers' pipeline searches 5 beams, 3-5x the time on a CPU
        if prompt:
            options["prompt_ids"] = torch.tensor(self.processor.get_prompt_ids(prompt))
        with self._lock, torch.inference_mode():
            try:
                ids = self.model.generate(features.input_features, attention_mask=features.attention_mask, **options)
            except ValueError as error:  # a language Whisper does not know
                raise UserError(f"{self.name} cannot transcribe this ({described(error)}).") from None
        ids = ids.sequences if hasattr(ids, "sequences") else ids
        return self.processor.batch_decode(ids, skip_special_tokens=True)[0].strip()  # the prompt is not in `ids`
