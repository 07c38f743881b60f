"""The engine (engine/interface.py) of one listed model (engine/choices/folders.py, engine/choices/served.py) for a
door that holds one: the page's chat, one per model a session picks."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from local_chat.errors import UserError

from ..interface import Answer, Engine, Event, Request, Sampling, collect
from .common import ModelChoices


class ModelEngine:
    """The engine (engine/interface.py) of one listed model, for a door that holds one (the page's chat). Its facts
    are the model's as it told them when it last loaded (`ModelChoices.facts_of`): reading one never loads a model.
    An answer leases the model, loading it where it is not loaded (`Loading` events meanwhile), and a chat's messages
    are rendered once it is had (a prompt's length asks the model's process), so a load never holds up a reader of
    the page's facts, nor the web server's loop."""

    def __init__(self, models: ModelChoices, model_id: str):
        self.models, self.model_id = models, model_id

    @property
    def facts(self):
        """The model's facts (tokenizer, chat_renderer, max_seq_len, sees_images, summary(), ...); a model never
        loaded has none yet: the picker loads it (off the server's loop) before its page reads them."""
        facts = self.models.facts_of(self.model_id)
        if facts is None:
            raise UserError(f"{self.model_id} has not loaded yet; choose it in the picker to load it.")
        return facts

    @property
    def tokenizer(self):
        return self.facts.tokenizer

    @property
    def chat_renderer(self):
        return self.facts.chat_renderer

    @property
    def max_seq_len(self) -> int:
        return self.facts.max_seq_len

    @property
    def sees_images(self) -> bool:
        return self.facts.sees_images

    @property
    def renders_messages(self) -> bool:
        return getattr(self.facts, "renders_messages", False)

    takes_chats = True  # engine/chats.py hands it chat messages: it renders them once the model is had

    def summary(self):
        return self.facts.summary()

    def generation_defaults(self) -> Sampling:
        return self.facts.generation_defaults()

    @property
    def failure(self) -> str | None:
        return None  # a model whose process stopped is loaded again by its next answer

    def stream(self, request: Request, answer: Callable[[Engine], Iterator[Event]] | None = None) -> Iterator[Event]:
        """`request` answered by the model, loaded first where it is not: `answer(engine)` over the loaded model's
        engine (engine/chats.py renders a chat there), by default that engine's stream."""
        return self.models.stream(self.model_id, request, answer)

    def complete(self, requests: list[Request]) -> list[Answer]:
        return [collect(self.stream(request)) for request in requests]

    def prompt_length(self, prompt: str, images=None, image_transform: str | None = None) -> int:
        """The model's count of `prompt`: it is loaded for it (a blocking call: never on the server's loop)."""
        return self._held(lambda engine: engine.prompt_length(prompt, images, image_transform))

    def messages_length(self, messages: list[dict], tools=None) -> int:
        return self._held(lambda engine: engine.messages_length(messages, tools))

    def drop_sessions(self, browser_session: str) -> None:
        """A closed page's KV caches, where the model is loaded (an unloaded one kept none)."""
        if (engine := self.models.loaded(self.model_id)) is not None:
            engine.drop_sessions(browser_session)

    def _held(self, use: Callable):
        lease = self.models.lease(self.model_id)
        try:
            return use(lease.engine)
        finally:
            lease.release()
