"""--models_dir's models, each loaded when first asked for, in a process of its own (a `PipeEngine` over it, in a
queue of its own, engine/in_order.py), so that a load never holds up another model's answers. Past
--max_loaded_models the least recently used is unloaded to make room, only once no answer runs or waits on it; with
--idle_unload, a model no one asked for in that long is unloaded too. Unloading ends the model's process (and its
--n_gpus workers), which frees all it held: weights, KV caches, its batch."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from local_chat.errors import UserError

from ..in_order import InArrivalOrder
from ..interface import CHAT_SAMPLING, End, Engine, Event, FinishReason, Loading, Request, Sampling
from ..pipe import LoadProgress, ModelFacts, ModelFailed, PipeEngine
from .common import Lease, ModelChoices, WithAdapter

IDLE_POLL_S = 1.0  # how often --idle_unload looks for quiet models
LOAD_POLL_S = 0.25  # how often a load looks at its process, and a waiting request tells how long it has waited
STOP_WAIT_S = 10.0  # how long an unloaded model's process has to end before it is killed


class NotLoaded(UserError):
    """A model that is not loaded, asked for by one who may not load it (--admins)."""


@dataclass
class ModelProcess:
    """A model's process as started (`start(model_id)`): its facts arrive on `connection` once it has loaded."""

    process: object  # a multiprocessing.Process
    connection: object  # a multiprocessing Connection


@dataclass
class _Model:
    id: str
    problem: str | None = None  # why it cannot load: listed with this sentence
    state: str = "available"  # available, loading, loaded, unloading
    engine: InArrivalOrder | None = None
    template: str = ""  # its answers' default template, as its process chose it
    system: str | None = None  # its default system prompt, where its settings give one
    chat_sampling: Sampling = CHAT_SAMPLING  # the page's answer settings for it, as its settings change them
    running: ModelProcess | None = None
    users: int = 0  # answers running or waiting on it (leases held)
    last_used: float = 0.0
    loading_since: float = 0.0
    progress: LoadProgress | None = None  # how far its load has come, as its process says
    facts: ModelFacts | None = None  # as its process told them when it last loaded: kept once it is unloaded
    load_lock: threading.Lock = field(default_factory=threading.Lock)


