"""The CPU's worker threads, handed back by a thread that is done computing.

torch computes on the CPU with OpenMP (GNU's libgomp in the PyPI wheels). Each thread that runs a parallel region
gets a pool of worker threads, kept after the region for its next one. Where the pools of all threads together hold
more threads than the machine has cores, libgomp's threads stop spinning while they wait for the next region and
sleep at once, and a decode step (some 200 regions) then waits for a wake-up at every one. The model loads in one
thread and answers in others (one per answer, the batch's own), so a pool left behind by the loading slowed every
answer: 14.0 tokens/s instead of 18.6 (a Llama of Qwen2.5-0.5B's shape in bf16, 2-core Xeon, one answer at a time).

So a thread that is done computing for a while (the model loaded, an answer ended, a batch run down) hands its pool
back with OpenMP's `omp_pause_resource_all`, and the thread that answers next has the cores' workers to itself. A
pool costs a thread start to make again, so it is not handed back between the steps of an answer (after every step:
16.7 tokens/s). Other OpenMP runtimes (LLVM's, Intel's) pause the whole process, not one thread: only libgomp's is
called.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

OMP_PAUSE_HARD = 2  # OpenMP's omp_pause_hard: the pool's threads end


@functools.cache
def _libgomp():
    """torch's own libgomp, where it ships one (Linux wheels), else None."""
    for path in sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*")):
        try:
            library = ctypes.CDLL(str(path))
            library.omp_pause_resource_all.argtypes = [ctypes.c_int]
            return library
        except (OSError, AttributeError):
            continue
    return None


def hand_back_workers() -> None:
    """End the calling thread's OpenMP worker threads (they start again with its next parallel region)."""
    if (library := _libgomp()) is not None:
        library.omp_pause_resource_all(OMP_PAUSE_HARD)
