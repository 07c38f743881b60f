"""The bad-input matrix: every mistake a user can make at start-up or while chatting is one clear sentence.

Start-up (a flag, a path, a checkpoint, a port): the launcher prints one line, "error: ...", and exits with code 1,
before any server starts. While running (a message, an upload, a setting): the sentence shows in the chat or comes
back to the API caller, what the user typed stays in the message box, and the next request is answered.
"""

import asyncio
import json
import shutil
import socket
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
from gradio_client import Client, handle_file
from PIL import Image

from fixtures.app_server import answer_of, serve, submit
from local_chat.defaults import DEMO_MODEL
from local_chat.errors import UserError
from local_chat.launchers import browser
from local_chat.model.meta import MetaModel
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_tab import ChatTab
from local_chat.ui.history import SavedChats
from local_chat.ui.single_turn import SingleTurnTab
from local_chat.ui.turns import ERROR_MARK

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")


# ----- start-up -----


@pytest.fixture
def start_output(capsys, monkeypatch):
    def started(self, *args, **kwargs):
        raise AssertionError("the app started serving instead of refusing its flags")

    monkeypatch.setattr(gr.Blocks, "launch", started)

    def run(argv, tabs=("chat", "vision", "single"), with_visual=False) -> str:
        with pytest.raises(SystemExit) as ended:
            browser.launch("test", tabs, with_visual=with_visual, argv=argv)
        err = capsys.readouterr().err.strip()
        assert ended.value.code == 1, err
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "Traceback" not in err, err
        return lines[0]

    return run


def copy_folder(src: Path, dst: Path, skip=()) -> Path:
    shutil.copytree(src, dst, ignore=lambda _, names: [n for n in names if n in skip])
    return dst


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def remote_code_folder(byte_llama_dir: Path, folder: Path) -> Path:
    """A checkpoint that ships its own Python (auto_map), which leaves a mark when it runs."""
    copy_folder(byte_llama_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="tiny_custom",
        auto_map={
            "AutoConfig": "configuration_tiny.TinyConfig",
            "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_tiny.py").write_text(
        "from pathlib import Path\nfrom transformers import LlamaConfig\n"
        f"Path({str(folder / 'code-ran')!r}).touch()\n"
        "class TinyConfig(LlamaConfig):\n    model_type = 'tiny_custom'\n"
    )
    (folder / "modeling_tiny.py").write_text(
        "from transformers import LlamaForCausalLM\nfrom .configuration_tiny import TinyConfig\n"
        "class TinyForCausalLM(LlamaForCausalLM):\n    config_class = TinyConfig\n"
    )
    return folder


def test_startup_matrix(start_output, tmp_path, checkpoints, byte_llama_dir, busy_port):
    empty = tmp_path / "empty"
    empty.mkdir()
    missing_shard = copy_folder(checkpoints["accessory"], tmp_path / "acc", skip=("consolidated.01-of-02.model.pth",))
    wrong_params = copy_folder(checkpoints["meta"], tmp_path / "meta")
    params = json.loads((wrong_params / "params.json").read_text())
    (wrong_params / "params.json").write_text(json.dumps(params | {"dim": 96}))
    remote = remote_code_folder(byte_llama_dir, tmp_path / "remote")
    cases = [
        (["--pretrained_path", str(tmp_path / "nope")], "does not exist; check --pretrained_path"),
        (["--pretrained_path", str(empty)], "No checkpoint found in"),
        (["--pretrained_path", str(missing_shard)], "consolidated.01-of-02.model.pth absent"),
        (["--pretrained_path", str(wrong_params)], "does not match these weights"),
        (
            ["--pretrained_path", str(checkpoints["accessory"]), "--llama_type", "llama_ens5"],
            "llama_type 'llama_ens5' is one of LLaMA2-Accessory's multimodal models",
        ),
        (
            ["--pretrained_path", str(remote)],
            "ships its own Python code (auto_map in its config), which runs only with --trust_remote_code",
        ),
        (["--template", "nonsense"], "Unknown --template 'nonsense'; choose one of"),
        (["--n_gpus", str(_gpus() + 2), "--device", "cuda"], "GPUs were asked for"),
        (
            ["--n_gpus", "2"] if not _gpus() else ["--n_gpus", str(_gpus() + 1)],
            "no GPU is visible; add --device cpu" if not _gpus() else "visible",
        ),
        (["--port", str(busy_port)], f"Port {busy_port} on 127.0.0.1 cannot be used"),
        (["--port", "70000"], "--port 70000 is not a port number"),
        (["--quant", "3"], "argument --quant: invalid choice"),
        (["--auth", "alice"], "--auth takes USER:PASSWORD"),
        (["--max_upload_mb", "0"], "--max_upload_mb 0.0: give a size above 0"),
    ]
    for argv, sentence in cases:
        assert sentence in start_output(argv), argv
    assert not (remote / "code-ran").exists()  # refused before any of the checkpoint's code ran
    assert "holds a text-only model" in start_output(
        ["--pretrained_path", str(byte_llama_dir)], ("vision",), with_visual=True
    )


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def test_the_command_line_checks_sampling_as_v1_does_before_the_model_loads(byte_llama_dir, capsys):
    from local_chat.launchers.generate import main

    for flags, sentence in [
        (["--temperature", "7"], "`temperature` is 7; give from 0 to 2."),
        (["--top_p", "1.5"], "`top_p` is 1.5; give from 0 to 1."),
        (["--top_k", "-3"], "`top_k` is -3; give a whole number from 0 to 1000000."),
    ]:
        with pytest.raises(SystemExit):
            main(["--pretrained_path", str(byte_llama_dir / "nope"), "--prompt", "Hi", *flags])
        assert sentence in capsys.readouterr().err, flags  # told before the (missing) checkpoint is looked at


@pytest.mark.parametrize(
    "flags, sentence",
    [
        (["--template", "nonsense"], "Unknown --template 'nonsense'; choose one of: default, simple"),
        (["--port", "70000"], "--port 70000 is not a port number; pick one from 1 to 65535."),
    ],
)
def test_a_bad_template_or_port_is_told_before_anything_starts(flags, sentence, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(browser, "web_server", lambda args: started.append("web server"))
    monkeypatch.setattr(browser, "load_engine", lambda *a, **k: started.append("model"))
    with pytest.raises(SystemExit):
        browser.app(flags)
    assert sentence in capsys.readouterr().err and started == []  # neither the web server nor the model


def test_quant_where_bitsandbytes_cannot_run(no_bitsandbytes, checkpoints):
    """On the CPU --quant runs on torch's own kernels; under a LoRA adapter it needs bitsandbytes (PEFT wraps its
    layers), and says so."""
    assert MetaModel.from_pretrained(str(checkpoints["hf"]), quant=4).generate(["Hi"], max_gen_len=2)[0] is not None
    with pytest.raises(UserError, match="^--quant needs bitsandbytes, which cannot run here"):
        MetaModel.from_pretrained(str(checkpoints["hf"]), quant=4, lora={"a": str(checkpoints["hf"])})


def test_trust_remote_code_runs_the_checkpoints_code_only_when_asked(tmp_path, byte_llama_dir):
    remote = remote_code_folder(byte_llama_dir, tmp_path / "remote")
    model = MetaModel.from_pretrained(str(remote), trust_remote_code=True)
    assert (remote / "code-ran").exists() and type(model.llma).__name__ == "TinyForCausalLM"


def test_a_launcher_in_a_real_process_prints_one_line_and_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "--pretrained_path", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: Checkpoint path")


# ----- while running: through the API, as an outside program -----


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL))