class Models(ModelChoices):
    """The listed models ((id, problem or None) each), loaded on demand by `start` (a `ModelProcess` for an id,
    whose facts hold its "template", "system", "chat_sampling" and "places": its --concurrency); `contexts`: each
    one's context as its listing foresees it, until it has loaded; `adapters`: the LoRA adapters found beside them,
    {"BASE + NAME": (BASE, NAME)}, each answered by its base's process, which loads them all with it."""

    def __init__(
        self,
        listed: list[tuple[str, str | None]],
        start: Callable[[str], ModelProcess],
        max_loaded: int = 1,
        idle_unload_s: float | None = None,
        contexts: dict[str, int] | None = None,
        adapters: dict[str, tuple[str, str]] | None = None,
    ):
        if max_loaded < 1:
            raise UserError(f"--max_loaded_models {max_loaded}: give 1 or more.")
        self._models = {model_id: _Model(model_id, problem) for model_id, problem in listed}
        self._contexts = contexts or {}  # each model's context as its listing foresees it (launchers/catalog.py)
        self._start = start
        self._adapters = adapters or {}
        self.max_loaded, self.idle_unload_s = max_loaded, idle_unload_s
        self._changed = threading.Condition()
        self._closed = threading.Event()
        if idle_unload_s is not None:
            threading.Thread(target=self._unload_when_idle, name="idle-unload", daemon=True).start()

    # ----- what the doors ask -----

    def ids(self) -> list[str]:
        """The ids of the models that can load, in listing order, each followed by its adapters'."""
        return [model_id for model_id, _ in self.states()]

    def states(self) -> list[tuple[str, str]]:
        """(id, "loaded" | "loading" | "available") of each model that can load, and of its adapters (its own)."""
        with self._changed:
            states = []
            for model in self._listed():
                state = "loading" if model.state == "unloading" else model.state
                states += [(model.id, state)] + [
                    (a, state) for a, (base, _) in self._adapters.items() if base == model.id
                ]
            return states

    def known(self, model_id: str) -> bool:
        model_id = self._adapters.get(model_id, (model_id,))[0]
        return model_id in self._models and self._models[model_id].problem is None

    def parent_of(self, model_id: str) -> str | None:
        return self._adapters[model_id][0] if model_id in self._adapters else None

    def unknown_sentence(self, model_id) -> str:
        model = self._models.get(self._adapters.get(model_id, (model_id,))[0])
        if model is not None and model.problem is not None:
            return f"{model_id} cannot load: {model.problem}"
        return f"There is no model {model_id!r} here; the models are {', '.join(self.ids()) or 'none'}."

    def waiting_sentence(self, model_id: str) -> str:
        """What a request for `model_id` waits for, in a few words ("loading MODEL, 12 s")."""
        model_id = self._adapters.get(model_id, (model_id,))[0]
        with self._changed:
            model = self._models[model_id]
            if model.state == "loading":
                told = f": {model.progress}" if model.progress is not None else ""
                return f"loading {model_id}{told}, {time.monotonic() - model.loading_since:.0f} s"
            leaving = [m.id for m in self._listed() if m.state == "unloading" and m.id != model_id]
            if leaving:
                return f"unloading {', '.join(leaving)} to make room for {model_id}"
            busy = [m.id for m in self._listed() if m.state == "loaded" and m.id != model_id]
            return f"waiting for {', '.join(busy)} to finish its answers before loading {model_id}"

    def load_progress(self, model_id: str) -> LoadProgress | None:
        model_id = self._adapters.get(model_id, (model_id,))[0]
        with self._changed:
            model = self._models.get(model_id)
            return model.progress if model is not None and model.state == "loading" else None

    def facts_of(self, model_id: str) -> ModelFacts | WithAdapter | None:
        if model_id in self._adapters:
            base, name = self._adapters[model_id]
            facts = self.facts_of(base)
            return WithAdapter(facts, name) if facts is not None else None
        model = self._models.get(model_id)
        return model.facts if model is not None else None

    def context_of(self, model_id: str) -> int | None:
        return super().context_of(model_id) or self._contexts.get(self._adapters.get(model_id, (model_id,))[0])

    def loaded(self, model_id: str) -> InArrivalOrder | WithAdapter | None:
        if model_id in self._adapters:
            base, name = self._adapters[model_id]
            engine = self.loaded(base)
            return WithAdapter(engine, name) if engine is not None else None
        with self._changed:
            model = self._models.get(model_id)
            return model.engine if model is not None and model.state == "loaded" else None

    def lease(self, model_id: str, may_load: bool = True) -> Lease:
        """`model_id` loaded (here, where it is not: after making room), held until the lease is released. A model
        that cannot load, or is not loaded where `may_load` is False (--admins), is a `UserError` saying why. An
        adapter's model is its base's, answering with the adapter."""
        if model_id in self._adapters:
            return self._adapter_lease(model_id, may_load)
        with self._changed:
            if not self.known(model_id):
                raise UserError(self.unknown_sentence(model_id))
            model = self._models[model_id]
            if not may_load and model.state != "loaded":
                raise NotLoaded(f"{model_id} is not loaded; an admin loads it on the page.")
            model.users += 1
            model.last_used = time.monotonic()
        try:
            self._load(model)
        except BaseException:
            self._leave(model)
            raise
        release = functools.partial(self._leave, model)
        return Lease(model_id, model.engine, model.template, model.system, release, chat_sampling=model.chat_sampling)

    def _adapter_lease(self, model_id: str, may_load: bool) -> Lease:
        base, name = self._adapters[model_id]
        lease = self.lease(base, may_load)
        problem = dict(lease.engine.summary().adapter_problems).get(name)
        if problem is not None:  # its folder did not fit the base (model/adapters.py)
            lease.release()
            raise UserError(f"{model_id} cannot load: {problem}")
        return replace(lease, model_id=model_id, engine=WithAdapter(lease.engine, name))

    def stream(self, model_id: str, request: Request, answer: Callable[[Engine], Iterator[Event]] | None = None):
        """`request` answered by `model_id` (`answer(engine)`: its events over the loaded model's engine; by default
        that engine's stream), loaded first where it is not (`Loading` events meanwhile)."""
        leased: list[Lease] = []
        loader = threading.Thread(target=lambda: leased.append(self.lease_or_failure(model_id)), daemon=True)
        loader.start()
        while loader.is_alive():
            loader.join(LOAD_POLL_S)
            if request.cancel is not None and request.cancel.is_set():  # Stop: at once; the load goes on
                threading.Thread(target=_release_when_had, args=(loader, leased), daemon=True).start()
                yield End(FinishReason.CANCELLED)
                return
            if loader.is_alive():
                yield Loading(self.waiting_sentence(model_id))
        lease = leased[0]
        if isinstance(lease, str):
            yield End.failed(lease)
            return
        try:
            yield from answer(lease.engine) if answer is not None else lease.engine.stream(request)
        finally:
            lease.release()

    def close(self) -> None:
        """Unload every model: their processes end."""
        self._closed.set()
        for model in list(self._models.values()):
            if model.running is not None:
                self._stop(model.running)

    # ----- loading and unloading -----

    def _listed(self) -> list[_Model]:
        return [model for model in self._models.values() if model.problem is None]

    def _leave(self, model: _Model) -> None:
        with self._changed:
            model.users -= 1
            model.last_used = time.monotonic()
            self._changed.notify_all()

    def _load(self, model: _Model) -> None:
        with model.load_lock:  # one load of a model at a time; the others asking for it wait for that one
            with self._changed:
                while model.state == "unloading":  # made room for another, or quiet too long: load it again after
                    self._changed.wait(LOAD_POLL_S)
                if model.problem is not None:
                    raise UserError(self.unknown_sentence(model.id))
                if model.state == "loaded" and model.engine.failure is None:
                    return
            if model.running is not None:  # its process stopped (its answers said why): start it again
                self._unload(model)
            self._make_room(model)
            try:
                running = self._start(model.id)
                facts = self._facts(model, running)
                template, system, places = facts.pop("template"), facts.pop("system", None), facts.pop("places")
                chat_sampling = facts.pop("chat_sampling", CHAT_SAMPLING)
                engine = InArrivalOrder(PipeEngine(running.connection, facts, end_process=False), places or 1)
            except BaseException as error:
                with self._changed:
                    model.state, model.running = "available", None
                    if isinstance(error, UserError):  # listed with its sentence from now on; the others still work
                        model.problem = str(error).removeprefix(f"{model.id} could not load: ")
                    self._changed.notify_all()
                raise
            with self._changed:
                model.engine, model.template, model.system = engine, template, system
                model.facts = ModelFacts(facts)
                model.chat_sampling = chat_sampling
                model.running, model.state = running, "loaded"
                self._changed.notify_all()

    def _make_room(self, model: _Model) -> None:
        """Wait until `model` may load without passing --max_loaded_models, unloading the least recently used idle
        model where that makes room; then it counts as loading."""
        while True:
            with self._changed:
                held = [m for m in self._listed() if m.state != "available" and m is not model]
                if len(held) < self.max_loaded:
                    model.state, model.loading_since, model.progress = "loading", time.monotonic(), None
                    return
                idle = [m for m in held if m.state == "loaded" and m.users == 0]
                if not idle:
                    self._changed.wait(LOAD_POLL_S)
                    continue
                victim = min(idle, key=lambda m: m.last_used)
                victim.state = "unloading"
            self._unload(victim)

    def _facts(self, model: _Model, running: ModelProcess) -> dict:
        """The loaded model's facts, from its process (after its `LoadProgress`); its failure (or its end) as one
        sentence."""
        reply = None
        while reply is None:
            try:
                if running.connection.poll(LOAD_POLL_S):
                    reply = running.connection.recv()
                    if isinstance(reply, LoadProgress):
                        with self._changed:
                            model.progress, reply = reply, None
                        continue
                    break
            except (EOFError, OSError):  # it ended without a word
                running.process.join(STOP_WAIT_S)
            if not running.process.is_alive():
                self._stop(running)
                raise UserError(
                    f"{model.id} could not load: its process stopped (exit code {running.process.exitcode}); "
                    "see the app's terminal for why."
                )
        if isinstance(reply, ModelFailed):
            self._stop(running)
            raise UserError(f"{model.id} could not load: {reply.sentence}")
        return reply

    def _unload(self, model: _Model) -> None:
        running = model.running
        if running is not None:
            self._stop(running)
        with self._changed:
            model.engine, model.running, model.state = None, None, "available"
            self._changed.notify_all()

    @staticmethod
    def _stop(running: ModelProcess) -> None:
        process = running.process
        if process.is_alive():
            process.terminate()
        process.join(STOP_WAIT_S)
        if process.is_alive():
            process.kill()
            process.join()
        running.connection.close()

    def _unload_when_idle(self) -> None:
        while not self._closed.wait(IDLE_POLL_S):
            now = time.monotonic()
            with self._changed:
                quiet = [
                    m for m in self._listed()
                    if m.state == "loaded" and m.users == 0 and now - m.last_used >= self.idle_unload_s
                ]  # fmt: skip
                for model in quiet:
                    model.state = "unloading"
            for model in quiet:
                self._unload(model)


def _release_when_had(loader: threading.Thread, leased: list) -> None:
    """The lease a cancelled request's loader gets, given back once it has it."""
    loader.join()
    if leased and isinstance(leased[0], Lease):
        leased[0].release()
