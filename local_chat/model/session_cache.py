"""The KV caches kept between a conversation's turns, for one model (the store of them is model/prefix_cache.py's
`PrefixCaches`): how much of a session's cache a new prompt can reuse, the cache cut back to it, and kept again when
the turn ends. Some layers limit the reuse: linear-attention layers (Qwen3.5's) keep a running state, reused only
whole; cross-attention layers (Mllama's) hold an image's keys and values, made afresh when the image runs again; and
PaliGemma's prompt attends both ways, so it is prefilled every turn."""

from __future__ import annotations

import functools

from transformers import DynamicCache

from local_chat.engine.interface import SessionKey

from .generation import ModelInputs
from .parallel import Lockstep
from .prefix_cache import CachedPrefix, PrefixCaches, keeps_states, reusable_length

BIDIRECTIONAL_PROMPTS = ("paligemma",)


class SessionCaches:
    """The sessions' KV caches of the model `llma` (with its `processor`, for the image token): `take` one for a
    turn, `keep` it after. `lockstep`: tensor parallel's ranks, which agree on how much every one of them reuses."""

    def __init__(self, llma, processor, store: PrefixCaches, lockstep: Lockstep | None = None):
        self.llma, self.processor, self.store, self.lockstep = llma, processor, store, lockstep

    def take(self, session: SessionKey | str | None, inputs: ModelInputs, media: str | None, static=None):
        """(cache, key): the session's cache cut back to what this prompt shares with it (`inputs.cached` tokens), or
        a new one, and the key to keep it under after this turn (a pool's member: see `PrefixCaches.take`). `static`:
        the decoding over a static cache, if any (its `keeps_sessions`: whether it can take a session's cache)."""
        if session is None or (static is not None and not static.keeps_sessions) or not self.prompt_is_causal:
            return None, None
        ids = inputs.input_ids[0].tolist()
        session, prefix = self.store.take(session, ids)
        if prefix is not None:
            inputs.cached = reusable_length(prefix, ids, media, self.media_token_ids)
            if self.keeps_states and inputs.cached < len(prefix.token_ids):
                inputs.cached = 0  # a running state cannot be cut back: only a whole cached prefix is reused
            if self.cross_attention_layers and self.image_token_id in ids[inputs.cached :]:
                inputs.cached = 0  # the image runs again: Mllama's cross-attention keys and values are made afresh
        if self.lockstep is not None:  # every rank must run the same tokens, whatever its own cache holds
            inputs.cached = self.lockstep.agree(inputs.cached, self.llma.device)
        if not inputs.cached:
            return self.new_cache(), session
        surplus = prefix.cache.get_seq_length() - inputs.cached
        if surplus > 0:
            self.crop(prefix.cache, inputs.cached)
        if not self.media_token_ids.intersection(ids[inputs.cached :]):
            inputs.with_images = False  # the media tokens are in the cache already: their features are not needed again
        return prefix.cache, session

    def new_cache(self) -> DynamicCache:
        """An empty cache for a turn: every position kept, sliding-window layers' too (their masks still see only the
        window), so that the next turn can cut the cache back to any length; linear-attention layers (Qwen3.5's)
        keep their state."""
        return DynamicCache(config=self.llma.config) if self.keeps_states else DynamicCache()

    def keep(self, session, inputs: ModelInputs, cache, sampled: list[int], media: str | None) -> None:
        """Keep `cache` as `session`'s after a turn that sampled the tokens `sampled`."""
        if session is None or cache is None:
            return
        # the cache holds the prompt and the answer up to the last token fed: a token goes through the model only
        # after it is decided on, so the last one did not, unless its step was queued ahead (a static cache on CUDA)
        ids, held = inputs.input_ids[0].tolist() + sampled, cache.get_seq_length()
        if held <= len(ids):
            self.store.put(session, CachedPrefix(ids[:held], cache, media))

    def drop(self, browser_session: str) -> None:
        self.store.drop(browser_session)

    def crop(self, cache, length: int) -> None:
        """Cut `cache` back to its first `length` tokens. Cross-attention layers (Mllama's) hold the image's keys
        and values, not the tokens': they stay whole."""
        surplus = cache.get_seq_length() - length
        for index, layer in enumerate(cache.layers):
            if index not in self.cross_attention_layers:
                layer.crop(-surplus)  # transformers' crop takes the number of tokens to remove, negated

    @functools.cached_property
    def cross_attention_layers(self) -> set[int]:
        """The layers that attend to the image's features rather than to the tokens (Mllama's)."""
        return set(getattr(self.llma.config.get_text_config(), "cross_attention_layers", None) or ())

    @functools.cached_property
    def keeps_states(self) -> bool:
        """Whether some layers keep a running state rather than each token's keys and values (Qwen3.5's linear
        attention): their cache cannot be cut back to fewer tokens."""
        return keeps_states(self.llma.config)

    @property
    def prompt_is_causal(self) -> bool:
        """Whether each prompt token sees only those before it, so that a cached prefix stays valid when more tokens
        follow. PaliGemma's whole prompt attends both ways (a prefix language model): it prefills every turn."""
        return self.llma.config.model_type not in BIDIRECTIONAL_PROMPTS

    @functools.cached_property
    def image_token_id(self) -> int | None:
        """The token the image features replace (Gemma 3's soft token, not its start-of-image marker)."""
        return self._features_token("image") if self.processor is not None else None

    @functools.cached_property
    def audio_token_id(self) -> int | None:
        """The token a sound clip's features replace, for a model that hears (Qwen2-Audio's <|AUDIO|>)."""
        return self._features_token("audio") if getattr(self.processor, "audio_token", None) else None

    def _features_token(self, medium: str) -> int | None:
        """The id of the token whose embeddings a `medium`'s ("image", "audio") features replace: the config's, else
        the processor's."""
        config = self.llma.config
        for name in (f"{medium}_token_id", f"{medium}_token_index"):
            if getattr(config, name, None) is not None:
                return int(getattr(config, name))
        return getattr(self.processor, f"{medium}_token_id", None)

    @functools.cached_property
    def media_token_ids(self) -> frozenset[int]:
        """The tokens an image's or a clip's features replace."""
        return frozenset(t for t in (self.image_token_id, self.audio_token_id) if t is not None)