@pytest.fixture(scope="module")
def client(demo):
    with serve(demo) as (url, _):
        yield Client(url, verbose=False)


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@pytest.fixture(scope="module")
def uploads(tmp_path_factory) -> dict[str, Path]:
    """A file for each kind of bad upload, and a good 1x1 image."""
    folder = tmp_path_factory.mktemp("uploads")
    picture = Image.new("RGB", (64, 64), (200, 30, 30))
    picture.save(folder / "good.png")
    picture.save(folder / "good.jpg")
    png, jpeg = (folder / "good.png").read_bytes(), (folder / "good.jpg").read_bytes()
    files = {
        "text renamed .png": b"hello, this is not an image\n" * 20,
        "truncated PNG": png[: len(png) // 2],
        "corrupt PNG": png[:50] + bytes(b ^ 0xFF for b in png[50:60]) + png[60:],
        "truncated JPEG": jpeg[: len(jpeg) // 2],
        # Only the header is real: 20,000 x 20,000 pixels that would take 1.2 GB decoded.
        "20000x20000 PNG": b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\0" * 1000))
        + chunk(b"IEND", b""),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = folder / (name.replace(" ", "-") + (".jpg" if "JPEG" in name else ".png"))
        paths[name].write_bytes(data)
    Image.new("RGB", (1, 1), (0, 0, 255)).save(folder / "one-pixel.png")
    paths["1x1"] = folder / "one-pixel.png"
    return paths


UPLOAD_SENTENCES = {
    "text renamed .png": "is not an image this app can read",
    "truncated PNG": "is not an image this app can read",
    "corrupt PNG": "is not an image this app can read",
    "truncated JPEG": "is not an image this app can read",
    "20000x20000 PNG": "The image has over 179 million pixels; upload one under 40 megapixels",
}


def answers_next(client: Client) -> None:
    assert (
        client.predict(message="What is the capital of France?", history=[], temperature=0.0, api_name="/chat")
        == "The capital of France is Paris."
    )


def refused(client: Client, sentence: str, api_name="/chat", **kwargs) -> str:
    with pytest.raises(Exception) as raised:
        client.predict(api_name=api_name, **kwargs)
    assert sentence in str(raised.value), str(raised.value)
    return str(raised.value)


@pytest.mark.parametrize("message", ["", "   \n "])
def test_empty_message(client, message):
    refused(client, "The message is empty; type a question first.", message=message, history=[])
    answers_next(client)


def test_a_100000_character_message(client):
    refused(client, "but the model's context holds 2048; shorten it", message="word " * 20_000, history=[])
    answers_next(client)


@pytest.mark.parametrize("kind", list(UPLOAD_SENTENCES))
def test_bad_uploads(client, uploads, kind):
    refused(
        client,
        UPLOAD_SENTENCES[kind],
        message="What is in the image?",
        history=[],
        image=handle_file(str(uploads[kind])),
    )
    answers_next(client)


def test_a_1x1_image_is_answered(client, uploads):
    answer = client.predict(
        message="What is in the image?",
        history=[],
        image=handle_file(str(uploads["1x1"])),
        temperature=0.0,
        api_name="/chat",
    )
    assert answer.endswith(".") and ERROR_MARK not in answer


@pytest.mark.parametrize(
    "setting, sentence",
    [
        (dict(temperature=-1.0), "`temperature` is -1; give from 0 to 2."),
        (dict(temperature=9.0), "`temperature` is 9; give from 0 to 2."),  # as /v1 says it
        (dict(top_p=0.0), "`top_p` is 0; give a value above 0 and at most 1."),
        (dict(max_gen_len=0), "`max_new_tokens` is 0; give a whole number from 1 to 1000000000."),
        (dict(top_k=-1), "`top_k` is -1; give a whole number from 0 to 1000000."),
        (dict(repetition_penalty=0.0), "`repetition_penalty` is 0; give from 0.01 to 10."),
    ],
)
def test_bad_settings(client, setting, sentence):
    refused(client, sentence, message="What is the capital of Peru?", history=[], **setting)
    answers_next(client)


def test_unknown_template_and_empty_instruction(client):
    refused(client, "Unknown prompt template 'nonsense'", "/single_turn", instruction="Hi", template="nonsense")
    refused(client, "The instruction is empty; type one first.", "/single_turn", instruction=" ")
    answers_next(client)


def test_unknown_conversation_template_and_role(client):
    refused(
        client,
        "Unknown conversation template 'nonsense'; choose one of: ",
        message="Hi",
        history=[],
        template="nonsense",
    )
    refused(
        client,
        "'alpaca' is a single-turn template: call /single_turn with it, or pass /chat one of: default,",
        message="Hi",
        history=[],
        template="alpaca",
    )
    refused(
        client,
        "The history holds a message with role 'tool'; the roles are user, assistant and system.",
        message="Hi",
        history=[{"role": "tool", "content": "42"}],
    )
    answers_next(client)


def test_a_history_that_is_not_messages(client):
    refused(client, "which is not a message; pass a list of", message="Hi", history=["just text"])
    pairs = [["What is the capital of France?", "The capital of France is Paris."]]  # older clients' shape
    assert (
        client.predict(message="What is the capital of Japan?", history=pairs, temperature=0.0, api_name="/chat")
        == "The capital of Japan is Tokyo."
    )


def test_an_image_for_a_text_only_model(byte_model, uploads):
    with serve(byte_model) as (url, _):
        client = Client(url, verbose=False)
        refused(
            client,
            "This model cannot see images; send the message without an image",
            message="Hi",
            history=[],
            image=handle_file(str(uploads["1x1"])),
        )
        assert client.predict(message="Hi", history=[], max_gen_len=4, api_name="/chat") is not None


# ----- while running: in the chat itself -----


def shows_error_and_keeps_message(update, message: str, sentence: str) -> None:
    history, box = update[0], update[1]
    assert history[-1]["content"].startswith(ERROR_MARK) and sentence in history[-1]["content"], history[-1]
    assert box["text"] == message  # what the user typed (and attached) is still in the message box


def test_errors_show_in_the_chat_and_the_message_stays(demo, uploads):
    chat = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None))
    long_message = "word " * 20_000
    shows_error_and_keeps_message(submit(chat, long_message), long_message, "but the model's context holds 2048")
    refuses_attachment_and_keeps_text(
        chat, "What is in the image?", str(uploads["truncated PNG"]), "is not an image this app can read"
    )
    shows_error_and_keeps_message(
        submit(chat, "What is the capital of Peru?", repetition_penalty=0.0),
        "What is the capital of Peru?",
        "`repetition_penalty` is 0; give from 0.01 to 10.",
    )
    shows_error_and_keeps_message(  # the page's settings: /v1's limits and sentences
        submit(chat, "What is the capital of Peru?", temperature=9.0),
        "What is the capital of Peru?",
        "`temperature` is 9; give from 0 to 2.",
    )
    # The failed turns never reach the model: the next answer is the one-turn answer.
    history = submit(chat, "What is the capital of Peru?", history=submit(chat, long_message)[0])[0]
    assert answer_of(history) == "The capital of Peru is Lima."
    assert "1 oldest turn" not in str(history)


def test_an_empty_message_is_a_warning_and_sends_nothing(demo):
    chat = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None))
    with pytest.warns(UserWarning, match="The message is empty; type a question first."):
        history, box, *_ = submit(chat, "  ")
    assert history == [] and box == {"text": "  ", "files": []}


