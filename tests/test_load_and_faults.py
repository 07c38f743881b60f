"""Many users at once, and faults: 8 gradio_client clients in 3-turn conversations of their own, a Stop from one
of them, and an exception thrown inside generation. (Closing a tab: test_browser.py; a dead --n_gpus worker:
test_parallel.py.)"""

import threading
import time

import pytest
from gradio_client import Client

from fixtures.app_server import answer_of, serve, submit, wait_for_pieces
from local_chat.defaults import DEMO_MODEL
from local_chat.engine.interface import session_key
from local_chat.model.meta import MetaModel
from local_chat.prompting import chat_prompt
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_tab import ChatTab
from local_chat.ui.history import SavedChats
from local_chat.ui.turns import ERROR_MARK

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")

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


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL))


def conversation_alone(model: MetaModel, questions: list[str]) -> list[str]:
    """The greedy answers of one conversation, asked straight of the model, without the app or a cache."""
    history, answers = [], []
    for question in questions:
        prompt = chat_prompt(model.engine, "default", None, history, question, 64)
        [answer] = model.generate([prompt.text], max_gen_len=64, additional_stop_symbols=prompt.stop_symbols)
        answers.append(answer.strip())
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": answer.strip()}]
    return answers


class PromptLog:
    """Every prompt the model is asked, with the session that asked it. The answer to a prompt holding `hold`
    waits before its `hold_at`-th piece until `release` is set: a client that stops it then stops it mid-answer,
    however slowly its own thread runs. `held_pieces` counts the pieces that answer made; `held_end` is its
    finish reason, None if it was closed first."""

    def __init__(self, model, hold: str | None = None, hold_at: int = 3):
        self.model, self.seen, self._original = model, [], model.engine.stream
        self.hold_at, self.release = hold_at, threading.Event()
        self.held_pieces, self.held_end = 0, None

        def logged(request):
            self.seen.append((request.session, request.prompt))
            events = self._original(request)
            return self._held(events) if hold and hold in request.prompt else events

        model.engine.stream = logged

    def _held(self, events):
        try:
            for event in events:
                self.held_pieces += 1
                if self.held_pieces == self.hold_at:
                    self.release.wait(60)
                self.held_end = getattr(event, "finish_reason", None)
                yield event
        finally:
            events.close()

    def restore(self):
        del self.model.engine.stream  # the instance attribute: the class's method shows again


def test_eight_clients_three_turns_each_and_one_stop(demo):
    conversations = [[f"What is the capital of {COUNTRIES[3 * i + turn]}?" for turn in range(3)] for i in range(8)]
    expected = [conversation_alone(demo, questions) for questions in conversations]
    [whole_identity] = conversation_alone(demo, ["Who are you?"])
    log = PromptLog(demo, hold="Who are you?")
    answers, errors, sessions = {}, [], {}
    try:
        with serve(demo, delay=0.005, concurrency=2) as (url, counter):

            def talk(index):
                try:
                    client = Client(url, verbose=False)
                    sessions[index] = client.session_hash
                    history = []
                    for question in conversations[index]:
                        answer = client.predict(message=question, history=history, temperature=0.0, api_name="/chat")
                        answers.setdefault(index, []).append(answer)
                        history += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
                except Exception as error:  # noqa: BLE001 - reported below, with the client it happened to
                    errors.append((index, repr(error)))

            stopped = {}

            def stop_one():
                client = Client(url, verbose=False)
                job = client.submit(message="Who are you?", history=[], max_gen_len=200, api_name="/chat")
                wait_for_pieces(job, 1)  # the answer waits at its third token (PromptLog)
                job.cancel()
                log.release.set()
                stopped["pieces"], stopped["last"] = len(job.outputs()), (job.outputs() or [""])[-1]

            started = time.perf_counter()
            threads = [threading.Thread(target=talk, args=(i,)) for i in range(8)]
            threads.append(threading.Thread(target=stop_one))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
            wall = time.perf_counter() - started
    finally:
        log.restore()
    assert not errors, errors
    assert [answers[i] for i in range(8)] == expected  # each its own answers, as if it had been alone
    assert all(a.startswith("The capital of") for conversation in expected for a in conversation)
    for index, questions in enumerate(conversations):  # no question of one conversation reached another's prompt
        mine = [prompt for session, prompt in log.seen if session == session_key(sessions[index], "api")]
        assert len(mine) == 3
        others = [q for j, qs in enumerate(conversations) if j != index for q in qs]
        assert not any(q in prompt for prompt in mine for q in others)
        assert all(questions[turn] in mine[turn] and questions[turn - 1] in mine[turn] for turn in (1, 2))
    # Stopped while its answer waited at its third token, the model made a token or two more, not the whole answer
    # (63 tokens: 0.3 s at the 5 ms a token here), and the client has the start of it.
    assert log.held_end != "stop" and log.held_pieces < 10, (log.held_end, log.held_pieces)
    assert stopped["pieces"] >= 1 and len(stopped["last"].strip()) < len(whole_identity), stopped
    print(f"\n8 clients x 3 turns and one stopped: {wall:.1f} s wall")


def injected_failure(model, on_call: int):
    """Make the `on_call`-th forward pass from now raise, once."""
    original, calls = model.llma.forward, [0]

    def forward(*args, **kwargs):
        calls[0] += 1
        if calls[0] == on_call:
            raise RuntimeError("injected fault in the forward pass")
        return original(*args, **kwargs)

    model.llma.forward = forward
    return lambda: setattr(model.llma, "forward", original)


def test_an_exception_inside_generation_shows_in_the_chat_and_the_next_message_works(demo, caplog):
    tab = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None))

    first = submit(tab, "What is the capital of Japan?", [])[0]
    restore = injected_failure(demo, on_call=3)  # mid-answer: after the prefill and one decode step
    try:
        history, box, *_ = submit(tab, "Who are you?", first)
    finally:
        restore()
    assert history[-1]["content"] == ERROR_MARK + (
        "The model failed while answering (RuntimeError: injected fault in the forward pass); send the message "
        "again, and if it keeps failing see the app's terminal for the details."
    )
    assert box["text"] == "Who are you?"
    assert any(r.exc_info and "injected fault" in str(r.exc_info[1]) for r in caplog.records)  # the traceback is logged
    history, *_ = submit(tab, "What is the capital of Peru?", history)
    assert answer_of(history) == "The capital of Peru is Lima."  # the session's cache was not left half written


def test_an_exception_inside_generation_through_the_api(demo):
    with serve(demo) as (url, _):
        client = Client(url, verbose=False)
        restore = injected_failure(demo, on_call=2)
        try:
            with pytest.raises(Exception, match="The model failed while answering"):
                client.predict(message="Who are you?", history=[], api_name="/chat")
        finally:
            restore()
        assert (
            client.predict(message="What is the capital of Chile?", history=[], temperature=0.0, api_name="/chat")
            == "The capital of Chile is Santiago."
        )
