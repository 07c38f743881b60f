"""--api_base's models: those the engine's /v1/models lists, each a `RemoteEngine` (engine/remote.py) in a queue of its
own, made when first asked for. The engine loads them itself, so each counts as loaded (or as the engine says, where
it is a local-chat with --models_dir). The front's /v1 and page pick among them as they do among --models_dir's
(engine/choices/folders.py): the same questions, answered for an engine; a `model` the engine does not list is answered
by the one --model named (`strict` False), as before the front routed."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..in_order import InArrivalOrder
from ..interface import Engine
from ..remote import RemoteEngine
from .common import Lease, ModelChoices


class EngineModels(ModelChoices):
    """The models of the engine `first` talks to (`first` the one --model named); `places`: each model's queue's;
    `template_of(engine)`: the template a model's answers use."""

    strict = False

    def __init__(self, first: RemoteEngine, places: int, template_of: Callable[[Engine], str]):
        self.first, self.places, self.template_of = first, places, template_of
        self._leases = {first.model: self._lease_of(first)}
        self._lock = threading.Lock()

    def _lease_of(self, engine: RemoteEngine) -> Lease:
        queued = InArrivalOrder(engine, self.places)
        return Lease(engine.model, queued, self.template_of(engine), None, lambda: None)  # nothing to hold

    def _cards(self) -> list[dict]:
        try:
            return [card.to_dict() for card in self.first.client.models.list()]
        except Exception:  # the engine is down: its answers will say so
            return [{"id": self.first.model}]

    def ids(self) -> list[str]:
        return [str(card.get("id")) for card in self._cards()]

    def states(self) -> list[tuple[str, str]]:
        return [(str(card.get("id")), str(card.get("state") or "loaded")) for card in self._cards()]

    def known(self, model_id: str) -> bool:
        return model_id in self.ids()

    def unknown_sentence(self, model_id) -> str:
        return f"The engine at {self.first.url} has no model {model_id!r}; its models are {', '.join(self.ids())}."

    def waiting_sentence(self, model_id: str) -> str:
        return f"asking the engine at {self.first.url} for {model_id}"

    def lease(self, model_id: str, may_load: bool = True) -> Lease:
        with self._lock:
            if model_id not in self._leases:
                self._leases[model_id] = self._lease_of(self.first.serving(model_id))
            return self._leases[model_id]

    def loaded(self, model_id: str) -> InArrivalOrder | None:
        lease = self._leases.get(model_id)
        return lease.engine if lease is not None else None

    def context_of(self, model_id: str) -> int | None:
        return None  # the engine's own /v1/models says it

    def facts_of(self, model_id: str) -> InArrivalOrder:
        return self.lease(model_id).engine  # the engine's own: nothing loads here

    def close(self) -> None:
        """Nothing runs here: the engine keeps its models."""
