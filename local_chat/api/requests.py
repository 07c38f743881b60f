"""The /v1 API's request bodies, read and checked: an OpenAI chat or completions body in, the engine's `Sampling`
and the call's options out. Every problem is an `APIError`: an HTTP status and one sentence, OpenAI-shaped."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from local_chat.engine import AnswerFormat, ChatOptions, Sampling
from local_chat.engine.interface import SAMPLING_LIMITS, out_of_range
from local_chat.errors import UserError
from local_chat.prompting.families import Effort

MAX_TOP_LOGPROBS = 20
MAX_STOPS = 4


class APIError(Exception):
    """An error the API answers with: `status`, one sentence, the body field it is about, and OpenAI's type."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None, code=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            413: "invalid_request_error",
            503: "service_unavailable",
        }.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


@dataclass
class Call:
    """What a /v1 request asks for, besides its messages or prompt."""

    sampling: Sampling
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # None: none asked; k: the sent tokens' and k alternatives
    max_tokens_given: bool = False
    body: dict = field(default_factory=dict)
    answer_format: AnswerFormat | None = None  # `response_format`'s JSON or schema
    web_pages: int | None = None  # `web_search_options`: the pages read (None: no web search)
    web_tools: bool = False  # `tools` holds {"type": "web_search"}: the built-in web tools run on the server


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError):
        raise bad("The request body is not valid JSON; send a JSON object.")
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.")
    return body


def _number(body: dict, name: str, low: float, high: float, whole: bool = False):
    value = body.get(name)
    if value is None:
        return None
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        raise bad(out_of_range(name, value, low, high, whole), name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"`{name}` is {json.dumps(value)}; give true or false.", name)
    return value


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise bad(f"`stop` must be a string or a list of up to {MAX_STOPS} non-empty strings.", "stop")
    return tuple(stops)


def parse_call(body: dict, defaults: Sampling, context: int, chat: bool) -> Call:
    """The options of a chat (`chat`) or completions body, checked, with `defaults` where it says nothing; an answer
    may fill the context unless `max_tokens` says less."""
    n = body.get("n", 1)
    if n not in (1, None):
        raise bad(f"`n` is {json.dumps(n)}; this server makes one choice per request: send n=1 (or leave it out).", "n")
    max_name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, max_name, *SAMPLING_LIMITS["max_new_tokens"], whole=True)
    temperature = _number(body, "temperature", *SAMPLING_LIMITS["temperature"])
    top_p = _number(body, "top_p", *SAMPLING_LIMITS["top_p"])
    top_k = _number(body, "top_k", -1, SAMPLING_LIMITS["top_k"][1], whole=True)  # vLLM's extension; -1 and 0: off
    repetition_penalty = _number(body, "repetition_penalty", *SAMPLING_LIMITS["repetition_penalty"])
    seed = _number(body, "seed", -(2**63), 2**63 - 1, whole=True)
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad('`stream_options` must be an object such as {"include_usage": true}.', "stream_options")
    logprobs = _logprobs(body, chat)
    chosen = {
        "max_new_tokens": max_tokens if max_tokens is not None else context,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": max(top_k, 0) if top_k is not None else None,
        "repetition_penalty": repetition_penalty,
        "seed": None if seed is None else seed % 2**63,
    }
    try:  # the ranges of every door (engine/interface.py), top_p 0 among them
        sampling = defaults.but(**{k: v for k, v in chosen.items() if v is not None})
    except UserError as error:
        raise bad(str(error), next((name for name in chosen if f"`{name}`" in str(error)), None))
    return Call(
        sampling,
        _stops(body),
        stream,
        stream and _flag(options, "include_usage"),
        logprobs,
        max_tokens is not None,
        body,
        answer_format(body.get("response_format")),
        web_pages(body.get("web_search_options"), chat),
        chat and isinstance(body.get("tools"), list) and any(map(is_web_tool, body["tools"])),
    )


WEB_TOOL_TYPES = ("web_search", "web_search_preview")  # OpenAI's Responses API names the built-in tool so


def is_web_tool(tool) -> bool:
    return isinstance(tool, dict) and tool.get("type") in WEB_TOOL_TYPES


SEARCH_CONTEXT_PAGES = {"low": 3, "medium": 5, "high": 8}  # `search_context_size`: the search's pages read


