"""Speculative decoding from the prompt (--speculative ngram, model/speculative.py) against plain decoding
(--speculative off), the demo model, greedy, decode tokens/s of the same answers, interleaved:

- `speculative_quote_over_plain`: an answer that quotes a 1,600-token document given in the question (the demo
  model holds 2,048 tokens: the document, the question and the answer). The demo
  model does not quote well by itself, so its output layer is made to choose the document's next token at every
  position it computes (its forward passes run whole; only the choice is forced): a model that quotes exactly, as a
  trained one asked to quote a passage does. `speculative_quote_accepted`: the share of guessed tokens taken.
- `speculative_chat_over_plain`: the demo model's own answers to chat questions (nothing forced), where guesses are
  rarely right. `speculative_chat_accepted`: the share taken.
- `speculative_draft_chat_over_plain`: the same questions answered by a model 10 times the demo model's depth whose
  added layers' output projections are zero (each adds nothing: the demo model's answers at about 10 times its
  compute; honest guesses without a trained big model), with the demo model as its --draft_model, over it alone.
  `speculative_draft_accepted`: the share of the draft's guesses taken.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

from local_chat.engine.chats import ChatEngine
from local_chat.engine.interface import Request, Sampling, collect
from local_chat.model.meta import MetaModel
from local_chat.prompting import default_template

from .timing import interleaved_values, median_ratio

QUESTIONS = [
    "What is the capital of France?",
    "Tell me a story about a cat who learns to fly.",
    "Explain how rain forms.",
    "Give me three tips for learning to cook.",
    "Who are you?",
    "Write a short poem about the sea.",
    "What is 23 plus 45?",
    "Describe your favourite city.",
]


def document(tokens: int, count) -> str:
    """Made-up prose of about `tokens` tokens as `count(text)` counts them: sentences of made-up words, a few common
    and most rare (as a language's are: bench/history.py's vocabulary)."""
    from .history import vocabulary

    rng = random.Random(0)
    words, weights = vocabulary()
    sentences, size = [], 0
    while size < tokens:
        sentences.append(" ".join(rng.choices(words, weights, k=rng.randint(6, 14))).capitalize() + ".")
        size += count(" " + sentences[-1])
    return " ".join(sentences)


class Quoting:
    """The model's output layer made to choose `target`'s tokens (the prompt's, then the quote's) at every position
    its forward passes compute: each pass runs whole, only the choice is forced."""

    def __init__(self, model: MetaModel, target: list[int]):
        self.llma, self.target = model.llma, target
        self.original = self.llma.forward
        self.llma.forward = self.forward

    def forward(self, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        positions = kwargs.get("position_ids")
        start = int(positions[0, 0]) if positions is not None else cache.get_seq_length()
        fed = kwargs["input_ids"].shape[1]
        out = self.original(*args, **kwargs)
        kept = out.logits.shape[1]
        last = len(self.target) - 1
        chosen = [self.target[min(p + 1, last)] for p in range(start + fed - kept, start + fed)]
        out.logits.fill_(-1e4)
        out.logits[0, torch.arange(kept), torch.tensor(chosen)] = 1e4
        return out

    def remove(self) -> None:
        self.llma.forward = self.original


def deepened(demo: Path, folder: Path, times: int) -> Path:
    """The demo model with `times` as many decoder layers: each added one a copy of one of its own, with its
    attention's and MLP's output projections zero, so it adds nothing to what flows through: the same answers."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(demo, folder)
    config = json.loads((demo / "config.json").read_text())
    layers = config["text_config"]["num_hidden_layers"]
    state = load_file(demo / "model.safetensors")
    prefix = "language_model.model.layers."
    for added in range(layers, layers * times):
        source = f"{prefix}{added % layers}."
        for key in [k for k in state if k.startswith(source)]:
            tensor = state[key].clone()
            if key.endswith(("o_proj.weight", "down_proj.weight")):
                tensor.zero_()
            state[f"{prefix}{added}." + key.removeprefix(source)] = tensor
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config["text_config"]["num_hidden_layers"] = layers * times
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def chat_answer(model: MetaModel, question: str, tokens: int):
    chats = ChatEngine(model.engine, default_template(model.engine, None))
    request = Request(messages=[{"role": "user", "content": question}], sampling=Sampling(tokens, temperature=0.0))
    return collect(chats.stream(request)).end