def refuses_attachment_and_keeps_text(chat, message: str, attachment: str, sentence: str) -> None:
    """A file that cannot go to the model is taken out of the message box with a warning; the text stays there, the
    chat is left as it was, and the next Send (the same text) works."""
    with pytest.warns(UserWarning, match="Taken out of the message|does not see images") as warned:
        history, box, *_ = submit(chat, message, image=attachment)
    assert sentence in str(warned[0].message)
    assert history == gr.skip(), history  # nothing added to the chat
    assert box == {"text": message, "files": []}
    history = submit(chat, box)[0]
    assert history[0] == {"role": "user", "content": message} and not answer_of(history).startswith(ERROR_MARK)


def test_a_bad_image_upload_is_taken_out_of_the_message(demo, byte_model, uploads):
    chat = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None))
    refuses_attachment_and_keeps_text(
        chat, "What is in the image?", str(uploads["20000x20000 PNG"]), "The image has over 179 million pixels"
    )
    small = ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(None), max_upload_mb=0.0001)
    refuses_attachment_and_keeps_text(
        small, "What is in the image?", str(uploads["1x1"].parent / "good.png"), "upload one under 0.0001 MB"
    )
    text_only = ChatTab(byte_model.engine, Cancels(), "chat_template", "padded_resize", SavedChats(None))
    refuses_attachment_and_keeps_text(
        text_only, "What is in the image?", str(uploads["1x1"].parent / "good.png"), "This model does not see images"
    )
    good, bad = str(uploads["1x1"].parent / "good.png"), str(uploads["truncated PNG"])
    with pytest.warns(UserWarning, match="Taken out of the message"):
        _, box, *_ = submit(chat, {"text": "What is in the image?", "files": [good, bad]})
    assert box == {"text": "What is in the image?", "files": [good]}  # only the bad one is taken out


