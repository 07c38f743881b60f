"""An engine's stream read on a thread of its own, for an async door (a Gradio handler, an HTTP route)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

_END = object()


async def in_own_thread(
    events: Iterator, update_interval: float = 0.0, instant: tuple[type, ...] = ()
) -> AsyncIterator[list]:
    """The items of `events`, made on a thread of its own, handed over in batches: each batch holds what the thread
    made since the consumer last looked, so nothing is lost while the consumer was busy.

    Gradio runs a plain generator by sending each `next()` to a worker thread and back, and the model waits idle
    during both hops and while Gradio sends the piece: on the demo model that halved the pieces/s a client saw.
    Here one thread runs the stream from start to end, so the model works while the batch before is being sent.
    `update_interval` spaces the batches (the first comes at once, and so does the one after a batch made only of
    `instant` items: the prompt's rendering, a place in the queue; the stream's end cuts the wait short, so that an
    answer's end is seen at once): sending one update per token cost Gradio's
    event loop a quarter of the process's time (the GIL), which the model then lacked. When the consumer stops
    (Stop, a closed tab, a client gone, an error), the thread closes the stream after its current step: the model
    does at most one more forward pass (a cancel flag ends it sooner). An exception in the stream is raised here.
    """
    loop = asyncio.get_running_loop()
    arrived = asyncio.Event()
    ended = asyncio.Event()  # the thread's last word is in the box: no update interval to wait
    lock = threading.Lock()
    box: list = []  # what the thread made since the consumer last looked: items, then _END or an exception
    consumer_gone = threading.Event()

    def put(item) -> None:
        with lock:
            box.append(item)
            wake = [arrived.set] if len(box) == 1 else []  # the consumer once per batch, not once per token
            wake += [ended.set] if item is _END else []
        for event_set in wake:
            if consumer_gone.is_set():
                return  # nobody reads any more
            try:
                loop.call_soon_threadsafe(event_set)
            except RuntimeError:  # the consumer's event loop is closed: nobody reads any more
                return

    def produce() -> None:
        try:
            for item in events:
                put(item)
                if consumer_gone.is_set():
                    break
        except BaseException as error:  # handed to the consumer, which raises it where its door can show it
            put(error)
        finally:
            events.close()
            put(_END)

    threading.Thread(target=produce, name="answer", daemon=True).start()
    try:
        while True:
            await arrived.wait()
            with lock:
                items = box[:]
                box.clear()
                arrived.clear()
            made = [item for item in items if item is not _END and not isinstance(item, BaseException)]
            if made:
                sent = loop.time()
                yield made
            error = next((item for item in items if isinstance(item, BaseException)), None)
            if error is not None:
                raise error
            if items and items[-1] is _END:  # the thread's last word
                return
            if made and update_interval and not all(isinstance(item, instant) for item in made):
                try:
                    await asyncio.wait_for(ended.wait(), max(0.0, sent + update_interval - loop.time()))
                except TimeoutError:
                    pass
    finally:
        consumer_gone.set()
