"""Run by test_parallel.py: the demo model on 2 CPU ranks, with rank 0's third forward pass raising (as an out of
memory on its GPU alone would). Prints every piece of one answer, then waits: the process must end by itself."""

import sys
import time

from local_chat.engine import Request, Sampling
from local_chat.launchers.flags import parser
from local_chat.launchers.loading import load_engine


def main() -> None:
    model = load_engine(parser("fault").parse_args(["--n_gpus", "2", "--device", "cpu"]))
    original, calls = model.llma.forward, [0]

    def failing_forward(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("injected fault on rank 0")
        return original(*args, **kwargs)

    model.llma.forward = failing_forward
    for event in model.stream(Request("Who are you?", Sampling(64, temperature=0.0))):
        print(event, flush=True)
    time.sleep(60)  # the launcher ends itself long before this
    print("still running", flush=True)
    sys.exit(0)


if __name__ == "__main__":  # the spawned rank imports this file too
    main()
