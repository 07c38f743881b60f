"""KV caches kept between the turns of a conversation, so a new turn prefills only what is new.

Every chat front end re-renders the whole history into a prompt at each turn. The tokens of that prompt mostly
repeat the tokens the model has already seen (last turn's prompt and answer), so the session keeps the token ids
it fed the model and their keys and values; the next prompt is compared token by token (never by length:
templates re-render and tokenizers merge differently at the edges), the cache is cut back to the common prefix,
and only the rest is run. Memory is bounded: at most `max_sessions` caches and `max_bytes`, least recently used
dropped first; a session whose cache was dropped just prefills everything again.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

import torch

from local_chat.defaults import MAX_CACHED_SESSIONS
from local_chat.engine.interface import SessionKey, in_session


@dataclass
class CachedPrefix:
    token_ids: list[int]  # the tokens whose keys and values `cache` holds, in order
    cache: object  # a transformers DynamicCache
    media_key: str | None = None  # which images and sound clips the media tokens among `token_ids` stood for

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for layer in self.cache.layers
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
            if torch.is_tensor(t)
        )


def keeps_states(config) -> bool:
    """Whether some of a model's layers keep a running state rather than each token's keys and values (Qwen3.5's
    linear attention, Mamba's convolutions)."""
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, LinearAttentionCacheLayerMixin

    types = getattr(config.get_text_config(), "layer_types", None) or ()
    return any(issubclass(DYNAMIC_LAYER_TYPE_MAPPING.get(t, object), LinearAttentionCacheLayerMixin) for t in types)


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def media_key(media: dict) -> str | None:
    """A fingerprint of the images and sound clips a prompt carries (the processor's inputs beside its tokens: pixels,
    grids, audio features; None without any)."""
    if not media:
        return None
    digest = hashlib.sha1()
    for name in sorted(media):
        digest.update(name.encode())
        digest.update(media[name].detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def reusable_length(prefix: CachedPrefix, ids: list[int], key: str | None, media_token_ids: frozenset[int]) -> int:
    """How many leading tokens of `ids` the cached prefix can stand for.

    At least one token is left to run (the model needs it for the next token's logits). Media tokens (an image's,
    a clip's) are run together with their features or not at all, so a cut inside them moves back to before the
    first one.
    """
    if prefix.media_key != key:
        return 0
    common = min(common_prefix_length(prefix.token_ids, ids), len(ids) - 1)
    return min([common] + [ids.index(t) for t in media_token_ids if t in ids[common:]])


class PrefixCaches:
    """The cached prefixes of recent sessions, by session key, least recently used dropped first."""

    def __init__(self, max_sessions: int = MAX_CACHED_SESSIONS, max_bytes: int | None = None):
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self._entries: OrderedDict[SessionKey | str, CachedPrefix] = OrderedDict()
        self._lock = threading.Lock()
        self._fresh = 0  # keys handed out in pools

    def take(self, session: SessionKey | str, token_ids: list[int] | None = None):
        """(key, prefix): remove and return the session's prefix (while a turn runs, nobody else may touch its cache),
        and the key to put the turn's cache back under.

        A pool (`SessionKey.pool`) names sessions nobody names (the /v1 API's clients send whole conversations, no
        session): the member whose prefix shares the longest start with `token_ids` is taken, as llama.cpp's
        cache_prompt and vLLM's prefix caching match a prompt, and a fresh member is handed out if none does.
        """
        with self._lock:
            if not (isinstance(session, SessionKey) and session.pool and session.member is None):
                return session, self._entries.pop(session, None)
            shared = {
                key: common_prefix_length(prefix.token_ids, token_ids or [])
                for key, prefix in self._entries.items()
                if isinstance(key, SessionKey) and key.pool and replace(key, member=None) == session
            }
            best = max(shared, key=shared.get, default=None)
            if best is not None and shared[best] > 0:
                return best, self._entries.pop(best)
            self._fresh += 1
            return replace(session, member=self._fresh), None

    def put(self, session: SessionKey | str, prefix: CachedPrefix) -> None:
        if self.max_sessions <= 0:
            return
        with self._lock:
            self._entries[session] = prefix
            self._entries.move_to_end(session)
            while len(self._entries) > self.max_sessions or (
                self.max_bytes is not None and len(self._entries) > 1 and self.nbytes() > self.max_bytes
            ):
                self._entries.popitem(last=False)
            if self.max_bytes is not None and self.nbytes() > self.max_bytes:  # one prefix alone over budget
                self._entries.clear()

    def drop(self, browser_session: str) -> None:
        """Forget every session of `browser_session` (a closed browser tab; see `session_key`)."""
        with self._lock:
            for key in [k for k in self._entries if in_session(k, browser_session)]:
                del self._entries[key]

    def nbytes(self) -> int:
        return sum(prefix.nbytes() for prefix in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session: SessionKey | str) -> bool:
        return session in self._entries