def run(settings, demo: MetaModel) -> dict[str, float]:
    from local_chat.defaults import DEMO_MODEL

    plain = MetaModel.from_pretrained(str(DEMO_MODEL), speculative="off")
    guessing = demo if demo.engine.decoding.speculative == "ngram" else MetaModel.from_pretrained(str(DEMO_MODEL))
    count = lambda text: len(guessing.tokenizer.hf.encode(text, add_special_tokens=False))  # noqa: E731
    text = document(settings.speculative_document_tokens, count)
    question = f"{text}\n\nQuote the text above, word for word."
    prompt = ChatEngine(guessing.engine, default_template(guessing.engine, None))
    rendered = next(prompt.stream(Request(messages=[{"role": "user", "content": question}], sampling=Sampling(1))))
    prompt_ids = guessing.engine.encoder.prepare_inputs([rendered.text]).input_ids[0].tolist()
    quote = guessing.tokenizer.hf.encode(text, add_special_tokens=False)[: settings.speculative_tokens]
    target = prompt_ids + quote + [next(iter(guessing.tokenizer.eos_ids))]
    accepted: dict[str, list[float]] = {"quote": [], "chat": []}

    def quoted(model: MetaModel) -> float:
        forcing = Quoting(model, target)
        try:
            end = chat_answer(model, question, settings.speculative_tokens + 1)
        finally:
            forcing.remove()
        assert end.token_ids == quote, "the forced quote went astray"
        if end.guessed_tokens:
            accepted["quote"].append(end.accepted_tokens / end.guessed_tokens)
        return end.decode_tokens_per_second

    def chatted(model: MetaModel) -> float:
        ends = [chat_answer(model, q, settings.speculative_tokens) for q in QUESTIONS]
        tokens, seconds = (
            sum(e.completion_tokens for e in ends),
            sum(e.total_time - e.time_to_first_token for e in ends),
        )
        guessed = sum(e.guessed_tokens for e in ends)
        if guessed:
            accepted["chat"].append(sum(e.accepted_tokens for e in ends) / guessed)
        return tokens / seconds

    rates = interleaved_values(
        {
            "quote_on": lambda: quoted(guessing),
            "quote_off": lambda: quoted(plain),
            "chat_on": lambda: chatted(guessing),
            "chat_off": lambda: chatted(plain),
        },
        settings.speculative_repeats,
        settings.warmups,
    )
    with tempfile.TemporaryDirectory() as folder:
        deep = deepened(Path(DEMO_MODEL), Path(folder) / "deep", settings.speculative_depth)
        deep_alone = MetaModel.from_pretrained(str(deep), speculative="off")
        deep_drafted = MetaModel.from_pretrained(str(deep), draft_model=str(DEMO_MODEL))
        accepted["draft"] = []

        def drafted(model: MetaModel, key: str | None) -> float:
            ends = [chat_answer(model, q, settings.speculative_tokens) for q in QUESTIONS]
            if key is not None and sum(e.guessed_tokens for e in ends):
                accepted[key].append(sum(e.accepted_tokens for e in ends) / sum(e.guessed_tokens for e in ends))
            return sum(e.completion_tokens for e in ends) / sum(e.total_time - e.time_to_first_token for e in ends)

        deep_rates = interleaved_values(
            {"on": lambda: drafted(deep_drafted, "draft"), "off": lambda: drafted(deep_alone, None)},
            settings.speculative_repeats,
            settings.warmups,
        )
    return {
        "speculative_draft_chat_over_plain": median_ratio(deep_rates["on"], deep_rates["off"]),
        "speculative_draft_accepted": statistics.median(accepted["draft"] or [0.0]),
        "speculative_quote_over_plain": median_ratio(rates["quote_on"], rates["quote_off"]),
        "speculative_quote_accepted": statistics.median(accepted["quote"] or [0.0]),
        "speculative_chat_over_plain": median_ratio(rates["chat_on"], rates["chat_off"]),
        "speculative_chat_accepted": statistics.median(accepted["chat"] or [0.0]),
    }
