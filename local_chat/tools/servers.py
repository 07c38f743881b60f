"""MCP servers whose tools the model calls on the page: `--mcp_config FILE` (the `mcp.json` of Claude Desktop, Cursor
and LM Studio: {"mcpServers": {NAME: {"command", "args", "env"} or {"url", "headers"}}}), read by `read_config`.

`ToolServers` opens one session per server with the official `mcp` SDK (2.x: `mcp.Client`) at start-up, on an event
loop of its own thread, and keeps it; a server that fails to start or answer is kept with its sentence and the others
work. `call` runs a tool from any event loop: it is cancelled with its caller (Stop), and ends after `timeout_s`. A
session whose server died is opened again once, at the next call of its tools.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from local_chat.errors import UserError

START_TIMEOUT_S = 30.0  # for every server together, at start-up
REMOTE_TYPES = ("http", "streamable-http", "streamableHttp")


@dataclass(frozen=True)
class ServerSpec:
    """One server of the file: a command to start (stdio) or a URL (Streamable HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Tool:
    """A server's tool, under the name the model calls it by (its own, or "SERVER_NAME" where two servers share it)."""

    server: str
    name: str  # the server's name for it
    called: str  # the model's
    description: str
    parameters: dict

    @property
    def key(self) -> str:
        """Its name in the page's choices and the "always allow" lists: the server's, then the tool's."""
        return f"{self.server}/{self.name}"

    def openai(self) -> dict:
        """As a chat request's `tools` entry (OpenAI's shape, which the chat templates render)."""
        function = {"name": self.called, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass
class ToolOutcome:
    """What a call gave: the text the model reads, the images it returned (PNG, JPEG... bytes), and whether it failed
    (the text is then the sentence saying why)."""

    text: str
    images: list[tuple[str, bytes]] = field(default_factory=list)  # (MIME type, bytes)
    failed: bool = False
    seconds: float = 0.0  # the tool's own time


def read_config(path: str | Path) -> list[ServerSpec]:
    """The servers of an `mcp.json`; one sentence naming the key where the file is malformed (`UserError`)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise UserError(f"--mcp_config {path} cannot be read ({error.strerror}); pass the path of an mcp.json.")
    except ValueError as error:
        raise UserError(f"--mcp_config {path} is not JSON ({error}); write it as Claude Desktop's mcp.json.")
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise UserError(
            f'--mcp_config {path} has no "mcpServers" object; write {{"mcpServers": {{"NAME": {{"command": ..., '
            '"args": [...]}}}} (or {"url": ...} for a server over HTTP).'
        )
    return [_spec(path, name, entry) for name, entry in servers.items() if not _disabled(entry)]


def _disabled(entry) -> bool:
    return isinstance(entry, dict) and entry.get("disabled") is True  # Cursor's and Cline's switch


def _spec(path, name: str, entry) -> ServerSpec:
    where = f"--mcp_config {path}: mcpServers.{name}"
    if not isinstance(entry, dict):
        raise UserError(f'{where} is not an object; write {{"command": ..., "args": [...]}} or {{"url": ...}}.')
    kind = entry.get("type", "http" if "url" in entry and "command" not in entry else "stdio")
    if kind == "sse":
        raise UserError(f'{where}: "type" "sse" is the old HTTP transport; give the server\'s Streamable HTTP URL.')
    if kind in REMOTE_TYPES:
        url = entry.get("url")
        if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            raise UserError(f'{where}.url must be the server\'s http:// or https:// address (its "url" key).')
        return ServerSpec(name, url=url, headers=_strings(entry, "headers", where))
    if kind != "stdio" or not isinstance(entry.get("command"), str) or not entry["command"]:
        raise UserError(f'{where} needs "command" (a program that serves MCP over stdio) or "url" (over HTTP).')
    args = entry.get("args", [])
    if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        raise UserError(f"{where}.args must be a list of strings.")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise UserError(f"{where}.cwd must be a folder's path.")
    env = _strings(entry, "env", where)
    return ServerSpec(name, command=entry["command"], args=tuple(args), env=env, cwd=cwd)


def _strings(entry: dict, key: str, where: str) -> tuple[tuple[str, str], ...]:
    value = entry.get(key, {})
    if not (isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
        raise UserError(f'{where}.{key} must be an object of strings ({{"NAME": "value"}}).')
    return tuple(value.items())


class _Session:
    """One server's session, held open by a task of the servers' loop until `closing` is set."""

    def __init__(self, spec: ServerSpec):
        self.spec = spec
        self.client = None
        self.tools: list = []  # the SDK's listed tools
        self.problem: str | None = None
        self.closing: asyncio.Event | None = None
        self.holder: asyncio.Task | None = None
        self.reopened = False

    def target(self):
        from mcp import StdioServerParameters

        spec = self.spec
        if spec.url is None:
            return StdioServerParameters(command=spec.command, args=list(spec.args), env=dict(spec.env) or None,
                                         cwd=spec.cwd)  # fmt: skip
        if not spec.headers:
            return spec.url
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        return streamable_http_client(spec.url, http_client=create_mcp_http_client(headers=dict(spec.headers)))

    async def open(self) -> None:
        """Start holding the session; returns once it is open (its tools listed) or has failed (`problem`)."""
        ready = asyncio.Event()
        self.closing, self.client, self.problem = asyncio.Event(), None, None
        self.holder = asyncio.create_task(self._hold(ready))
        await ready.wait()

    async def _hold(self, ready: asyncio.Event) -> None:
        from mcp import Client

        try:
            async with Client(self.target()) as client:
                self.tools = (await client.list_tools()).tools
                self.client = client
                ready.set()
                await self.closing.wait()
        except BaseException as error:  # noqa: BLE001 (a server's failure is its sentence; the others go on)
            self.problem = self.problem or failure_sentence(self.spec, error)
            if isinstance(error, asyncio.CancelledError):
                raise
        finally:
            self.client = None
            ready.set()

    async def close(self) -> None:
        if self.holder is not None and not self.holder.done():
            self.closing.set()
            try:
                await asyncio.wait_for(self.holder, 5)
            except (Exception, asyncio.CancelledError):  # noqa: BLE001 (closing: nothing left to tell)
                pass


def failure_sentence(spec: ServerSpec, error: BaseException) -> str:
    """Why a server cannot be used, in one sentence."""
    while getattr(error, "exceptions", None):  # an exception group (anyio's task groups): its first
        error = error.exceptions[0]
    what = f"the command {spec.command!r} cannot start" if isinstance(error, OSError) and spec.url is None else None
    detail = str(error) or type(error).__name__
    where = spec.url or " ".join([spec.command or "", *spec.args]).strip()
    if what:
        return f"The tool server {spec.name!r} could not start: {what} ({detail}); fix its entry in --mcp_config."
    return f"The tool server {spec.name!r} ({where}) does not answer ({detail}); check that it runs."


class ToolServers:
    """The servers of an `mcp.json`, their sessions kept open (see the module)."""

    def __init__(self, specs: list[ServerSpec], timeout_s: float = 60.0, start_timeout_s: float = START_TIMEOUT_S):
        self.timeout_s = timeout_s
        self.sessions = {spec.name: _Session(spec) for spec in specs}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mcp-servers", daemon=True)
        self.thread.start()
        opening = asyncio.run_coroutine_threadsafe(self._open_all(), self.loop)
        try:
            opening.result(start_timeout_s)
        except TimeoutError:
            for session in self.sessions.values():
                if session.client is None and session.problem is None:
                    session.problem = (
                        f"The tool server {session.spec.name!r} did not start within {start_timeout_s:.0f} s."
                    )

    async def _open_all(self) -> None:
        await asyncio.gather(*(session.open() for session in self.sessions.values()))

    @property
    def problems(self) -> dict[str, str]:
        """Each server that cannot be used, with its sentence."""
        return {name: s.problem for name, s in self.sessions.items() if s.problem and s.client is None}

    @property
    def tools(self) -> list[Tool]:
        """Every tool of the servers that opened, in the file's order; a name two servers share is prefixed."""
        listed = [(name, tool) for name, s in self.sessions.items() for tool in s.tools]
        counts: dict[str, int] = {}
        for _, tool in listed:
            counts[tool.name] = counts.get(tool.name, 0) + 1
        return [
            Tool(
                server,
                t.name,
                t.name if counts[t.name] == 1 else f"{server}_{t.name}",
                t.description or "",
                t.input_schema or {"type": "object", "properties": {}},
            )  # fmt: skip
            for server, t in listed
        ]

    def tool(self, called: str) -> Tool | None:
        return next((t for t in self.tools if t.called == called), None)

    async def call(self, tool: Tool, arguments: dict) -> ToolOutcome:
        """Run `tool` with `arguments` from the caller's event loop; cancelling the caller cancels the call."""
        running = asyncio.run_coroutine_threadsafe(self._call(tool, arguments), self.loop)
        return await asyncio.wrap_future(running)

    async def _call(self, tool: Tool, arguments: dict) -> ToolOutcome:
        session = self.sessions[tool.server]
        if session.client is None and session.problem is not None and not session.reopened:
            session.reopened = True  # its server died (or never started): opened again, once
            await session.close()
            await session.open()
        if session.client is None:
            return ToolOutcome(session.problem or f"The tool server {tool.server!r} is not running.", failed=True)
        started = self.loop.time()
        try:
            result = await asyncio.wait_for(session.client.call_tool(tool.name, arguments), self.timeout_s)
        except TimeoutError:
            return ToolOutcome(
                f"The tool {tool.called} did not answer within {self.timeout_s:g} s (--tool_timeout); it was "
                "cancelled.",
                failed=True,
            )
        except Exception as error:  # noqa: BLE001 (the server broke: its sentence, and its session opened again)
            session.problem = failure_sentence(session.spec, error)
            await session.close()
            detail = str(error) or type(error).__name__
            return ToolOutcome(
                f"The tool server {tool.server!r} failed during the call ({detail}); it is started again at the next "
                "call of its tools.",
                failed=True,
            )
        outcome = outcome_of(result)
        outcome.seconds = self.loop.time() - started
        return outcome

    def close(self) -> None:
        async def close_all():
            await asyncio.gather(*(s.close() for s in self.sessions.values()))

        if self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(10)
            except Exception:  # noqa: BLE001 (closing: the servers' processes end with ours)
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)


def outcome_of(result) -> ToolOutcome:
    """An MCP `CallToolResult` as the text the model reads and the images the page shows."""
    import mcp_types as types

    texts, images = [], []
    for part in result.content or []:
        if isinstance(part, types.TextContent):
            texts.append(part.text)
        elif isinstance(part, types.ImageContent):
            images.append((part.mime_type, base64.b64decode(part.data)))
            texts.append(f"[image {len(images)}: {part.mime_type}]")
        elif isinstance(part, types.EmbeddedResource) and isinstance(part.resource, types.TextResourceContents):
            texts.append(f"Resource {part.resource.uri}:\n{part.resource.text}")
        elif isinstance(part, types.EmbeddedResource):
            size = len(base64.b64decode(part.resource.blob))
            texts.append(f"[resource {part.resource.uri}: {part.resource.mime_type or 'binary'}, {size} bytes]")
        elif isinstance(part, types.ResourceLink):
            texts.append(f"[resource {part.uri}" + (f": {part.description}]" if part.description else "]"))
        else:
            texts.append(f"[{getattr(part, 'type', 'content')} the page does not show]")
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return ToolOutcome("\n\n".join(texts), images, failed=bool(result.is_error))
