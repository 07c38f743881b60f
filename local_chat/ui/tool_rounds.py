"""Tools on the page (`--mcp_config`): the chat tab's tool rounds, its Tools control and each login's "always allow".

The tools switched on in the Tools control go to the model with the question (as /v1's `tools`). A call the model
makes is a card (ui/turns.py's "tool_call" with its `approval`): its name, server and arguments, and under the last
card Allow once / Always allow / Deny (Gradio shows a message's options under the chat's last message only, so the
calls of one answer are decided together). Nothing runs before the user says so, unless the user always allows that
tool. The handler ends while cards wait; the choice (`decide`) runs the allowed calls on their servers
(tools/servers.py), folds each card with its result, and the answer goes on in the same turn (`ChatTab.respond`),
for at most `max_tool_rounds` rounds of calls per question. Stop cancels the running call (the MCP call with it).
"""

from __future__ import annotations

import asyncio
import json

import gradio as gr

from local_chat.errors import UserError
from local_chat.history.kinds import Approval, Kind
from local_chat.prompting.images import png_bytes
from local_chat.tools import ToolOutcome, ToolServers

from . import turns
from .chat_settings import ChatSettings
from .turns import kind_of, unanswered_calls, with_calls_closed

DECLINED = "The user declined this call."
NOT_ANSWERED = "The user sent a new message instead of answering this call, so it was not run."
OVER_ROUNDS = "Not run: this answer reached its limit of {} rounds of tool calls."
ROUNDS_TITLE = "Tool rounds"
ONE_CALL = [("Allow once", "allow"), ("Always allow this tool", "always"), ("Deny", "deny")]
CALLS = [("Allow all once", "allow"), ("Always allow these tools", "always"), ("Deny all", "deny")]


class Approvals:
    """Each login's tools that run without asking: in the saved conversations' database where there is one (kept
    across restarts), else in memory."""

    def __init__(self, store):
        self.store, self.memory = store, {}

    def of(self, owner: str) -> list[str]:
        return self.store.always_allowed(owner) if self.store is not None else sorted(self.memory.get(owner, ()))

    def set(self, owner: str, tools: list[str], allowed: bool = True) -> None:
        if self.store is not None:
            self.store.allow_always(owner, tools, allowed)
            return
        kept = self.memory.setdefault(owner, set())
        kept.update(tools) if allowed else kept.difference_update(tools)


def rounds_since_question(entries: list[dict]) -> int:
    """How many answers of the last question called tools (each run of cards is one round)."""
    rounds = 0
    for before, entry in zip([{}] + entries, entries):
        if kind_of(entry) == Kind.QUESTION:
            rounds = 0
        elif kind_of(entry) == Kind.TOOL_CALL and kind_of(before) != Kind.TOOL_CALL:
            rounds += 1
    return rounds


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