def test_a_taken_default_port_is_told(capsys):
    from local_chat.launchers.flags import first_free_port
    from local_chat.launchers.loading import free_port

    taken = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        port = first_free_port("127.0.0.1", taken)
    assert port > taken
    assert f"Port {taken} is taken: serving on {port} instead" in capsys.readouterr().err


def test_single_turn_tab_errors_show_in_the_answer_box(demo):
    tab = SingleTurnTab(demo.engine, Cancels())

    async def last(instruction, template):
        update = None
        async for update in tab.run(
            instruction, "", template, 64, 0.0, 0.75, 0, 1.0, request=SimpleNamespace(session_hash="tab")
        ):
            pass
        return update

    assert asyncio.run(last("", "alpaca"))[0] == ERROR_MARK + "The instruction is empty; type one first."
    assert asyncio.run(last("word " * 20_000, "alpaca"))[0].startswith(ERROR_MARK + "The prompt is")
    assert "Lima" in asyncio.run(last("What is the capital of Peru?", "alpaca"))[0]


@pytest.mark.parametrize(
    "command",
    [
        ["app.py", "--help"],
        ["app.py", "--no_such_flag"],
        ["demos/multi_turn.py", "--help"],
        ["demos/generate.py", "--help"],
    ],
)
def test_help_and_a_bad_flag_answer_before_torch_and_transformers_load(command):
    """`--help` and a mistyped flag need neither torch, transformers nor Gradio: their answer comes at once."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *[str(ROOT / command[0]), *command[1:]]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert result.returncode == (0 if command[-1] == "--help" else 1)
    assert not imported & {"torch", "transformers", "gradio"}, sorted(imported & {"torch", "transformers", "gradio"})
