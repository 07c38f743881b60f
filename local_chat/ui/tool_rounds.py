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

import gradio as gr

from local_chat.errors import UserError
from local_chat.history.kinds import Approval, Kind
from local_chat.prompting.images import png_bytes
from local_chat.tools import ToolOutcome, ToolServers, arguments_of
from local_chat.web.tools import SERVER as WEB_SERVER

from . import turns
from .chat_settings import ChatSettings
from .history import SavedChats
from .turns import kind_of, unanswered_calls, with_calls_closed
from .wiring import UI_ONLY

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


class ToolRounds:
    """The chat tab's tools (`servers`, None where the page has none): what a request offers the model, the cards of
    its calls and their approvals, the calls run, at most `max_rounds` rounds a question; and the Tools control.
    `saving`: the tab keeps saved conversations (which keep the tools switched off)."""

    def __init__(self, servers: ToolServers | None, max_rounds: int, saved: SavedChats, saving: bool):
        self.servers, self.max_rounds, self.saved, self.saving = servers, max_rounds, saved, saving
        self.approvals = Approvals(saved.store if saved.on else None)

    def owner(self, browser_id, request: gr.Request) -> str:
        """Whose "always allow" list applies: the login's, else the browser's (else, unsaved, the tab's)."""
        if self.saved.on:
            return self.saved.owner(browser_id, request)
        return "user:" + request.username if getattr(request, "username", None) else "tab:" + request.session_hash

    def tools_for(self, engine, settings: ChatSettings) -> list[dict] | None:
        """The tools switched on for this conversation, as a request's `tools`; None where there are none, or the
        model cannot take them in the chosen template."""
        if self.servers is None or engine.why_no_tools(settings.template) is not None:
            return None
        chosen = settings.tools if settings.tools is not None else self.switched_on()
        return [tool.openai() for tool in self.servers.tools if tool.key in chosen] or None

    def switched_on(self) -> list[str]:
        """The tools a new conversation starts with: every server's; the web's built-in ones (web/tools.py) only
        once ticked, so that a model is not handed the web unasked."""
        return [t.key for t in self.servers.tools if t.server != WEB_SERVER]

    def call_cards(self, calls) -> list[dict]:
        """The cards of an answer's calls (`ToolCallDelta`s, whole), each waiting for the user."""
        cards = []
        for call in calls:
            tool = self.servers.tool(call.name) if self.servers is not None else None
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

    def approve(self, history: list[dict], choice: str, browser_id, request: gr.Request) -> bool:
        """The user's choice on the waiting cards ("allow", "always", else denied) written on them, "always" kept
        for this login; whether any card was waiting."""
        waiting = [at for at in unanswered_calls(history) if history[at]["approval"] == Approval.ASK]
        if not waiting:
            return False
        if choice == "always":
            self.approvals.set(self.owner(browser_id, request), [self._key(history[at]) for at in waiting])
        approval = {"allow": Approval.ALLOWED, "always": Approval.ALWAYS}.get(choice, Approval.DENIED)
        for at in waiting:
            history[at] = turns.tool_call(history[at]["call"], history[at].get("server"), approval)
        return True

    def _key(self, card: dict) -> str:
        tool = self.servers.tool(card["call"]["function"]["name"]) if self.servers else None
        return tool.key if tool else f"{card.get('server')}/{card['call']['function']['name']}"

    def over_rounds(self, history: list[dict]) -> list[dict] | None:
        """Past `max_rounds` for this question: the calls closed unrun and a note saying why; else None."""
        if rounds_since_question(history) <= self.max_rounds:
            return None
        text = (
            f"The model called tools in more than {self.max_rounds} rounds for this question "
            "(--max_tool_rounds), so the answer ends here; ask again to go on."
        )
        closed = with_calls_closed(history, OVER_ROUNDS.format(self.max_rounds))
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
        tool = self.servers.tool(call["function"]["name"]) if self.servers else None
        if tool is None:
            return ToolOutcome(f"No tool {call['function']['name']!r} runs on this page now.", failed=True)
        try:
            arguments = arguments_of(call)
        except UserError as error:
            return ToolOutcome(str(error), failed=True)
        return await self.servers.call(tool, arguments)

    @staticmethod
    def _png(image: tuple[str, bytes]) -> bytes:
        import io

        from PIL import Image

        return png_bytes(Image.open(io.BytesIO(image[1])))

    # ----- the Tools control -----

    def build(self, engine) -> tuple:
        """Under the message box: the servers and their tools, each switched on or off for this conversation, and
        this login's always-allowed tools (untick to be asked again); (tools, always), each a gr.State(None) where
        there are no tools."""
        servers = self.servers
        if servers is None:
            return gr.State(None), gr.State(None)
        tools = servers.tools
        with gr.Accordion(f"Tools ({len(tools)})", open=False, elem_classes="tools"):
            gr.Markdown(tools_note(servers, engine.why_no_tools()), elem_classes="tools-note")
            chosen = gr.CheckboxGroup(
                [(f"{t.called} · {t.server}" + (f": {t.description}" if t.description else ""), t.key) for t in tools],
                value=self.switched_on(),
                label="Tools the model may call in this conversation",
                elem_classes="tool-choices",
            )
            always = gr.CheckboxGroup(
                [], value=[], label="Run without asking (untick one to be asked again)", elem_classes="always-allowed"
            )
        return chosen, always

    def wire(self, parts, decided) -> None:
        """This login's always-allowed tools shown after a choice on the cards (`decided`: that event), and taken
        back when unticked (`parts`: the chat tab's `ChatParts`)."""
        if self.servers is None:
            return
        quiet = dict(api_visibility=UI_ONLY)
        decided.then(self.always_of, parts.browser_id, parts.always, **quiet)
        parts.always.input(self.revoke, [parts.always, parts.browser_id], parts.always, **quiet)

    def tools_of(self, conversation_id, browser_id, request: gr.Request):
        """The Tools control as the open conversation left it: every tool on but those it switched off."""
        if self.servers is None:
            return gr.skip()
        off = None
        if conversation_id and self.saving:
            try:
                off = self.saved.store.get(self.saved.owner(browser_id, request), conversation_id).options.get(
                    "tools_off"
                )
            except UserError:
                off = None
        if off is None:  # a new conversation, or one saved without tools
            return self.switched_on()
        return [t.key for t in self.servers.tools if t.key not in off]

    def tools_off(self, chosen) -> list[str] | None:
        """What a conversation saves of the Tools control: the tools switched off (None: no control)."""
        if self.servers is None or chosen is None:
            return None
        return [t.key for t in self.servers.tools if t.key not in chosen]

    def always_of(self, browser_id, request: gr.Request):
        try:
            allowed = self.approvals.of(self.owner(browser_id, request))
        except UserError:
            return gr.skip()
        return gr.update(choices=allowed, value=allowed)

    def revoke(self, kept, browser_id, request: gr.Request):
        owner = self.owner(browser_id, request)
        self.approvals.set(owner, [t for t in self.approvals.of(owner) if t not in (kept or [])], allowed=False)
        return self.always_of(browser_id, request)


def tools_note(servers: ToolServers, why_not: str | None) -> str:
    """The Tools control's note: why the model gets no tools, and each server that cannot be used."""
    lines = [f"**{why_not}**"] if why_not else []
    lines += [f"- {sentence}" for sentence in servers.problems.values()]
    if not servers.tools and not servers.problems:
        lines.append("The servers of --mcp_config list no tools.")
    return "\n".join(lines) or "A call the model makes is shown with its arguments; nothing runs before you allow it."
