"""An MCP server written with the official SDK (`mcp.server.mcpserver.MCPServer`), for the tools tests: over stdio
(`python tests/mcp_server.py`) or Streamable HTTP (`python tests/mcp_server.py http PORT`). Its tools: the weather
(a fixed sentence), a slow one (waits), one that ends the server's process mid-call, and one returning an image."""

import asyncio
import base64
import io
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp_types import ImageContent

server = MCPServer("weather")


@server.tool()
def get_weather(city: str) -> str:
    """The weather in a city now."""
    return f"Sunny and 21 °C in {city}."


@server.tool()
async def wait(seconds: float) -> str:
    """Wait `seconds`, then say so."""
    await asyncio.sleep(seconds)
    return f"Waited {seconds} s."


@server.tool()
def crash() -> str:
    """End this server's process in the middle of the call."""
    os._exit(3)


@server.tool()
def red_square() -> ImageContent:
    """A small red square, as a PNG image."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(buffer, format="PNG")
    return ImageContent(type="image", data=base64.b64encode(buffer.getvalue()).decode(), mime_type="image/png")


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
