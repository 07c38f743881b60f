"""Safe defaults: local-only unless asked, a warning when others can reach the app, logins, an upload cap.
(Weights load with weights_only=True: test_loading.py; --trust_remote_code: test_bad_input.py; HTML in messages and
answers never runs: test_browser.py.)"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from PIL import Image

from local_chat.defaults import DEMO_MODEL
from local_chat.launchers.flags import exposure_warnings, parser
from local_chat.launchers.loading import free_port

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_are_local_and_closed():
    args = parser("test").parse_args([])
    assert args.host == "127.0.0.1" and not args.share and args.auth is None
    assert not args.trust_remote_code and args.max_upload_mb == 20
    assert exposure_warnings(args) == []


def test_reachable_servers_are_warned_about():
    args = parser("test").parse_args(["--host", "0.0.0.0", "--port", "8080", "--share"])
    host, share = exposure_warnings(args)
    assert host == (
        "Listening on 0.0.0.0: anyone who can reach this machine on port 8080 can use the model. "
        "Add --auth USER:PASSWORD to ask for a password (and --api_key KEY for /v1)."
    )
    assert share.startswith("--share opens a public link: anyone who has it can use the model.")
    with_login = parser("test").parse_args(["--host", "0.0.0.0", "--auth", "alice:secret"])
    assert "--auth" not in exposure_warnings(with_login)[0]


@pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")
def test_an_exposed_app_asks_for_a_login_and_caps_uploads(tmp_path):
    logins = tmp_path / "logins"
    logins.write_text("# who may use the app\nalice:secret\nbob:hunter2\n")
    port = free_port()
    app = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "app.py"),
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--auth",
            str(logins),
            "--max_upload_mb",
            "0.01",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output = wait_for_line(app, "--share makes a public link", timeout=120)
        assert f"Running on http://localhost:{port}/" in output and "share=True" not in output  # the app's own flag
        assert "warning: Listening on 0.0.0.0: anyone who can reach this machine" in output
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(Exception, match="credentials were not provided"):
            Client(url, verbose=False)
        with pytest.raises(Exception, match="Could not login"):
            Client(url, auth=("alice", "wrong"), verbose=False)
        with pytest.raises(urllib.error.HTTPError) as refused:  # the API itself, not only the page
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{url}/gradio_api/call/chat",
                    method="POST",
                    data=json.dumps({"data": ["Hi", []]}).encode(),
                    headers={"Content-Type": "application/json"},
                )
            )
        assert refused.value.code == 401
        client = Client(url, auth=("bob", "hunter2"), verbose=False)
        assert (
            client.predict(message="What is the capital of Peru?", history=[], temperature=0.0, api_name="/chat")
            == "The capital of Peru is Lima."
        )
        noise = tmp_path / "noise.png"
        Image.frombytes("RGB", (100, 100), os.urandom(30_000)).save(noise)  # 30 KB, over the 10 KB cap
        with pytest.raises(Exception, match="exceeds the maximum file size of 10000 bytes"):
            client.predict(message="What is in the image?", history=[], image=handle_file(str(noise)), api_name="/chat")
    finally:
        app.terminate()
        app.wait(30)


def wait_for_line(process: subprocess.Popen, text: str, timeout: float) -> str:
    """What the process printed up to the first line holding `text`."""
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        lines.append(line)
        if text in line:
            return "".join(lines)
    raise AssertionError(f"{text!r} never printed:\n{''.join(lines)}")
