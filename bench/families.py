"""The 2026 families for tests and benchmarks: tiny random models of their real classes with their published chat
templates (kept under tests/chat_templates, with SOURCES.md) and special tokens, and `ForcedAnswer`, which makes such
a model write what a trained one would.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "What is 12 plus 7? The answer is 19. The user asks about the weather; I call the tool.",
    "Hello! How can I help? It is sunny in Paris. Let me think about it step by step.",
] * 20
TEXT_CONFIG = dict(  # the tiny models' sizes (fixtures/tiny_models.py's too)
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)

TEMPLATES = Path(__file__).resolve().parent.parent / "tests" / "chat_templates"  # their texts, and SOURCES.md
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


# Qwen2's pre-tokenizer (its tokenizer.json), which llama.cpp knows as "qwen2"
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def qwen_tokenizer(
    chat_template: str,
    vocab_size: int = 400,
    specials: tuple[str, ...] = (),
    qwen_split: bool = False,
    added: tuple[str, ...] = (),
    every_byte: bool = True,
):
    """A byte-level BPE tokenizer with Qwen's markers as Qwen ships them: <|im_start|>, <|im_end|> and
    <|endoftext|> special (and `specials`: a vision model's), <think>, <tool_call> and their kin added but not special
    (they show in decoded text), and `added` too. `qwen_split`: Qwen2's own pre-tokenizer (a GGUF file's, see
    tests/gguf_models.py), else GPT-2's. `every_byte`: a token for each byte, as Qwen's; else only the corpus's
    characters (ASCII: no token ends inside a character, so a random model's text is always whole)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        if qwen_split
        else pre_tokenizers.ByteLevel(add_prefix_space=False)
    )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=QWEN_SPECIAL + list(specials),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if every_byte else _ascii_alphabet(),
        ),
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED + list(added)])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=QWEN_SPECIAL[1:] + list(specials),
    )
    hf.chat_template = chat_template
    return hf


def _ascii_alphabet() -> list[str]:
    """The byte-level alphabet's characters of the bytes 0-127 (GPT-2's `bytes_to_unicode`)."""
    shown = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    moved = [b for b in range(256) if b not in shown]
    return [chr(b) if b in shown else chr(256 + moved.index(b)) for b in range(128)]


def save_tiny_qwen3(
    folder: Path, seed: int = 0, config: dict = TEXT_CONFIG | {"head_dim": 16}, tokenizer=None, shaped=None
) -> Path:
    """A random Qwen3ForCausalLM (`config`'s sizes) with Qwen3's published chat template (qwen3.jinja), and
    `tokenizer` (default: `qwen_tokenizer`'s); `shaped(model, tokenizer)` sets its weights before it is saved."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = tokenizer or qwen_tokenizer((TEMPLATES / "qwen3.jinja").read_text())
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **config,
    )
    model = Qwen3ForCausalLM(config).eval()
    if shaped is not None:
        shaped(model, tokenizer)
    model.save_pretrained(folder)
    ends = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    GenerationConfig(eos_token_id=ends, pad_token_id=tokenizer.pad_token_id).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class ForcedAnswer:
    """Makes a model's greedy answer `text` (then its end token): a hook on its output layer puts each next token
    of the answer on top, for the last position of every forward pass. A tiny random model then writes what a
    trained one would, through every real step in between (the tokenizer, the template, the parser)."""

    def __init__(self, model, tokenizer, text: str, end_token: str):
        self.ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(end_token)]
        self.ends = {self.ids[-1]}  # the tokens that end an answer
        self.step = 0
        self.layer = model.get_output_embeddings()
        self.fed = None  # the token ids of the forward pass under way
        self.watch = model.register_forward_pre_hook(self._see_fed, with_kwargs=True)
        self.handle = self.layer.register_forward_hook(self._force)

    def _see_fed(self, module, args, kwargs):
        self.fed = kwargs.get("input_ids", args[0] if args else None)

    def _force(self, module, inputs, output):
        """The answer's next token on top at the last position; where a pass keeps several positions (a decided
        token and the tokens guessed after it, model/speculative.py), each position's own next token, and the answer
        goes on after the guesses the model takes."""
        kept = output.shape[-2] if output.dim() == 3 else 1
        if kept == 1 or self.fed is None or self.fed.shape[-1] != kept:
            token = self.ids[min(self.step, len(self.ids) - 1)]
            self.step += 1
            forced = torch.full_like(output[..., -1, :], -1e4)
            forced[..., token] = 1e4
            output = output.clone()
            output[..., -1, :] = forced
            return output
        wanted = [self.ids[min(self.step + i, len(self.ids) - 1)] for i in range(kept)]
        output = torch.full_like(output, -1e4)
        output[..., torch.arange(kept), torch.tensor(wanted)] = 1e4
        guessed, taken = self.fed[0, 1:].tolist(), 0
        while taken < len(guessed) and guessed[taken] == wanted[taken] and wanted[taken] not in self.ends:
            taken += 1  # an answer's end token ends it: what the pass chose after it is not the answer's
        self.step += taken + 1
        return output

    def again(self, text: str | None = None, tokenizer=None, end_token: str | None = None) -> None:
        """Answer from the start again (with a new `text` if given)."""
        if text is not None:
            self.ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(end_token)]
            self.ends.add(self.ids[-1])
        self.step = 0

    def in_turn(self, texts: list[str], tokenizer, end_token: str) -> None:
        """The next answers are `texts`, one after the other (a call, then the answer after its result), each
        ended by `end_token`: the answers run on from one to the next, one forward pass a token."""
        end = tokenizer.convert_tokens_to_ids(end_token)
        self.ends.add(end)
        self.ids = [i for text in texts for i in (*tokenizer.encode(text, add_special_tokens=False), end)]
        self.step = 0

    def remove(self) -> None:
        self.handle.remove()
        self.watch.remove()

    @contextmanager
    def paused(self):
        """The model answers as it would (unforced) inside the block."""
        self.handle.remove()
        try:
            yield
        finally:
            self.handle = self.layer.register_forward_hook(self._force)
