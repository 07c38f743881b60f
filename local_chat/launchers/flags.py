"""The command-line flags every launcher shares (LLaMA2-Accessory's, plus serving options), and their checks.

Imports neither torch nor transformers, so that `--help` and a bad flag answer at once (launchers/loading.py loads
the model the flags name).
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from local_chat.defaults import (
    DEFAULT_CONTEXT,
    IMAGE_TRANSFORM,
    IMAGE_TRANSFORMS,
    MAX_CACHED_SESSIONS,
    MAX_TOOL_ROUNDS,
    MAX_UPLOAD_MB,
    TOOL_TIMEOUT_S,
    WEB_SEARCH,
)
from local_chat.errors import UserError

from .settings import LaunchSettings

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


class FlagParser(argparse.ArgumentParser):
    """argparse, with a malformed flag told like every other start-up problem: one sentence, exit code 1, and the
    flags returned as one frozen `LaunchSettings` (launchers/settings.py)."""

    def parse_args(self, args=None, namespace=None) -> LaunchSettings:
        if isinstance(namespace, LaunchSettings):  # more flags read over settled ones (--models_config's)
            namespace = namespace.flags()
        return LaunchSettings.from_flags(super().parse_args(args, namespace))

    def error(self, message: str):
        print(f"error: {message}; see --help for the flags.", file=sys.stderr)
        raise SystemExit(1)


def known_model_folders() -> list[str]:
    """The folders where Ollama, LM Studio and the Hugging Face cache keep models, those this machine has."""
    import os

    home = Path.home()
    hub = os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or home / ".cache" / "huggingface") / "hub"
    places = [os.environ.get("OLLAMA_MODELS") or home / ".ollama" / "models", home / ".lmstudio" / "models", hub]
    return [str(place) for place in map(Path, places) if place.is_dir()]


class ModelFolders(argparse.Action):
    """--models_dir DIR [DIR ...], or --models_dir alone: `known_model_folders()`."""

    def __call__(self, parser, namespace, values, option_string=None):
        folders = values or known_model_folders()
        if not folders:
            parser.error(
                "--models_dir with no folder looks in Ollama's (~/.ollama/models), LM Studio's (~/.lmstudio/models) "
                "and the Hugging Face cache (~/.cache/huggingface/hub), and none of them is here: name a folder."
            )
        setattr(namespace, self.dest, folders)


def parser(description: str) -> argparse.ArgumentParser:
    """The flags of app.py and the browser demos: the model's, then serving."""
    p = FlagParser(description=description)
    add_model_flags(p)
    p.add_argument(
        "--image_transform",
        choices=IMAGE_TRANSFORMS,
        default=IMAGE_TRANSFORM,
        help="how an uploaded image is fitted to the model: auto (default) lets the model's processor do it "
        "(its resolution, tiling), or the transform the model was trained with (the demo model's "
        "padded_resize); padded_resize or resized_center_crop square it first, as Accessory does",
    )
    p.add_argument(
        "--template",
        default=None,
        help="conversation template (default: the model's chat template if it has one, else 'default')",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0 to listen on the network)")
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"port to serve on (default: the first free from {DEFAULT_PORT}, told when it is not that one)",
    )
    p.add_argument("--share", action="store_true", help="also open a public Gradio share link")
    p.add_argument(
        "--auth",
        default=None,
        metavar="USER:PASSWORD|FILE",
        help="ask for this user name and password, or any USER:PASSWORD line of this file",
    )
    p.add_argument(
        "--api_key",
        default=None,
        metavar="KEY|FILE",
        help="the OpenAI-compatible API (/v1) asks for this key (Authorization: Bearer KEY), or any key of this "
        "file (one a line); without it /v1 is open to whoever reaches the server, and off when --auth is given",
    )
    p.add_argument("--max_upload_mb", type=float, default=MAX_UPLOAD_MB, help="largest image file accepted, in MB")
    p.add_argument(
        "--history_db",
        default=None,
        metavar="PATH",
        help="the SQLite file that keeps every user's conversations, their images beside it (default: "
        "$XDG_DATA_HOME/local-chat/conversations.db, else ~/.local/share/local-chat/conversations.db)",
    )
    p.add_argument(
        "--no_history",
        action="store_true",
        help="keep no conversation: each lives as long as its page",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="answers generated at the same time, the page's and /v1's together (the others wait in one queue, "
        "served in arrival order; the page shows each its place). Answers that run together are computed in one "
        "batch per step where the model allows it (default: 8 with batching, else 1; with --api_base, 64)",
    )
    p.add_argument(
        "--max_cached_sessions",
        type=int,
        default=MAX_CACHED_SESSIONS,
        help="conversations whose KV cache is kept between turns, so a turn runs only its new tokens "
        "(least recently used dropped first; 0: none)",
    )
    p.add_argument(
        "--max_cache_mb",
        type=float,
        default=None,
        help="memory for those caches, in MiB (default: no limit besides --max_cached_sessions), and for the "
        "batch's paged cache (default: --concurrency contexts, at most a quarter of the free memory)",
    )
    add_tool_flags(p)
    p.add_argument(
        "--embedding_model",
        default=None,
        metavar="PATH",
        help="a local sentence-transformers folder: a long document's passages are also found by meaning, fused with "
        "the word search (default: word search only, BM25)",
    )
    p.add_argument(
        "--reranker",
        default=None,
        metavar="PATH",
        help="a local cross-encoder folder that orders the passages found for a question (default: none)",
    )
    add_voice_flags(p)
    return p


