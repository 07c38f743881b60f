"""Every tool the page offers, from where each runs: --mcp_config's servers (tools/servers.py) and the built-in
ones (web/tools.py), as one set with the servers' face (`tools`, `tool`, `call`, `problems`, `close`), so that the
tool rounds, their cards and approvals treat them alike (ui/tool_rounds.py); and a call's arguments as the tool
takes them (`arguments_of`, for the page's rounds and /v1's server-run web tools)."""

from __future__ import annotations

import json

from local_chat.errors import UserError

from .servers import Tool, ToolOutcome


class Toolbox:
    """The tools of several holders (each with the servers' face), in their order; a name two holders share is the
    first's."""

    def __init__(self, holders: list):
        self.holders = [holder for holder in holders if holder is not None]

    @classmethod
    def of(cls, *holders):
        """The toolbox of those holders that are there; None where none is."""
        box = cls(list(holders))
        return box if box.holders else None

    def leaving_out(self, server: str):
        """This toolbox without the holders whose tools are all `server`'s; None where none is left."""
        return Toolbox.of(*(h for h in self.holders if not h.tools or any(t.server != server for t in h.tools)))

    @property
    def tools(self) -> list[Tool]:
        seen, tools = set(), []
        for holder in self.holders:
            for tool in holder.tools:
                if tool.called not in seen:
                    seen.add(tool.called)
                    tools.append(tool)
        return tools

    @property
    def problems(self) -> dict[str, str]:
        return {name: sentence for holder in self.holders for name, sentence in holder.problems.items()}

    def tool(self, called: str) -> Tool | None:
        return next((t for t in self.tools if t.called == called), None)

    async def call(self, tool: Tool, arguments: dict) -> ToolOutcome:
        holder = next(h for h in self.holders if any(t.key == tool.key for t in h.tools))
        return await holder.call(tool, arguments)

    def close(self) -> None:
        for holder in self.holders:
            holder.close()


def arguments_of(call: dict) -> dict:
    """A call's arguments as an object; `UserError` where the model wrote none."""
    arguments = call["function"].get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError as error:
        raise UserError(f"The model's arguments are not JSON ({error}), so the call was not run.")
    if not isinstance(parsed, dict):
        raise UserError("The model's arguments are not a JSON object, so the call was not run.")
    return parsed
