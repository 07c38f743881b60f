"""Tensor parallelism: one process per device, every rank in lockstep, and no rank ever left waiting.

Why the processes are laid out as they are:
- transformers' tensor parallelism (`DistributedConfig(tp_size=N)`) runs one process per device, each holding 1/N
  of every layer; each forward pass is a collective, so every rank must run the same passes in the same order.
- The UI (or the batch loop of demos/generate.py) lives in rank 0 alone: one server, one queue, one place that
  decides. Ranks 1..N-1 are followers (`follow`): they wait for rank 0 to announce a call (the method and its
  arguments, one broadcast object), run it, and drop the text. A user's own script that calls `stream_generate`
  on every rank itself (the guide's multi-GPU example) needs no announcement and gets the same lockstep.
- Inside a generation, rank 0 takes every stop decision (EOS, stop symbol, cancel, length) and broadcasts it with
  the sampled tokens each step (`Lockstep`); the other ranks use rank 0's tokens. No rank can go on computing
  while another has stopped, and none can wait in a collective the others left.
- The same layout serves `torchrun` (ranks from its environment, across nodes too) and the launchers' own
  spawning (`--n_gpus N`: the launcher process becomes rank 0 and spawns ranks 1..N-1), so there is one code path.
- Rank 0 watches the followers it spawned: a follower that dies turns into one clear sentence for the answer in
  flight (and every later one) within a second or two, and the launcher exits, since a collective with a dead peer
  may block forever. So does an exception on rank 0 in the middle of a generation: the followers may wait in a
  step it never finished. Under torchrun, torchrun's own agent ends every rank when one fails.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import inspect
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.distributed as dist

from local_chat.defaults import EXIT_AFTER_FAILURE_S
from local_chat.errors import UserError, described

IDLE_FOREVER = datetime.timedelta(days=365)  # followers may wait for the next request as long as the app runs


def leave() -> None:
    """Close this process's groups as it ends. Left to the interpreter's own teardown, gloo's threads may be
    destroyed while still joinable, and the process aborts ("terminate called without an active exception") after
    its work is done (3 runs in 12 of demos/generate.py under torchrun on two CPU processes, 1 in 30 of the guide's
    multi-GPU example; none in 24 and 20 since)."""
    if dist.is_initialized():
        dist.destroy_process_group()


class Lockstep:
    """The ranks of one tensor-parallel model: rank 0 of `group` decides each step and tells the others."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.leader = dist.get_global_rank(group, 0)
        atexit.unregister(leave)
        atexit.register(leave)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def shared(self, decide: Callable[[torch.Tensor], bool]) -> Callable[[torch.Tensor], bool]:
        """`decide` taken on rank 0 only; every rank returns its answer and continues with its tokens."""

        def decide_together(tokens: torch.Tensor) -> bool:
            if self.is_leader:
                message = torch.cat([torch.tensor([int(decide(tokens))], device=tokens.device), tokens])
            else:
                message = torch.empty(tokens.numel() + 1, dtype=tokens.dtype, device=tokens.device)
            dist.broadcast(message, src=self.leader, group=self.group)
            if not self.is_leader:
                tokens.copy_(message[1:])
                decide(tokens)  # keeps this rank's own record of the answer (its session cache) like rank 0's
            return bool(message[0])

        return decide_together

    def agree(self, count: int, device: torch.device) -> int:
        """The smallest `count` of all ranks (what a cache all of them hold can serve, say)."""
        value = torch.tensor([count], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.group)
        return int(value)


class Followers:
    """Rank 0's side of the launchers' layout: announces each generation to the followers, one at a time."""

    def __init__(self, control, processes=()):
        self.control = control  # a gloo group: requests are Python objects, whatever the devices
        self.processes = list(processes)  # the followers this process spawned (none under torchrun)
        self._lock = threading.Lock()  # one generation at a time: two would interleave their collectives
        self._failure: str | None = None
        self._stopping = False  # followers that exit after `stop` have not failed

    def failure(self) -> str | None:
        """A sentence saying that a follower died, once one has."""
        if self._failure is None and not self._stopping:
            dead = [p for p in self.processes if p.exitcode is not None]
            if dead:
                codes = ", ".join(f"rank {self.processes.index(p) + 1} (exit code {p.exitcode})" for p in dead)
                self._failure = (
                    f"A model worker stopped: {codes}; the model cannot answer any more. Restart the "
                    "app (with a smaller model, --quant 4 or more GPUs if it ran out of memory)."
                )
        return self._failure

    def _tell(self, call: tuple | None) -> None:
        """Send the followers a call to run (name, kwargs), or None: the end."""
        dist.broadcast_object_list([call], src=dist.get_global_rank(self.control, 0), group=self.control)

    def run(self, method, engine, kwargs: dict):
        """Call `method` on every rank: announced to the followers, run here."""
        if inspect.isgeneratorfunction(method):
            return self._run_stream(method, engine, kwargs)
        with self._turn(method.__name__, kwargs):
            return method(engine, **kwargs)

    def _run_stream(self, method, engine, kwargs):
        with self._turn(method.__name__, kwargs):
            yield from method(engine, **kwargs)

    @contextmanager
    def _turn(self, name: str, kwargs: dict):
        with self._lock:
            if self.failure():
                raise UserError(self.failure())
            shared = {k: v for k, v in kwargs.items() if k != "cancel"}  # rank 0 alone reads the cancel flag
            self._tell((name, shared))
            try:
                yield
            except (UserError, GeneratorExit):
                raise
            except Exception as error:
                time.sleep(0.5)  # a dead peer shows in a collective a moment before its exit code does
                if not self.failure():
                    # This rank failed on its own (out of memory on its GPU, say): the others may wait in a step
                    # it never finished, and nothing can bring them back in step.
                    self._failure = (
                        f"The model failed on rank 0 ({described(error)}), so its ranks "
                        "are out of step and it cannot answer any more. Restart the app (with a smaller "
                        "model, --quant 4 or more GPUs if it ran out of memory)."
                    )
                raise UserError(self.failure()) from error

    def stop(self) -> None:
        """Tell the followers to exit, and wait for them a moment (this process is ending)."""
        if self.control is None or self.failure() or not self._lock.acquire(timeout=1.0):
            return  # no one to tell, or a generation holds the ranks: the spawned ones die with this process
        self._stopping = True
        try:
            self._tell(None)
        except RuntimeError:
            pass  # they are gone already (Ctrl-C under torchrun reaches every rank)
        finally:
            self._lock.release()
        for process in self.processes:
            process.join(timeout=5)

    def watch(self, exit_after: float = EXIT_AFTER_FAILURE_S) -> None:
        """A thread that ends this process a moment after a follower dies or this rank fails mid-generation (the
        sentence is printed first); under torchrun, its agent then ends the other ranks."""

        def watch() -> None:
            while not self.failure():
                time.sleep(0.25)
                if self._stopping:
                    return
            print(f"error: {self.failure()}", file=sys.stderr, flush=True)
            time.sleep(exit_after)
            for process in self.processes:
                process.kill()
            os._exit(1)

        threading.Thread(target=watch, name="followers-watch", daemon=True).start()


