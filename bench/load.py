"""Many users at once: clients in conversations of their own against the real launcher on the demo model.

Three ways of asking the same questions (each client a 3-turn conversation of capitals), in turns, on two servers
started side by side (`python app.py`, and `python app.py --concurrency 1`):
- one client asks every conversation, one after the other (the baseline: no waiting at all);
- the clients ask all at once, each in a thread, against the default server (up to 8 answers at once, computed in
  one batch per step);
- the same against the --concurrency 1 server (answers queued, one at a time).
Figures: each crowd's wall time over the baseline's, and how long the slowest requests waited for their first
piece (90th percentile) over the first piece of a request that never waits.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

from .timing import median_ratio
from .ui_overhead import client_timeline, servers

COUNTRIES = [
    "France",
    "Germany",
    "Italy",
    "Spain",
    "Portugal",
    "Japan",
    "China",
    "India",
    "Canada",
    "Brazil",
    "Argentina",
    "Mexico",
    "Egypt",
    "Kenya",
    "Nigeria",
    "Russia",
    "Australia",
    "Greece",
    "Turkey",
    "Sweden",
    "Norway",
    "Finland",
    "Poland",
    "Austria",
]
ANSWER_TOKENS = 64


def conversations(clients: int, turns: int) -> list[list[str]]:
    return [
        [f"What is the capital of {COUNTRIES[(turns * c + t) % len(COUNTRIES)]}?" for t in range(turns)]
        for c in range(clients)
    ]


def converse(client, questions: list[str], firsts: list[float]) -> None:
    """One conversation, each answer fed back as history; the time to each first piece goes to `firsts`."""
    history = []
    for question in questions:
        timeline = client_timeline(client, question, ANSWER_TOKENS, history)
        if not timeline.texts or not timeline.texts[-1].startswith("The capital of"):
            raise AssertionError(f"{question!r} was answered {timeline.texts[-1:]!r}")
        firsts.append(timeline.first)
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": timeline.texts[-1]}]


def one_after_another(client, talks: list[list[str]], firsts: list[float]) -> float:
    started = time.perf_counter()
    for questions in talks:
        converse(client, questions, firsts)
    return time.perf_counter() - started


def all_at_once(clients: list, talks: list[list[str]], firsts: list[float]) -> float:
    threads = [
        threading.Thread(target=converse, args=(client, questions, firsts)) for client, questions in zip(clients, talks)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(settings) -> dict[str, float]:
    from gradio_client import Client

    talks = conversations(settings.load_clients, settings.load_turns)
    app = [sys.executable, "app.py"]
    with servers([app, app + ["--concurrency", "1"]]) as (one, two):  # both start at once
        crowds = {name: [Client(c.src, verbose=False) for _ in talks] for name, c in (("one", one), ("two", two))}
        walls = {"alone": [], "one": [], "two": []}
        firsts = {"alone": [], "one": [], "two": []}
        one_after_another(one, talks, []), one_after_another(two, talks, [])  # warm up
        for round_ in range(settings.load_repeats):
            for name in ("alone", "one", "two")[round_ % 3 :] + ("alone", "one", "two")[: round_ % 3]:
                if name == "alone":
                    walls[name].append(one_after_another(one, talks, firsts[name]))
                else:
                    walls[name].append(all_at_once(crowds[name], talks, firsts[name]))
    alone_first = statistics.median(firsts["alone"])
    return {
        "load_clients_over_one_client": median_ratio(walls["one"], walls["alone"]),
        "load_one_at_a_time_over_one_client": median_ratio(walls["two"], walls["alone"]),
        "load_wait_p90_over_alone": percentile(firsts["one"], 0.9) / alone_first,
        "load_wait_p90_over_alone_one_at_a_time": percentile(firsts["two"], 0.9) / alone_first,
    }
