"""Tools the page runs for the model: MCP servers (`--mcp_config`), opened at start-up and kept (tools/servers.py),
and with the built-in ones, one toolbox (tools/toolbox.py)."""

from .servers import ServerSpec, Tool, ToolOutcome, ToolServers, read_config
from .toolbox import Toolbox, arguments_of

__all__ = ["ServerSpec", "Tool", "ToolOutcome", "Toolbox", "ToolServers", "arguments_of", "read_config"]
