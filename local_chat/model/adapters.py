"""LoRA adapters (--lora NAME=DIR): PEFT's folders (adapter_config.json and adapter_model.safetensors) loaded over
the model, each answer run with the one its request names (`Request.adapter`), or with none.

PEFT puts each adapter's low-rank pair beside the layers it targets, in the model itself: the model keeps answering
through the same object, with whichever adapter is set. So answers of one adapter run together (in the batch too),
and an answer of another waits until those are over (`Adapters.holding`: the adapter of the answer that has waited
longest goes next, with every answer waiting for it, so none waits more than one turn); switching is a flag on the
layers (milliseconds). Each folder is checked before PEFT touches the
model (its config, the layers it targets, its tensors' shapes), so a folder made for another base is one sentence
naming its file, and the model stays as it was, served with the adapters that fit. `merge_lora` folds one adapter
into the weights instead: the fastest decode, one model."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from local_chat.errors import UserError

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
WAIT_POLL_S = 0.05  # how often an answer waiting for another adapter's answers looks at its cancel flag


class Cancelled(Exception):
    """Stopped while it waited for another adapter's answers to end."""


def read_adapter(name: str, folder: str | Path):
    """The `LoraConfig` of the adapter folder `folder`, checked: a folder that is not a PEFT LoRA adapter is a
    `UserError` naming the file at fault."""
    from peft import LoraConfig, PeftConfig

    folder = Path(folder)
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise UserError(
            f"The adapter {name}: {folder} has no {CONFIG_FILE}; give the folder PEFT's save_pretrained wrote."
        )
    try:
        fields = json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise UserError(f"The adapter {name}: {config_file} is not valid JSON ({error}); fix or replace it.") from None
    if not isinstance(fields, dict) or fields.get("peft_type") != "LORA":
        kind = fields.get("peft_type") if isinstance(fields, dict) else None
        raise UserError(
            f"The adapter {name}: {config_file} is {'a ' + str(kind) if kind else 'not a PEFT'} adapter; "
            "only LoRA adapters load here."
        )
    if not any((folder / weights).is_file() for weights in WEIGHT_FILES):
        raise UserError(f"The adapter {name}: {folder} has no {WEIGHT_FILES[0]}; copy the adapter's weights there.")
    try:
        config = PeftConfig.from_pretrained(str(folder))
    except Exception as error:  # a field PEFT refuses
        raise UserError(f"The adapter {name}: PEFT cannot read {config_file} ({error}).") from None
    if not isinstance(config, LoraConfig):
        raise UserError(f"The adapter {name}: {config_file} is not a LoRA adapter; only LoRA adapters load here.")
    return config


def weights_file(folder: Path) -> Path:
    """The adapter's weights file: PEFT's safetensors, else its older .bin."""
    return next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), folder / WEIGHT_FILES[0])


def adapter_tensors(folder: Path) -> dict[str, tuple[int, ...]]:
    """The shapes of the adapter's tensors, by name, read from the file's header (nothing loaded)."""
    weights = weights_file(folder)
    if weights.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as tensors:
            return {key: tuple(tensors.get_slice(key).get_shape()) for key in tensors.keys()}
    state = torch.load(weights, map_location="meta", weights_only=True)
    return {key: tuple(tensor.shape) for key, tensor in state.items()}


def check_fits(model, name: str, folder: str | Path, config) -> None:
    """A `UserError` naming the file where the adapter does not fit `model`: a target module it lacks, or a tensor
    whose shape is not that of its layer (an adapter trained on another base)."""
    folder = Path(folder)
    modules = dict(model.named_modules())
    targets = config.target_modules
    if isinstance(targets, (list, set, tuple)):
        missing = sorted(t for t in targets if not any(key == t or key.endswith("." + t) for key in modules))
        if missing:
            raise UserError(
                f"The adapter {name}: {folder / CONFIG_FILE} targets {', '.join(missing)}, which this model "
                f"({type(model).__name__}) does not have; give an adapter trained on this base."
            )
    try:
        shapes = adapter_tensors(folder)
    except Exception as error:
        raise UserError(f"The adapter {name}: {weights_file(folder)} cannot be read ({error}).") from None
    for key, shape in shapes.items():
        path, _, kind = key.removeprefix("base_model.model.").partition(".lora_")
        layer = modules.get(path)
        if layer is None or not kind.startswith(("A", "B")):
            if layer is None and kind:
                raise UserError(
                    f"The adapter {name}: {weights_file(folder)} holds {key}, for a layer this model "
                    f"({type(model).__name__}) does not have; give an adapter trained on this base."
                )
            continue
        want = getattr(layer, "in_features", None) if kind.startswith("A") else getattr(layer, "out_features", None)
        have = shape[1] if kind.startswith("A") else shape[0]
        if want is not None and len(shape) == 2 and have != want:
            raise UserError(
                f"The adapter {name}: {key} in {weights_file(folder)} is {list(shape)}, where this model's {path} "
                f"takes {want} features; the adapter was trained on another base."
            )


