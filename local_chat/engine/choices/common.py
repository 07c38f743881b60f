"""What the doors (the page's picker, /v1's `model`) ask of the models they pick among (`ModelChoices`): --models_dir's
(engine/choices/folders.py), an engine's (engine/choices/served.py), and --lora's adapters over one model
(engine/choices/lora.py); a `Lease` holds one for an answer, and `WithAdapter` is a model answering with one of
its LoRA adapters."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from local_chat.errors import UserError

from ..in_order import InArrivalOrder
from ..interface import CHAT_SAMPLING, Answer, End, Engine, EngineSummary, Event, Request, Sampling

if TYPE_CHECKING:
    from ..pipe import LoadProgress

JOIN = " + "  # between a base's name and its LoRA adapter's: the adapter's model is "BASE + NAME"


@dataclass
class Lease:
    """A loaded model held for one request: it is not unloaded until `release()`."""

    model_id: str
    engine: InArrivalOrder
    template: str
    system: str | None
    _release: Callable[[], None]
    _released: bool = False
    chat_sampling: Sampling = CHAT_SAMPLING  # the page's answer settings for it (--models_config's sampling keys)

    def release(self) -> None:
        """Once the answer is over (again: nothing)."""
        if not self._released:
            self._released = True
            self._release()


class WithAdapter:
    """`engine` (a model's queue, or its facts) answering with the LoRA adapter `name` (None: the model alone); every
    other fact and call is `engine`'s."""

    def __init__(self, engine: Engine, name: str | None):
        self.engine, self.name = engine, name

    def __getattr__(self, attribute: str):
        return getattr(self.engine, attribute)

    def summary(self) -> EngineSummary:
        return replace(self.engine.summary(), adapter=self.name or "")

    def stream(self, request: Request) -> Iterator[Event]:
        return self.engine.stream(replace(request, adapter=self.name))

    def complete(self, requests: list[Request]) -> list[Answer]:
        return self.engine.complete([replace(request, adapter=self.name) for request in requests])


class ModelChoices:
    """What the doors (the page's picker, /v1) ask of the models they pick among: `Models` here, and an engine's
    (engine/choices/served.py)."""

    strict = True  # a `model` not listed is refused (an engine's front answers it with --model's)

    def lease(self, model_id: str, may_load: bool = True) -> Lease:
        raise NotImplementedError

    def stream(self, model_id: str, request: Request, answer: Callable[[Engine], Iterator[Event]] | None = None):
        """`request` answered by `model_id` (`answer(engine)`: its events over the model's engine; by default that
        engine's stream), or its `End` saying why the model cannot be had. `Models` overrides it: its models load."""
        lease = self.lease_or_failure(model_id)
        if isinstance(lease, str):
            yield End.failed(lease)
            return
        try:
            yield from answer(lease.engine) if answer is not None else lease.engine.stream(request)
        finally:
            lease.release()

    def lease_or_failure(self, model_id: str, may_load: bool = True) -> Lease | str:
        """`lease(model_id, may_load)`, or the sentence saying why it cannot be had."""
        try:
            return self.lease(model_id, may_load)
        except UserError as error:
            return str(error)

    def load_progress(self, model_id: str) -> LoadProgress | None:
        """How far `model_id`'s load has come, while it loads (where its loader tells)."""
        return None

    def context_of(self, model_id: str) -> int | None:
        """`model_id`'s context in tokens, where it is known without loading it (/v1/models' `context_length`)."""
        facts = self.facts_of(model_id)
        return facts.max_seq_len if facts is not None else None

    def facts_of(self, model_id: str):
        """What a door reads of `model_id` without asking it anything (its tokenizer, context, whether it sees
        images, its summary...), where they are known; None for a model never loaded. Never loads it."""
        raise NotImplementedError

    def loaded(self, model_id: str):
        """`model_id`'s engine where it is loaded now (nothing is loaded for asking), else None."""
        raise NotImplementedError

    def parent_of(self, model_id: str) -> str | None:
        """The model an adapter's model runs over (--lora), else None."""
        return None