def announced(method):
    """A `LocalEngine` method that every rank must run: on rank 0 of the launchers' layout it is announced first."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def run(engine, *args, **kwargs):
        if engine.followers is None:
            return method(engine, *args, **kwargs)
        arguments = signature.bind(engine, *args, **kwargs).arguments
        arguments.pop(next(iter(signature.parameters)))  # self
        return engine.followers.run(method, engine, dict(arguments))

    return run


def follow(engine, control) -> None:
    """A follower's life: run each call rank 0 announces, until it announces the end."""
    leader = dist.get_global_rank(control, 0)
    while True:
        call = [None]
        dist.broadcast_object_list(call, src=leader, group=control)
        if call[0] is None:
            return
        name, kwargs = call[0]
        try:
            result = getattr(engine, name)(**kwargs)
            if inspect.isgenerator(result):
                for _ in result:
                    pass
        except UserError:
            pass  # rank 0 meets the same error and shows it
        except BaseException:
            # Rank 0 may already wait in a collective this rank will never join: die, so that it hears of it.
            traceback.print_exc()
            os._exit(1)


def torchrun_world() -> int:
    """The number of ranks torchrun (or another launcher that sets WORLD_SIZE) started, or 0."""
    return int(os.environ.get("WORLD_SIZE", "0")) if "RANK" in os.environ else 0


def _join(device: str, environment: dict | None = None):
    """Join the run's ranks (from torchrun's environment, or `environment`); returns the control group, over gloo
    (requests are Python objects) and patient (an idle app waits for its next request as long as it runs)."""
    os.environ.update(environment or {})
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return dist.new_group(backend="gloo", timeout=IDLE_FOREVER)


def _environment(rank: int, size: int, master_addr: str, master_port: int) -> dict:
    return dict(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_RANK=str(rank),
    )


def _leave_ctrl_c_to_rank_0() -> None:
    """Ctrl-C in a terminal reaches every rank; rank 0 alone handles it and tells the others to end, so that they
    leave quietly instead of each printing where the interrupt found it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _follower_main(environment: dict, device: str, load) -> None:
    """A spawned rank: load its shard, then follow rank 0 until it says the end."""
    _leave_ctrl_c_to_rank_0()
    try:
        control = _join(device, environment)
        follow(load(dist.group.WORLD), control)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(1)


def start_ranks(size: int, device: str, load: Callable, master_addr: str = "127.0.0.1", master_port: int = 29500):
    """Rank 0's engine, over `size` ranks that each `load(mp_group)` their shard's engine.

    Under torchrun the ranks exist already: rank 0 returns, the others follow and then end this process.
    Otherwise this process becomes rank 0 and spawns ranks 1..size-1. Rank 0's model is loaded with `followers`
    (`load(mp_group, followers=...)`), so each generation is announced to the others; a spawned follower that dies
    ends this process with a message.
    """
    processes = []
    if torchrun_world():
        if os.environ.get("RANK") != "0":
            _leave_ctrl_c_to_rank_0()
    else:
        context = torch.multiprocessing.get_context("spawn")
        processes = [
            context.Process(
                target=_follower_main,
                name=f"rank-{rank}",
                daemon=True,
                args=(_environment(rank, size, master_addr, master_port), device, load),
            )
            for rank in range(1, size)
        ]
        for process in processes:
            process.start()
    followers = Followers(None, processes)
    followers.watch()  # from now: a rank that fails, even while starting, ends this one instead of a wait forever
    control = _join(device, None if torchrun_world() else _environment(0, size, master_addr, master_port))
    if dist.get_rank() != 0:
        follow(load(dist.group.WORLD), control)
        raise SystemExit(0)
    followers.control = control
    engine = load(dist.group.WORLD, followers=followers)
    atexit.register(followers.stop)
    return engine
