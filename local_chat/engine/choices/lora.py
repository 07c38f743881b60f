"""--lora's adapters as models the doors pick among (the page's picker, /v1's `model`): "BASE" (the model alone) and
"BASE + NAME" for each adapter, all answered by the one loaded model through its one queue. Choosing one loads
nothing: the answer's request names its adapter (`Request.adapter`), and the model's process runs it with that
adapter (model/adapters.py)."""

from __future__ import annotations

from local_chat.errors import UserError

from ..interface import Engine, checkpoint_name
from .common import JOIN, Lease, ModelChoices, WithAdapter


class AdapterChoices(ModelChoices):
    """The model behind `queue` (its queue, engine/in_order.py) and each adapter its summary lists, as models;
    `template`: their answers' default template."""

    def __init__(self, queue: Engine, template: str):
        summary = queue.summary()
        self.base = checkpoint_name(summary) or "model"
        self.template = template
        self._views = {self.base: WithAdapter(queue, None)}
        self._views.update({self.base + JOIN + name: WithAdapter(queue, name) for name in summary.adapters})
        self._problems = {self.base + JOIN + name: why for name, why in summary.adapter_problems}

    def ids(self) -> list[str]:
        return list(self._views)

    def states(self) -> list[tuple[str, str]]:
        return [(model_id, "loaded") for model_id in self._views]

    def known(self, model_id: str) -> bool:
        return model_id in self._views

    def parent_of(self, model_id: str) -> str | None:
        """The base an adapter's model runs over (/v1/models' `parent`); None for the base."""
        return self.base if model_id != self.base and model_id in self._views else None

    def unknown_sentence(self, model_id) -> str:
        if model_id in self._problems:
            return f"{model_id} cannot load: {self._problems[model_id]}"
        return f"There is no model {model_id!r} here; the models are {', '.join(self._views)}."

    def waiting_sentence(self, model_id: str) -> str:
        return f"waiting for {self.base}"

    def lease(self, model_id: str, may_load: bool = True) -> Lease:
        if model_id not in self._views:
            raise UserError(self.unknown_sentence(model_id))
        return Lease(model_id, self._views[model_id], self.template, None, lambda: None)  # nothing to hold

    def loaded(self, model_id: str) -> WithAdapter | None:
        return self._views.get(model_id)

    def facts_of(self, model_id: str) -> WithAdapter | None:
        return self._views.get(model_id)

    def close(self) -> None:
        """Nothing runs here: the model's process holds the adapters."""