class Adapters:
    """The LoRA adapters loaded over one model (`peft_model`, PEFT's wrapper of it), by name; answers run with one of
    them, or with none, one adapter at a time (see the module's docstring)."""

    def __init__(self, peft_model, names: list[str], problems: dict[str, str] | None = None):
        self.peft_model, self.names = peft_model, tuple(names)
        self.problems = dict(problems or {})  # the adapters that did not load: why, in one sentence each
        self._changed = threading.Condition()
        self._active: str | None = None  # what the layers hold now: an adapter's name, or None (the model alone)
        self._running = 0
        self._waiting: deque[tuple[object, str | None]] = deque()  # (ticket, adapter) in arrival order
        self._admitted: set[object] = set()  # the tickets of the adapter whose turn is next
        self._set(None)

    @classmethod
    def none(cls, problems: dict[str, str]) -> Adapters:
        """No adapter loaded: each given did not fit (`problems`), and answers run with the model alone."""
        return cls(None, [], problems)

    def check(self, name: str | None) -> None:
        if name in self.problems:
            raise UserError(self.problems[name])
        if name is not None and name not in self.names:
            raise UserError(f"There is no adapter {name!r} here; the adapters are {', '.join(self.names)}.")

    @contextmanager
    def holding(self, name: str | None, cancel: threading.Event | None = None) -> Iterator[None]:
        """The layers set to `name` (None: no adapter) while the block runs; it waits for the answers of another
        adapter to end, and for those of the adapters waiting longer than it to run. `Cancelled` where `cancel` is
        set meanwhile."""
        self.check(name)
        ticket = object()
        with self._changed:
            self._waiting.append((ticket, name))
            try:
                while not self._may_run(ticket, name):
                    if cancel is not None and cancel.is_set():
                        raise Cancelled
                    self._changed.wait(WAIT_POLL_S)
            finally:
                self._waiting.remove((ticket, name))
                self._admitted.discard(ticket)
                self._changed.notify_all()
            if name != self._active:
                self._set(name)
            self._running += 1
        try:
            yield
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    def _may_run(self, ticket: object, name: str | None) -> bool:
        """Whether the answer of `ticket` may run now: it joins the answers running with its adapter while no answer
        of another waits; once none runs, the adapter of the answer waiting longest has its turn, with every answer
        waiting for it (they run together)."""
        if self._running == 0 and not self._admitted:
            oldest = self._waiting[0][1]
            self._admitted.update(waiting for waiting, wanted in self._waiting if wanted == oldest)
        if ticket in self._admitted:
            return self._running == 0 or name == self._active
        others_wait = any(wanted != name for _, wanted in self._waiting)
        return self._running > 0 and name == self._active and not others_wait

    def _set(self, name: str | None) -> None:
        if self.peft_model is None:
            return
        tuner = self.peft_model.base_model
        if name is None:
            tuner.disable_adapter_layers()
        else:
            tuner.enable_adapter_layers()
            self.peft_model.set_adapter(name, inference_mode=True)
        self._active = name


def attach_adapters(model, lora: dict[str, str | Path], merge: bool = False):
    """`model` with the adapters `lora` ({name: folder}) over it: (model, `Adapters`), or with `merge` (one adapter)
    (the model with the adapter folded into its weights, None). Each folder is checked first (`read_adapter`,
    `check_fits`): one that does not fit is left out, its sentence kept (`Adapters.problems`); with `merge`, it is
    a `UserError`."""
    from peft import PeftModel

    if merge and len(lora) != 1:
        raise UserError(f"--merge_lora folds one adapter into the model; --lora names {len(lora)}: give one.")
    peft_model, loaded, problems = None, [], {}
    for name, folder in lora.items():
        try:
            config = read_adapter(name, folder)
            check_fits(model, name, folder, config)
        except UserError as error:
            if merge:
                raise
            problems[name] = str(error)
            continue
        try:
            if peft_model is None:
                peft_model = PeftModel.from_pretrained(model, str(folder), adapter_name=name, config=config)
            else:
                peft_model.load_adapter(str(folder), adapter_name=name)
        except Exception as error:  # what the checks did not foresee: the model may be half changed, so stop
            raise UserError(f"The adapter {name} in {folder} does not load over this model ({error}).") from None
        loaded.append(name)
    if peft_model is None:
        return model, Adapters.none(problems)
    peft_model.eval()
    if merge:
        return peft_model.merge_and_unload(), None
    return model, Adapters(peft_model, loaded, problems)


@contextmanager
def holding(adapters: Adapters | None, name: str | None, cancel: threading.Event | None = None) -> Iterator[None]:
    """`adapters.holding(name, cancel)`, or nothing for a model without adapters (asked for one: a `UserError`)."""
    if adapters is None:
        if name is not None:
            raise UserError(f"There is no adapter {name!r} here; load it with --lora {name}=FOLDER.")
        yield
        return
    with adapters.holding(name, cancel):
        yield


def adapter_session(session, name: str | None):
    """The key of a session's KV cache with the adapter `name`: each adapter's keys and values are its own."""
    if name is None or session is None:
        return session
    if isinstance(session, str):
        return f"{session} + {name}"
    return replace(session, door=f"{session.door} + {name}")