class ToolRounds:
    """The chat tab's tool rounds (a mixin of `ChatTab`, ui/chat_tab.py: it uses its `saved`, `respond` and the
    components its `build` made)."""

    tool_servers: ToolServers | None
    max_tool_rounds: int

    def tool_owner(self, browser_id, request: gr.Request) -> str:
        """Whose "always allow" list applies: the login's, else the browser's (else, unsaved, the tab's)."""
        if self.saved.on:
            return self.saved.owner(browser_id, request)
        return "user:" + request.username if getattr(request, "username", None) else "tab:" + request.session_hash

    def tools_for(self, engine, settings: ChatSettings) -> list[dict] | None:
        """The tools switched on for this conversation, as a request's `tools`; None where there are none, or the
        model cannot take them in the chosen template."""
        if self.tool_servers is None or engine.why_no_tools(settings.template) is not None:
            return None
        chosen = settings.tools if settings.tools is not None else [t.key for t in self.tool_servers.tools]
        return [tool.openai() for tool in self.tool_servers.tools if tool.key in chosen] or None

    def call_cards(self, calls) -> list[dict]:
        """The cards of an answer's calls (`ToolCallDelta`s, whole), each waiting for the user."""
        cards = []
        for call in calls:
            tool = self.tool_servers.tool(call.name) if self.tool_servers is not None else None
            cards.append(turns.tool_call(call.openai(), tool.server if tool else None, Approval.ASK))
        return cards

    def ask_or_allow(self, history: list[dict], owner: str) -> bool:
        """The waiting cards of the always-allowed tools allowed; the others given their buttons. Whether any
        still waits for the user."""
        always = set(self.approvals.of(owner))
        waiting = []
        for at in unanswered_calls(history):
            card = history[at]
            if card["approval"] == Approval.ASK and self._key(card) in always:
                history[at] = turns.tool_call(card["call"], card.get("server"), Approval.ALWAYS)
            elif history[at]["approval"] == Approval.ASK:
                waiting.append(at)
        if waiting:
            history[waiting[-1]] = {**history[waiting[-1]], "options": [
                {"label": label, "value": value} for label, value in (ONE_CALL if len(waiting) == 1 else CALLS)
            ]}  # fmt: skip
        return bool(waiting)

    def _key(self, card: dict) -> str:
        tool = self.tool_servers.tool(card["call"]["function"]["name"]) if self.tool_servers else None
        return tool.key if tool else f"{card.get('server')}/{card['call']['function']['name']}"

    def over_rounds(self, history: list[dict]) -> list[dict] | None:
        """Past `max_tool_rounds` for this question: the calls closed unrun and a note saying why; else None."""
        if rounds_since_question(history) <= self.max_tool_rounds:
            return None
        text = (
            f"The model called tools in more than {self.max_tool_rounds} rounds for this question "
            "(--max_tool_rounds), so the answer ends here; ask again to go on."
        )
        closed = with_calls_closed(history, OVER_ROUNDS.format(self.max_tool_rounds))
        return closed + [turns.notice(ROUNDS_TITLE, text)]

    async def run_calls(self, history: list[dict], owner, conversation_id):
        """Run the decided calls in order, each card shown running, then folded with its result (a declined one
        gets its sentence); yields as each changes. A cancelled call (Stop) leaves its card running, for
        `turns.marked_stopped` to close."""
        for at in unanswered_calls(history):
            card = history[at]
            call, server = card["call"], card.get("server")
            name = call["function"]["name"]
            if card["approval"] == Approval.DENIED:
                history.append(turns.tool_result(DECLINED, call.get("id"), name))
                continue
            history[at] = turns.tool_call(call, server, Approval.RUNNING)
            yield
            outcome = await self._outcome(call)
            images = [self.saved.image_address(owner, conversation_id, self._png(image)) for image in outcome.images]
            history[at] = turns.tool_call(call, server, Approval.DONE)
            history.append(turns.tool_result(outcome.text, call.get("id"), name, [a for a in images if a],
                                             outcome.failed))  # fmt: skip
            yield

    async def _outcome(self, call: dict) -> ToolOutcome:
        tool = self.tool_servers.tool(call["function"]["name"]) if self.tool_servers else None
        if tool is None:
            return ToolOutcome(f"No tool {call['function']['name']!r} runs on this page now.", failed=True)
        try:
            arguments = arguments_of(call)
        except UserError as error:
            return ToolOutcome(str(error), failed=True)
        return await self.tool_servers.call(tool, arguments)

    @staticmethod
    def _png(image: tuple[str, bytes]) -> bytes:
        import io

        from PIL import Image

        return png_bytes(Image.open(io.BytesIO(image[1])))

    async def _rounds(self, engine, answer, history, settings: ChatSettings, request, cut, cancel):
        """The answer, then each round of its tool calls (ui/tool_rounds.py) and the answer after them, until it
        ends without calls, its calls wait for the user, or it passes --max_tool_rounds."""
        owner = self.tool_owner(settings.browser_id, request) if self.tool_servers is not None else None
        while True:
            if unanswered_calls(history):
                if (closed := self.over_rounds(history)) is not None:
                    history[:] = closed
                    yield history, cut.prompt, cut.conversation_id, gr.skip()
                    return
                if self.ask_or_allow(history, owner):
                    return  # the cards wait for the user's choice (ToolRounds.decide)
                cut.ended = False
                async for _ in self.run_calls(history, cut.owner, cut.conversation_id):
                    yield history, cut.prompt, cut.conversation_id, gr.skip()
                try:
                    answer, cut.documents = await asyncio.to_thread(
                        self._request, engine, history, settings, request, cut.conversation_id, cancel
                    )
                except UserError as error:
                    history.append(turns.error(str(error)))
                    return
            asked = len(history)  # where the answer's entries begin
            history.append(turns.answer(""))
            cut.ended = False
            async for shown in self._answer(engine, answer, history, asked, settings, cut):
                yield shown
            if not unanswered_calls(history) or cut.stopped:
                return

    # ----- the user's choice -----

    async def decide(self, request: gr.Request, selected: gr.SelectData, history, *settings):
        """Allow once, always allow or deny the waiting calls, then run them and go on with the answer."""
        settings = ChatSettings(*settings)
        history = [dict(entry) for entry in history or []]
        waiting = [at for at in unanswered_calls(history) if history[at]["approval"] == Approval.ASK]
        if not waiting:
            yield history, gr.skip(), gr.skip(), gr.skip()
            return
        choice = selected.value
        if choice == "always":
            self.approvals.set(
                self.tool_owner(settings.browser_id, request), [self._key(history[at]) for at in waiting]
            )
        approval = {"allow": Approval.ALLOWED, "always": Approval.ALWAYS}.get(choice, Approval.DENIED)
        for at in waiting:
            history[at] = turns.tool_call(history[at]["call"], history[at].get("server"), approval)
        async for update in self.respond(history, settings, request, question_first=False):
            yield update

    # ----- the Tools control -----

    def build_tools(self, engine):
        """Under the message box: the servers and their tools, each switched on or off for this conversation, and
        this login's always-allowed tools (untick to be asked again). A gr.State(None) where there are no tools."""
        servers = self.tool_servers
        if servers is None:
            self.always_box = None
            return gr.State(None)
        tools = servers.tools
        with gr.Accordion(f"Tools ({len(tools)})", open=False, elem_classes="tools"):
            gr.Markdown(tools_note(servers, engine.why_no_tools()), elem_classes="tools-note")
            chosen = gr.CheckboxGroup(
                [(f"{t.called} · {t.server}" + (f": {t.description}" if t.description else ""), t.key) for t in tools],
                value=[t.key for t in tools],
                label="Tools the model may call in this conversation",
                elem_classes="tool-choices",
            )
            self.always_box = gr.CheckboxGroup(
                [], value=[], label="Run without asking (untick one to be asked again)", elem_classes="always-allowed"
            )
        return chosen

    def tools_of(self, conversation_id, browser_id, request: gr.Request):
        """The Tools control as the open conversation left it: every tool on but those it switched off."""
        if self.tool_servers is None:
            return gr.skip()
        off = []
        if conversation_id and self.saving:
            try:
                off = self.saved.store.get(self._owner(browser_id, request), conversation_id).options.get("tools_off")
            except UserError:
                off = []
        return [t.key for t in self.tool_servers.tools if t.key not in (off or [])]

    def tools_off(self, chosen) -> list[str] | None:
        """What a conversation saves of the Tools control: the tools switched off (None: no control)."""
        if self.tool_servers is None or chosen is None:
            return None
        return [t.key for t in self.tool_servers.tools if t.key not in chosen]

    def always_of(self, browser_id, request: gr.Request):
        try:
            allowed = self.approvals.of(self.tool_owner(browser_id, request))
        except UserError:
            return gr.skip()
        return gr.update(choices=allowed, value=allowed)

    def revoke(self, kept, browser_id, request: gr.Request):
        owner = self.tool_owner(browser_id, request)
        self.approvals.set(owner, [t for t in self.approvals.of(owner) if t not in (kept or [])], allowed=False)
        return self.always_of(browser_id, request)


def tools_note(servers: ToolServers, why_not: str | None) -> str:
    """The Tools control's note: why the model gets no tools, and each server that cannot be used."""
    lines = [f"**{why_not}**"] if why_not else []
    lines += [f"- {sentence}" for sentence in servers.problems.values()]
    if not servers.tools and not servers.problems:
        lines.append("The servers of --mcp_config list no tools.")
    return "\n".join(lines) or "A call the model makes is shown with its arguments; nothing runs before you allow it."