def web_pages(asked, chat: bool) -> int | None:
    """`web_search_options` ({} or {"search_context_size": "low" | "medium" | "high", "user_location": ...}, of chat
    requests): how many of the search's pages are read; None where it is not given."""
    if asked is None:
        return None
    if not chat or not isinstance(asked, dict):
        raise bad("`web_search_options` must be an object, on a chat request.", "web_search_options")
    size = asked.get("search_context_size", "medium")
    if size not in SEARCH_CONTEXT_PAGES:
        raise bad(
            f"`web_search_options.search_context_size` is {json.dumps(size)}; give low, medium or high.",
            "web_search_options",
        )
    return SEARCH_CONTEXT_PAGES[size]


def answer_format(asked) -> AnswerFormat | None:
    """`response_format`: none or {"type": "text"} (free text), {"type": "json_object"}, or {"type": "json_schema",
    "json_schema": {"name", "schema", "strict"}} (held to the schema whatever `strict` says)."""
    kind = asked.get("type") if isinstance(asked, dict) else None
    if asked is None or kind == "text":
        return None
    if kind == "json_object":
        return AnswerFormat("json_object")
    if kind != "json_schema":
        raise bad(
            f'`response_format` is {json.dumps(asked)[:80]}; send {{"type": "json_schema", "json_schema": '
            '{"name": ..., "schema": {...}}}, {"type": "json_object"} or {"type": "text"}.',
            "response_format",
        )
    described = asked.get("json_schema")
    schema = described.get("schema") if isinstance(described, dict) else None
    if not isinstance(schema, dict):
        raise bad(
            '`response_format.json_schema` must be {"name": ..., "schema": {...}}, the schema a JSON object.',
            "response_format",
        )
    return AnswerFormat("json_schema", schema, str(described.get("name") or ""))


def _logprobs(body: dict, chat: bool) -> int | None:
    if not chat:  # completions: `logprobs` is how many alternatives
        value = _number(body, "logprobs", 0, MAX_TOP_LOGPROBS, whole=True)
        return None if value is None else int(value)
    if not _flag(body, "logprobs"):
        if body.get("top_logprobs") is not None:
            raise bad("`top_logprobs` needs `logprobs`: true.", "top_logprobs")
        return None
    return int(_number(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, whole=True) or 0)


MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")
# apply_chat_template's own parameters: what chat_template_kwargs may not set
TEMPLATE_PARAMETERS = (
    "conversation",
    "messages",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
)


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad('`messages` must be a non-empty list of {"role", "content"} objects.', "messages")
    for message in messages:
        if not isinstance(message, dict):
            raise bad("Each message must be an object with a `role` and a `content`.", "messages")
        if message.get("role") not in MESSAGE_ROLES:
            raise bad(
                f"A message has role {message.get('role')!r}; the roles are {', '.join(MESSAGE_ROLES)}.",
                "messages",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise bad("A message's `content` must be a string or a list of parts.", "messages")
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "image_url", "image", "file", "input_audio"):
                raise bad(
                    f'A message part has type {json.dumps(kind)}; send "text", "image_url", "input_audio" or "file" '
                    "parts.",
                    "messages",
                )
            if kind == "file":
                _check_file(part, message)
            if kind == "input_audio":
                _check_audio(part, message)
        _check_tool_calls(message)
    return messages


def _check_audio(part: dict, message: dict) -> None:
    """A recording in a user message: OpenAI's {"type": "input_audio", "input_audio": {"data": BASE64, "format":
    "wav" or "mp3"}} (any format the app reads: WAV, FLAC, MP3, Ogg)."""
    audio = part.get("input_audio")
    if message.get("role") != "user":
        raise bad("An input_audio part can only be in a user message.", "messages")
    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        raise bad('An input_audio part needs {"input_audio": {"data": BASE64, "format": "wav"}}.', "messages")


def _check_file(part: dict, message: dict) -> None:
    """A document in a user message: OpenAI's {"type": "file", "file": {"file_data": "data:...;base64,...",
    "filename": ...}} (this server keeps no files, so no `file_id`)."""
    file = part.get("file")
    if message.get("role") != "user":
        raise bad("A file part can only be in a user message.", "messages")
    if not isinstance(file, dict) or not isinstance(file.get("file_data"), str) or "file_id" in file:
        raise bad(
            'A file part needs {"file": {"file_data": "data:MIME;base64,...", "filename": NAME}}; this server keeps '
            "no uploaded files, so send the document itself.",
            "messages",
        )
    if not isinstance(file.get("filename"), str) or not file["filename"].strip():
        raise bad('A file part needs its "filename" (with its extension: report.pdf), which says how to read it.')


