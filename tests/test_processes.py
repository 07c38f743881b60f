"""The browser launchers' two processes (engine/process.py): the web server's engine over the pipe answers as the
model does and passes Stop on; either process ending ends the other, with a sentence."""

import multiprocessing
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from fixtures.app_server import ForwardCounter, interrupted, launched, v1_answer, wait_for_pieces
from local_chat.defaults import DEMO_MODEL
from local_chat.engine import Delta, End, Engine, Request, Sampling
from local_chat.engine.pipe import PipeEngine
from local_chat.engine.process import model_facts, serve_model


@pytest.fixture
def remote(byte_model):
    """(the byte model as the web server's process sees it, a counter of the model's forward passes)."""
    model_end, server_end = multiprocessing.Pipe()
    counter = ForwardCounter(byte_model)
    serving = threading.Thread(target=serve_model, args=(byte_model.engine, model_end), daemon=True)
    serving.start()
    facts = model_facts(byte_model.engine)
    yield PipeEngine(server_end, facts, end_process=False), counter
    hang_up(server_end)  # as when the web server's process ends: the model's side returns
    serving.join(timeout=10)
    counter.restore()
    assert not serving.is_alive()


def hang_up(connection) -> None:
    """End a pipe at once, even while threads wait on it (closing their descriptor would not wake them)."""
    socket.socket(fileno=os.dup(connection.fileno())).shutdown(socket.SHUT_RDWR)


def texts(events) -> list[str]:
    return [event.text for event in events if isinstance(event, Delta)]


def test_the_pipe_engine_answers_as_the_model_does(remote, byte_model):
    engine, _ = remote
    assert isinstance(engine, Engine) and isinstance(byte_model.engine, Engine)
    assert engine.prompt_length("Hello there") == byte_model.engine.prompt_length("Hello there")
    assert engine.max_seq_len == byte_model.max_seq_len and engine.summary() == byte_model.engine.summary()
    assert engine.generation_defaults() == byte_model.engine.generation_defaults()
    asked = Request("Hello", Sampling(20, temperature=0.8, top_p=0.9, seed=3), stop=("\n###",), logprobs=2)
    remote_events, own_events = list(engine.stream(asked)), list(byte_model.engine.stream(asked))
    assert texts(remote_events) == texts(own_events) and "".join(texts(own_events))
    assert [e.logprobs for e in remote_events[:-1]] == [e.logprobs for e in own_events[:-1]]
    counts = lambda end: (end.finish_reason, end.prompt_tokens, end.completion_tokens, end.token_ids)
    assert isinstance(own_events[-1], End) and counts(remote_events[-1]) == counts(own_events[-1])


def test_only_the_new_text_crosses_the_pipe(remote, byte_model):
    """Each event carries the text added since the one before: what crosses grows with the answer, not its square."""
    engine, _ = remote
    events = list(engine.stream(Request("Hello", Sampling(60, temperature=0.0))))
    whole = byte_model.generate(["Hello"], max_gen_len=60, temperature=0.0)[0]
    assert "".join(texts(events)) == whole and len(events) > 10
    assert sum(len(text) for text in texts(events)) == len(whole)


def test_a_users_mistake_is_the_same_sentence(remote):
    engine, _ = remote
    [end] = list(engine.stream(Request("Hello", Sampling(), images=["not an image"])))
    assert end.finish_reason == "error" and end.caller_error and "cannot see images" in end.error
    assert engine.prompt_length("Hello again") > 0  # and the model still answers


def test_a_failure_in_the_model_reaches_the_chat_as_a_sentence(remote, byte_model, monkeypatch, capsys, caplog):
    original = byte_model.engine.answer_steps

    def broken(*args, **kwargs):
        for item in original("Hello", sampling=Sampling(3, temperature=0.0)):
            if isinstance(item, End):  # instead of its end, the fault
                raise RuntimeError("injected fault")
            yield item

    monkeypatch.setattr(byte_model.engine, "answer_steps", broken)
    engine, _ = remote
    events = list(engine.stream(Request("Hello")))
    assert texts(events) and events[-1].finish_reason == "error" and not events[-1].caller_error
    assert events[-1].error.startswith("The model failed while answering (RuntimeError: injected fault)")
    # The traceback is printed once, by the model's process, which has its frames; not again by the server's.
    printed = capsys.readouterr().err + caplog.text
    assert printed.count("RuntimeError: injected fault") == 1 and "in broken" in printed, printed


def test_stop_and_a_reader_that_leaves_stop_the_model(remote):
    engine, counter = remote
    counter.delay = 0.02
    cancel = threading.Event()
    events = engine.stream(Request("Hello", Sampling(400), cancel=cancel))
    for _ in range(3):
        next(events)
    cancel.set()
    at_stop = counter.calls
    assert list(events)[-1].finish_reason == "cancelled"
    assert counter.settled(quiet=0.3) - at_stop <= 3  # the steps under way while the flag crossed over

    events = engine.stream(Request("Hello", Sampling(400)))
    for _ in range(3):
        next(events)
    events.close()
    at_close = counter.calls
    assert counter.settled(quiet=0.3) - at_close <= 3


def web_server_of(app) -> int:
    found = subprocess.run(["pgrep", "-P", str(app.pid), "-f", "spawn_main"], capture_output=True, text=True)
    return int(found.stdout)


def ended(pid: int, within: float) -> bool:
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


needs_demo = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")


def test_a_killed_model_process_is_an_error_in_the_chat_and_the_server_exits(byte_llama_dir):
    app, client = launched("--pretrained_path", str(byte_llama_dir))
    server = web_server_of(app)
    # a random model's greedy answer runs to its length (the demo model's short answers could end before the kill)
    job = client.submit(message="Hello", history=[], max_gen_len=2000, temperature=0.0, api_name="/chat")
    wait_for_pieces(job, 2)
    app.kill()
    with pytest.raises(Exception, match="The model's process stopped"):
        job.result(timeout=10)
    assert ended(server, within=10)
    app.wait()


@needs_demo
def test_a_killed_web_server_ends_the_launcher_with_a_sentence():
    app, client = launched()
    assert (
        client.predict(message="What is the capital of Peru?", history=[], temperature=0.0, api_name="/chat")
        == "The capital of Peru is Lima."
    )
    os.kill(web_server_of(app), signal.SIGKILL)
    code, printed = app.wait(timeout=20), app.stdout.read()
    assert code == 1 and "error: the web server's process stopped (exit code -9)." in printed, (code, printed)


@needs_demo
def test_a_terminated_launcher_ends_its_server_quietly():
    app, _ = launched()
    server = web_server_of(app)
    app.terminate()
    code, printed = app.wait(timeout=20), app.stdout.read()
    assert code == 0, (code, printed)  # not -6: SIGABRT from the interpreter finalizing around torch threads
    assert ended(server, within=5)
    assert "error" not in printed


@needs_demo
def test_compile_compiles_before_serving_with_the_threads_it_answers_with():
    """`app.py --compile` compiles the decode step before it serves, once the model's threads leave a core to the
    web server: the first answer compiles nothing (torch compiles again for another thread count: 1.2-5 s here)."""
    app, client = launched("--compile", env={"TORCH_LOGS": "recompiles"})
    assert (
        client.predict(message="What is the capital of France?", history=[], api_name="/chat")
        == "The capital of France is Paris."
    )
    assert v1_answer(client, "What is the capital of Japan?") == "The capital of Japan is Tokyo."
    printed = interrupted(app)
    assert "Compiled the decode step in" in printed and "Recompiling" not in printed, printed