def add_voice_flags(p: argparse.ArgumentParser) -> None:
    """Speech in and out, on the page and /v1/audio."""
    p.add_argument(
        "--stt_model",
        default=None,
        metavar="DIR",
        help="a Whisper folder (transformers): the message box's microphone turns a recording into text, and "
        "/v1/audio/transcriptions answers (default: no speech in)",
    )
    p.add_argument(
        "--tts_model",
        default=None,
        metavar="DIR|espeak-ng|off",
        help="what reads answers aloud (the page's Speak answers switch and read-aloud button, /v1/audio/speech): "
        "a transformers text-to-speech folder (VITS, such as facebook/mms-tts-eng), a Kokoro folder "
        "(hexgrad/Kokoro-82M, the kokoro extra), espeak-ng, or off (default: "
        "espeak-ng, where the voice extra is installed)",
    )


def add_tool_flags(p: argparse.ArgumentParser) -> None:
    """The page's tools: MCP servers whose tools the model calls, each call approved by the user; the web search."""
    p.add_argument(
        "--mcp_config",
        default=None,
        metavar="FILE",
        help="MCP servers whose tools the model may call on the page, in the mcp.json of Claude Desktop, Cursor "
        'and LM Studio ({"mcpServers": {"NAME": {"command": ..., "args": [...]}}}, or {"url": ...} over HTTP); '
        "each call runs once the user allows it",
    )
    p.add_argument(
        "--tool_timeout",
        type=float,
        default=TOOL_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long a tool call may take before it is cancelled (default: {TOOL_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--max_tool_rounds",
        type=int,
        default=MAX_TOOL_ROUNDS,
        help=f"rounds of tool calls the page runs for one question (default: {MAX_TOOL_ROUNDS})",
    )
    p.add_argument(
        "--web_search",
        default=WEB_SEARCH,
        metavar="PROVIDER",
        help="where the page's Search the web switch and the model's web_search and fetch_page tools search: ddgs "
        "(DuckDuckGo, no key), searxng=URL (your SearXNG), brave (key in BRAVE_API_KEY), tavily (key in "
        f"TAVILY_API_KEY), or off (no switch, no web tools) (default: {WEB_SEARCH})",
    )
    p.add_argument(
        "--web_allow_private",
        action="store_true",
        help="let the web search and the model's fetch_page reach this machine and private networks' addresses "
        "(an intranet); refused by default",
    )


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """Which checkpoint and how to load it: LLaMA2-Accessory's flags, shared by every launcher."""
    p.add_argument(
        "--pretrained_path",
        nargs="+",
        default=None,
        help="checkpoint folder(s): a Hugging Face folder, or Accessory / Meta consolidated shards "
        "(default: the built-in demo model)",
    )
    p.add_argument(
        "--llama_type",
        default=None,
        help="an Accessory checkpoint's model type; llama is the one read (default: its meta.json's)",
    )
    p.add_argument("--llama_config", nargs="+", default=None, help="Accessory params/config json file(s)")
    p.add_argument("--tokenizer_path", default=None, help="tokenizer.model or a folder with tokenizer files")
    p.add_argument(
        "--max_seq_len",
        type=int,
        default=None,
        help=f"context length in tokens, prompt + answer (default: {DEFAULT_CONTEXT}; with --api_base, the engine's "
        "own where its /v1/models says it)",
    )
    p.add_argument(
        "--dtype",
        choices=["fp16", "bf16", "fp32"],
        default=None,
        help="weights dtype (default: bf16 on CUDA, fp32 on the CPU)",
    )
    p.add_argument(
        "--quant",
        nargs="?",
        const=4,
        type=int,
        choices=[4, 8],
        default=None,
        help="load the weights in 4 or 8 bits with bitsandbytes (--quant alone: 4)",
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    p.add_argument(
        "--compile",
        action="store_true",
        help="decode with torch.compile over a static KV cache (faster on a GPU; compiled at launch, "
        "about 4 minutes for a 7B model on an H100 the first time)",
    )
    p.add_argument(
        "--no_cuda_graphs",
        action="store_true",
        help="on a GPU, run each decode step eagerly instead of replaying it from a CUDA graph (the graphs are "
        "recorded in the first answer of each length, in well under a second; they keep a static KV cache "
        "per length in use)",
    )
    p.add_argument(
        "--n_gpus",
        type=int,
        default=1,
        help="GPUs to spread the model over, one worker process each (with --device cpu: processes)",
    )
    p.add_argument("--gpu_ids", type=int, nargs="+", default=None, help="which GPUs to use (sets --n_gpus)")
    p.add_argument(
        "--parallel",
        choices=["tensor", "pipeline"],
        default="tensor",
        help="tensor: each layer split over the GPUs, one process each (default); pipeline: the layers "
        "spread over the GPUs in one process (accelerate), for models tensor parallel cannot split",
    )
    p.add_argument("--master_addr", default="127.0.0.1", help="address for the worker processes to meet")
    p.add_argument(
        "--master_port", type=int, default=None, help="port for the worker processes to meet (default: a free one)"
    )
    p.add_argument(
        "--api_base",
        default=None,
        metavar="URL",
        help="load no model: use the one an OpenAI-compatible engine serves at URL, its /v1 address (vLLM, SGLang, "
        "TGI, transformers serve, another local-chat), for example http://127.0.0.1:8000/v1",
    )
    p.add_argument(
        "--api_base_key",
        default=None,
        metavar="KEY|FILE",
        help="the key --api_base's engine asks for (sent as Authorization: Bearer KEY), or a file holding it",
    )
    p.add_argument(
        "--model",
        default=None,
        help="with --api_base: which of the engine's models (default: its first); with --models_dir: the id of the "
        "checkpoint to start with (default: the first that can load)",
    )
    p.add_argument(
        "--models_dir",
        nargs="*",
        action=ModelFolders,
        default=None,
        metavar="DIR",
        help="folders of checkpoints (Hugging Face folders, Accessory / Meta consolidated ones, GGUF files, the "
        "Hugging Face cache, Ollama's and LM Studio's model folders): each is listed at start-up with its id and "
        "loads when asked for (/v1's `model`); --model picks the one the app starts with; with no folder, those "
        "of Ollama, LM Studio and the Hugging Face cache that this machine has",
    )
    p.add_argument(
        "--models_config",
        default=None,
        metavar="FILE",
        help="with --models_dir: a YAML file of per-model settings, its top-level keys model ids, each with flags "
        "without their dashes (dtype, quant, template, llama_type, ...), `system` and sampling defaults "
        "(temperature, top_p, top_k, repetition_penalty, max_new_tokens); the command line's flags are the defaults",
    )
    p.add_argument(
        "--admins",
        nargs="+",
        default=None,
        metavar="LOGIN",
        help="with --auth and --models_dir: only these logins load models on the page; the others choose among "
        "the loaded ones, and /v1 answers only with loaded models",
    )
    p.add_argument(
        "--max_loaded_models",
        type=int,
        default=1,
        metavar="N",
        help="with --models_dir: how many models stay loaded at once; loading another unloads the least recently "
        "used, once its answers have ended (default: 1)",
    )
    p.add_argument(
        "--idle_unload",
        type=float,
        default=None,
        metavar="MINUTES",
        help="with --models_dir: unload a model no one has asked anything for that many minutes (default: never)",
    )
    p.add_argument(
        "--vision",
        action="store_true",
        help="with --api_base: the engine's model sees images (the engine's model list does not say so)",
    )
    p.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="run the Python code a Hugging Face checkpoint ships (auto_map in its config.json); only "
        "for checkpoints whose authors you trust",
    )
    p.add_argument("--lora", nargs="+", metavar="NAME=DIR", help='PEFT LoRA adapters, each the model "BASE + NAME"')
    p.add_argument("--merge_lora", action="store_true", help="fold the one --lora adapter into the weights")
    p.add_argument(
        "--speculative",
        choices=["ngram", "off"],
        default="ngram",
        help="ngram (default): answers guess tokens from the prompt, checked several per forward pass",
    )
    p.add_argument(
        "--draft_model", default=None, metavar="DIR", help="a small model of the same tokenizer: its guesses"
    )


def logins(auth: str) -> list[tuple[str, str]]:
    """--auth: USER:PASSWORD, or a file of USER:PASSWORD lines (blank lines and # comments skipped)."""
    path = Path(auth)
    if path.is_file():
        lines = [line.strip() for line in path.read_text().splitlines()]
        pairs = [tuple(line.split(":", 1)) for line in lines if line and not line.startswith("#")]
        if not pairs or any(len(pair) != 2 or not all(pair) for pair in pairs):
            raise UserError(f"--auth file {path} must hold USER:PASSWORD lines, one per login.")
        return pairs
    user, colon, password = auth.partition(":")
    if not (user and colon and password):
        raise UserError(
            "--auth takes USER:PASSWORD (for example --auth alice:secret) or a file of such lines; "
            f"{auth!r} is neither."
        )
    return [(user, password)]


def api_keys(value: str) -> list[str]:
    """--api_key: KEY, or a file of keys, one a line (blank lines and # comments skipped)."""
    path = Path(value)
    if path.is_file():
        keys = [line.strip() for line in path.read_text().splitlines()]
        keys = [key for key in keys if key and not key.startswith("#")]
        if not keys:
            raise UserError(f"--api_key file {path} holds no key; write one key a line.")
        return keys
    if not value.strip() or any(c.isspace() for c in value.strip()):
        raise UserError(f"--api_key takes a key without spaces, or a file of keys; {value!r} is neither.")
    return [value.strip()]


def api_off_reason(args: LaunchSettings) -> str | None:
    """Why the /v1 API is off, or None: --auth's password covers the page only, so /v1 needs its own --api_key."""
    if args.auth and not args.api_key:
        return (
            "The OpenAI-compatible API (/v1) is off: --auth protects the page only; add --api_key KEY to serve "
            "/v1 too, with that key."
        )
    return None


DEFAULT_PORT = 7860  # Gradio's


def first_free_port(host: str, start: int = DEFAULT_PORT, tries: int = 100) -> int:
    """The first port from `start` that `host` can serve on, as Gradio looks for one; said when it is not `start`."""
    for port in range(start, start + tries):
        try:
            check_port_free(host, port)
        except UserError:
            continue
        if port != start:
            print(f"Port {start} is taken: serving on {port} instead (--port picks one).", file=sys.stderr)
        return port
    raise UserError(f"Ports {start} to {start + tries - 1} on {host} are all taken; pass a free one with --port.")


def check_port_free(host: str, port: int) -> None:
    if not 0 < port < 65536:
        raise UserError(f"--port {port} is not a port number; pick one from 1 to 65535.")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        # as the web server binds: connections of a server that just ended (TIME_WAIT) do not hold the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as error:
            raise UserError(
                f"Port {port} on {host} cannot be used ({error.strerror}); another program may hold "
                "it: pass a different --port, or stop that program."
            )


def exposure_warnings(args: LaunchSettings) -> list[str]:
    """What to tell the person starting a server that others can reach."""
    no_password = "" if args.auth else " Add --auth USER:PASSWORD to ask for a password (and --api_key KEY for /v1)."
    warnings = []
    if args.host not in LOCAL_HOSTS:
        warnings.append(
            f"Listening on {args.host}: anyone who can reach this machine on port "
            f"{args.port or 'the one below'} can use the model.{no_password}"
        )
    if args.share:
        warnings.append(f"--share opens a public link: anyone who has it can use the model.{no_password}")
    return warnings


def fail(error: Exception) -> None:
    """End a launcher on a user error: the sentence, no traceback."""
    print(f"error: {error}", file=sys.stderr)
    raise SystemExit(1)