def _check_tool_calls(message: dict) -> None:
    calls = message.get("tool_calls")
    if calls is None:
        return
    if message["role"] != "assistant" or not isinstance(calls, list):
        raise bad("`tool_calls` must be a list, on an assistant message.", "messages")
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad(
                'Each tool call must be {"id", "type": "function", "function": {"name", "arguments"}}.', "messages"
            )
        if isinstance(function.get("arguments"), str):  # templates print an object; OpenAI sends it as JSON text
            try:
                function["arguments"] = json.loads(function["arguments"] or "{}")
            except ValueError:
                raise bad(f"The arguments of the call to {function['name']!r} are not JSON.", "messages")


def chat_options(body: dict, answer_tokens: int) -> ChatOptions:
    """The chat body's tools, tool_choice, parallel_tool_calls, chat_template_kwargs and reasoning_effort, checked."""
    tools = checked_tools(body.get("tools"))
    choice, name = _tool_choice(body.get("tool_choice"), tools)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise bad("`chat_template_kwargs` must be an object of the template's variables.", "chat_template_kwargs")
    taken = sorted(set(kwargs) & set(TEMPLATE_PARAMETERS))
    if taken:
        raise bad(
            f"`chat_template_kwargs` sets {', '.join(taken)}, which the server sets itself; send the template's own "
            "variables only (such as enable_thinking).",
            "chat_template_kwargs",
        )
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in list(Effort):
        raise bad(
            f"`reasoning_effort` is {json.dumps(effort)}; send one of {', '.join(Effort)}.",
            "reasoning_effort",
        )
    variables = dict(kwargs)
    if effort is not None and "reasoning_effort" not in variables and "enable_thinking" not in variables:
        variables["reasoning_effort"] = str(Effort(effort).for_template())
    return ChatOptions(
        tools=tools,
        tool_choice=choice,
        tool_name=name,
        parallel_tool_calls=_flag(body, "parallel_tool_calls") if "parallel_tool_calls" in body else True,
        template_kwargs=variables,
        answer_tokens=answer_tokens,
    )


def _tool_choice(choice, tools: list[dict] | None) -> tuple[str, str | None]:
    """(`tool_choice` as ChatOptions takes it, the one tool it names): "auto", "none", "required", or a named
    function ("required", its name); a call required without tools, or of a tool not given, is refused."""
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if choice is not None and choice not in ("auto", "none", "required") and not isinstance(named, str):
        raise bad(
            f'`tool_choice` is {json.dumps(choice)[:80]}; send "auto", "none", "required" or '
            '{"type": "function", "function": {"name": ...}}.',
            "tool_choice",
        )
    if choice == "required" or named is not None:
        given = [t["function"]["name"] for t in tools or []]
        if not given:
            raise bad(
                "`tool_choice` requires a call, but the request has no `tools`; send the tools too.", "tool_choice"
            )
        if named is not None and named not in given:
            raise bad(
                f"`tool_choice` names {named!r}, which is not among the `tools` ({', '.join(given)}).", "tool_choice"
            )
        return "required", named
    return choice or "auto", None


def checked_tools(tools) -> list[dict] | None:
    """A request's `tools` (OpenAI's shape), checked: None where there are none."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad('`tools` must be a list of {"type": "function", "function": {...}} objects.', "tools")
    if any(is_web_tool(tool) for tool in tools):  # the built-in web tools, as functions the model calls
        from local_chat.web.tools import FETCH, SEARCH

        tools = [tool for tool in tools if not is_web_tool(tool)] + [SEARCH.openai(), FETCH.openai()]
    names = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise bad('Each tool must be {"type": "function", "function": {"name", "parameters"}}.', "tools")
        parameters = function.get("parameters")
        if parameters is not None and not (
            isinstance(parameters, dict) and parameters.get("type", "object") == "object"
        ):
            raise bad(f"The parameters of tool {function['name']!r} must be a JSON schema of type object.", "tools")
        names.append(function["name"])
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise bad(
            f"Two tools are named {', '.join(repeated)}; give each tool its own name (web_search and fetch_page are "
            'the server\'s with {"type": "web_search"}).',
            "tools",
        )
    return tools


def completion_prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("`prompt` must be a string (one prompt per request).", "prompt")
    if not prompt:
        raise bad("`prompt` is empty; send the text to continue.", "prompt")
    return prompt
