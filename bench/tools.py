"""What a tool round costs the page (--mcp_config): a random Qwen3 the demo model's size with Qwen3's published
template, made to call a tool of an MCP server (tests/mcp_server.py over stdio, always allowed, so no click waits) and
then answer (bench/families.py's `ForcedAnswer`), through the chat tab's handlers with saved conversations. Figure:
the milliseconds from the model's last token of the call (its answer's end) to the first token of the answer after
the result, minus the tool's own time (the MCP call, as the client sees it): the cards, the saves, the request built
again with the result, rendered and prefilled. Median of the rounds after a first one.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from local_chat.engine import Delta, End

from .families import ForcedAnswer, save_tiny_qwen3
from .reasoning import SHAPES, _full

SERVER = Path(__file__).resolve().parent.parent / "tests" / "mcp_server.py"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
BROWSER = "b" * 40


class Timed:
    """An engine whose answers' ends and first texts are timed (the rest is the engine's)."""

    def __init__(self, engine):
        self.engine, self.ends, self.firsts = engine, [], []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, request):
        first = True
        for event in self.engine.stream(request):
            if isinstance(event, Delta) and first:
                self.firsts.append(time.perf_counter())
                first = False
            if isinstance(event, End):
                self.ends.append(time.perf_counter())
            yield event


def run(settings) -> dict[str, float]:
    from local_chat.history import Store
    from local_chat.model.meta import MetaModel
    from local_chat.tools import ServerSpec, ToolServers
    from local_chat.ui.chat import Cancels
    from local_chat.ui.chat_settings import ChatSettings
    from local_chat.ui.chat_tab import ChatTab
    from local_chat.ui.history import SavedChats

    rounds = max(3, settings.api_repeats * 2)
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        config = {**SHAPES[settings.api_shape], "num_key_value_heads": 2,
                  "head_dim": 64 if settings.api_shape == "small" else 16}  # fmt: skip
        config = _full(config) | {"max_position_embeddings": 4096}
        model = MetaModel.from_pretrained(str(save_tiny_qwen3(Path(tmp) / "qwen3", config=config)))
        forced = ForcedAnswer(model.llma, model.tokenizer.hf, "x", "<|im_end|>")
        servers = ToolServers([ServerSpec("weather", command=sys.executable, args=(str(SERVER),))])
        tool_seconds = []
        called = servers.call

        async def timed_call(tool, arguments):
            outcome = await called(tool, arguments)
            tool_seconds.append(outcome.seconds)
            return outcome

        servers.call = timed_call
        store = Store(Path(tmp) / "conversations.db")
        timed = Timed(model.engine)
        tab = ChatTab(timed, Cancels(), "chat_template", "padded_resize", SavedChats(store), tool_servers=servers)
        tab.tools.approvals.set("browser:" + BROWSER, ["weather/get_weather"])
        request = SimpleNamespace(session_hash="bench", username=None)
        page_ms = []
        for round_ in range(rounds + 1):  # the first round warms up
            forced.in_turn([CALL, "It is sunny in Paris."], model.tokenizer.hf, "<|im_end|>")
            timed.ends.clear(), timed.firsts.clear()
            settings_ = ChatSettings(None, BROWSER, "chat_template", None, "padded_resize", 64, 0.0, 0.75, 0, 1.0)
            asyncio.run(_send(tab, request, settings_))
            gap = timed.firsts[-1] - timed.ends[0] - tool_seconds[-1]
            if round_:
                page_ms.append(gap * 1000)
        forced.remove()
        servers.close()
        store.close()
    print(f"tools: page's cost per round {statistics.median(page_ms):.1f} ms; the tool's own "
          f"{statistics.median(tool_seconds) * 1000:.1f} ms", file=sys.stderr)  # fmt: skip
    return {"tools_round_page_ms": statistics.median(page_ms)}


async def _send(tab, request, settings) -> None:
    async for _ in tab.submit(request, {"text": "What is the weather in Paris?", "files": []}, [], settings):
        pass
