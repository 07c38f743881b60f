"""Tools the page runs for the model: MCP servers (`--mcp_config`), opened at start-up and kept (tools/servers.py)."""

from .servers import ServerSpec, Tool, ToolOutcome, ToolServers, read_config

__all__ = ["ServerSpec", "Tool", "ToolOutcome", "ToolServers", "read_config"]
