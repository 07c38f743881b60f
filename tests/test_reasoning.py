"""Reasoning and tool calls: chat messages rendered with the model's own template (tools, tool turns, thinking on and
off), and answers parsed into reasoning, answer and tool calls (engine/chats.py), through /v1 and the `openai`
client. A tiny random Qwen3 of the real class, with Qwen3's published template and special tokens, is made to write
what a trained one would by a hook on its output layer (tiny_models.ForcedAnswer)."""

import json

import httpx
import pytest
from openai import OpenAI

from fixtures import tiny_models
from fixtures.app_server import serve
from fixtures.tiny_models import WEATHER
from local_chat.engine import ChatOptions, Delta, End, Reasoning, Rendered, Request, Sampling, ToolCallDelta
from local_chat.engine.chats import ChatEngine
from local_chat.model.meta import MetaModel
from local_chat.prompting.response_formats import RESPONSE_FORMATS

END = "<|im_end|>"
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}},
}
THOUGHT_AND_ANSWER = "<think>\nThe user greets me. I greet back.\n</think>\n\nHello! How can I help?"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO_CALLS = CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'


def answer(qwen3, text: str) -> None:
    """The model's next answer will be `text`."""
    model, forced = qwen3
    forced.again(text, model.tokenizer.hf, END)


@pytest.fixture(scope="module")
def client(qwen3):
    with serve(qwen3[0]) as (url, _):
        yield OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0), url


def events_of(model, messages, **options) -> list:
    request = Request(
        messages=messages, sampling=Sampling(temperature=0, max_new_tokens=400), chat=ChatOptions(**options)
    )
    return list(ChatEngine(model.engine, "chat_template").stream(request))


def test_the_response_formats_are_transformers_own():
    from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS

    assert RESPONSE_FORMATS == _RESPONSE_TEMPLATE_FALLBACKS


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"template_kwargs": {"enable_thinking": False}},
        {"tools": [WEATHER, TIME]},
        {"template_kwargs": {"reasoning_effort": "none"}},
    ],
)
def test_the_prompt_is_the_templates_own(qwen3, options):
    model, _ = qwen3
    answer(qwen3, "Hi.")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!"}]
    rendered = events_of(model, messages, **options)[0]
    kwargs = dict(options.get("template_kwargs", {}))
    if kwargs.pop("reasoning_effort", None) == "none":  # Qwen3's template reads no reasoning_effort: thinking off
        kwargs["enable_thinking"] = False
    expected = model.tokenizer.hf.apply_chat_template(
        messages, tools=options.get("tools"), tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert isinstance(rendered, Rendered) and rendered.text == expected
    assert ("<think>\n\n</think>" in expected) == (kwargs.get("enable_thinking") is False)
    assert ("get_weather" in expected) == bool(options.get("tools"))


def test_reasoning_comes_apart_from_a_clean_answer(qwen3, client):
    api, _ = client
    specials = qwen3[0].tokenizer.hf.all_special_tokens + tiny_models.QWEN_ADDED
    answer(qwen3, THOUGHT_AND_ANSWER)
    reply = api.chat.completions.create(model="q", messages=[{"role": "user", "content": "Hello there!"}])
    message = reply.choices[0].message
    assert message.content == "Hello! How can I help?" and reply.choices[0].finish_reason == "stop"
    extra = message.model_extra
    assert extra["reasoning_content"] == extra["reasoning"] == "The user greets me. I greet back."
    assert reply.usage.completion_tokens_details.reasoning_tokens > 0
    assert not any(s in message.content + extra["reasoning_content"] for s in specials)

    answer(qwen3, THOUGHT_AND_ANSWER)
    stream = api.chat.completions.create(model="q", messages=[{"role": "user", "content": "Hello there!"}], stream=True)
    reasoning, content, order = "", "", []
    for chunk in stream:
        delta = chunk.choices[0].delta
        if (delta.model_extra or {}).get("reasoning_content"):
            reasoning += delta.model_extra["reasoning_content"]
            order.append("reasoning")
        if delta.content:
            content += delta.content
            order.append("content")
    assert reasoning == "The user greets me. I greet back." and content == "Hello! How can I help?"
    assert order == sorted(order, key=["reasoning", "content"].index)  # all the reasoning before the answer


def test_logprobs_cover_the_answers_tokens(qwen3, client):
    """Each of the answer's tokens once, none of the reasoning's or of the tags around it, a line break held back by
    the parser included: the tokens' texts make the answer's."""
    api, _ = client
    for stream in (False, True):
        answer(qwen3, "<think>\nR.\n</think>\n\nHello!\nHow can I help?")
        reply = api.chat.completions.create(
            model="q", messages=[{"role": "user", "content": "Hi"}], logprobs=True, top_logprobs=1, stream=stream
        )
        choices = [c.choices[0] for c in reply] if stream else [reply.choices[0]]
        content = "".join((c.delta if stream else c.message).content or "" for c in choices)
        tokens = [t.token for c in choices if c.logprobs for t in c.logprobs.content or []]
        assert content == "Hello!\nHow can I help?" and "".join(tokens) == content, tokens


def test_a_tool_call_round_trip(qwen3, client):
    api, url = client
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    answer(qwen3, "<think>\nI need the weather.\n</think>\n\n" + CALL)
    reply = api.chat.completions.create(model="q", messages=question, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert not choice.message.content  # the call is not in the answer's text

    answer(qwen3, "<think>\nI need the weather.\n</think>\n\n" + CALL)
    stream = api.chat.completions.create(model="q", messages=question, tools=[WEATHER], stream=True)
    pieces = [c.choices[0] for c in stream if c.choices]
    calls = [tc for p in pieces for tc in (p.delta.tool_calls or [])]
    assert calls[0].id and calls[0].function.name == "get_weather" and calls[0].function.arguments == ""
    assert json.loads("".join(c.function.arguments or "" for c in calls)) == {"city": "Paris"}
    assert pieces[-1].finish_reason == "tool_calls"

    # the follow-up: the call and its result go back; the template renders them, and the model answers
    follow_up = question + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call.model_dump()],
            "reasoning_content": "I need the weather.",
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"weather": "sunny"}'},
    ]
    answer(qwen3, "<think>\nIt is sunny.\n</think>\n\nIt is sunny in Paris.")
    reply = api.chat.completions.create(model="q", messages=follow_up, tools=[WEATHER])
    assert reply.choices[0].message.content == "It is sunny in Paris."
    rendered = events_of(qwen3[0], follow_up, tools=[WEATHER])[0]
    expected_call = {**call.model_dump(), "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    expected = qwen3[0].tokenizer.hf.apply_chat_template(
        [*follow_up[:1], {**follow_up[1], "content": "", "tool_calls": [expected_call]}, follow_up[2]],
        tools=[WEATHER],
        tokenize=False,
        add_generation_prompt=True,
    )
    # the published template fails on a content of None (as OpenAI clients send with a call): it goes as ""
    assert (
        rendered.text == expected
        and "I need the weather." in expected
        and '<tool_response>\n{"weather": "sunny"}\n</tool_response>' in expected
    )


def test_tool_choice_none_and_parallel_calls(qwen3, client):
    api, _ = client
    question = [{"role": "user", "content": "Weather and time in Paris?"}]
    answer(qwen3, TWO_CALLS)
    reply = api.chat.completions.create(model="q", messages=question, tools=[WEATHER, TIME])
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["get_weather", "get_time"]
    answer(qwen3, TWO_CALLS)
    reply = api.chat.completions.create(model="q", messages=question, tools=[WEATHER, TIME], parallel_tool_calls=False)
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["get_weather"]
    answer(qwen3, CALL)
    reply = api.chat.completions.create(model="q", messages=question, tools=[WEATHER], tool_choice="none")
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason == "stop"
    assert "get_weather" in reply.choices[0].message.content  # not parsed: the text as the model wrote it


def test_a_call_cut_by_the_length_limit_comes_back_as_text(qwen3, client):
    api, _ = client
    answer(qwen3, CALL)
    question = [{"role": "user", "content": "Weather?"}]
    reply = api.chat.completions.create(model="q", messages=question, tools=[WEATHER], max_tokens=12)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content.startswith('{"name": "')  # what the model wrote of the call, as text


def test_a_callers_stop_string_is_looked_for_in_the_answer_only(qwen3):
    answer(qwen3, "<think>\nSay hello, then stop.\n</think>\n\nHello! How can I help?")
    request = Request(
        messages=[{"role": "user", "content": "Hi"}],
        sampling=Sampling(temperature=0, max_new_tokens=400),
        stop=("How",),
    )
    events = list(ChatEngine(qwen3[0].engine, "chat_template").stream(request))
    assert "".join(e.text for e in events if isinstance(e, Reasoning)) == "Say hello, then stop."  # "then" kept
    assert "".join(e.text for e in events if isinstance(e, Delta)) == "Hello! "
    assert isinstance(events[-1], End) and events[-1].finish_reason == "stop"
    assert not any(isinstance(e, ToolCallDelta) for e in events)


CALL_ID = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


@pytest.mark.parametrize(
    "extra, sentence",
    [
        ({"tool_choice": "required"}, "requires a call, but the request has no `tools`"),
        ({"tool_choice": "always", "tools": [WEATHER]}, '`tool_choice` is "always"'),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_time"}}, "tools": [WEATHER]},
            "names 'get_time', which is not among the `tools` (get_weather)",
        ),
        ({"chat_template_kwargs": {"tools": []}}, "sets tools, which the server sets itself"),
        ({"chat_template_kwargs": "thinking"}, "must be an object"),
        ({"reasoning_effort": "extreme"}, '`reasoning_effort` is "extreme"'),
        ({"tools": [WEATHER, WEATHER]}, "Two tools are named get_weather"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "type object"),
        (
            {
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "tool", "tool_call_id": "call_9", "content": "1"},
                ]
            },
            "answers tool_call_id 'call_9', which no earlier assistant message called",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{**CALL_ID, "function": {"name": "f", "arguments": "{"}}],
                    }
                ]
            },
            "are not JSON",
        ),
    ],
)
def test_bad_tool_and_template_fields_are_a_400(client, extra, sentence):
    _, url = client
    body = {"model": "q", "messages": [{"role": "user", "content": "Hi"}], **extra}
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert sentence in reply.json()["error"]["message"]


def test_reasoning_effort_none_turns_thinking_off(qwen3, client):
    api, url = client
    answer(qwen3, "Hi.")
    body = {"messages": [{"role": "user", "content": "Hello"}], "reasoning_effort": "none"}
    count = httpx.post(url + "/tokenize", json=body, timeout=60).json()["count"]
    tokenizer = qwen3[0].tokenizer.hf
    off = tokenizer.apply_chat_template(
        body["messages"], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off.endswith("<think>\n\n</think>\n\n") and count == len(tokenizer.encode(off, add_special_tokens=False))


# ----- transformers serve, on the same folder with the same forcing: an engine nobody here wrote -----


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    """`transformers serve` in this process on a Qwen3 folder (its model forced like ours), and our app on it."""
    from bench.api_vs_serve import has_serving
    from local_chat.launchers.loading import free_port

    if not has_serving():
        pytest.skip('transformers[serving] is not installed (pip install -e ".[dev]")')
    from transformers.cli.serve import Serve

    folder = tiny_models.save_tiny_qwen3(tmp_path_factory.mktemp("peer") / "qwen3")
    port = free_port()
    server = Serve(force_model=str(folder), port=port, device="cpu", non_blocking=True, log_level="error")
    try:
        [loaded] = server._model_manager.loaded_models.values()
        theirs = tiny_models.ForcedAnswer(loaded.model, loaded.processor, "x", END)
        ours = MetaModel.from_pretrained(str(folder))
        forced = tiny_models.ForcedAnswer(ours.llma, ours.tokenizer.hf, "x", END)
        with serve(ours) as (url, _):
            servers = {
                "theirs": (OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0), theirs),
                "ours": (OpenAI(base_url=url + "/v1", api_key="x", max_retries=0), forced),
            }
            yield servers, loaded.processor, str(folder)
    finally:
        server.kill_server()


def parsed(message) -> dict:
    extra = message.model_extra or {}
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    return {"content": message.content or "", "reasoning": extra.get("reasoning_content"), "calls": calls}


@pytest.mark.parametrize(
    "text, tools", [(THOUGHT_AND_ANSWER, None), ("<think>\nI need the weather.\n</think>\n\n" + CALL, [WEATHER])]
)
def test_the_same_answer_parsed_as_transformers_serve_parses_it(peer, text, tools):
    servers, tokenizer, folder = peer
    replies = {}
    for name, (api, forced) in servers.items():
        forced.again(text, tokenizer, END)
        extra = {"tools": tools} if tools else {}
        reply = api.chat.completions.create(
            model=folder, messages=[{"role": "user", "content": "Hello there!"}], max_tokens=300, temperature=0, **extra
        )
        replies[name] = (parsed(reply.choices[0].message), reply.choices[0].finish_reason)
    assert replies["ours"] == replies["theirs"], replies


def test_generate_prints_the_reasoning_apart_and_writes_it(qwen3, monkeypatch, tmp_path, capsys):
    from local_chat.launchers import generate

    monkeypatch.setattr(generate, "load_engine", lambda args: qwen3[0].engine)
    answer(qwen3, THOUGHT_AND_ANSWER)
    output = tmp_path / "out.jsonl"
    generate.main(["--prompts", "Hello there!", "--output", str(output), "--max_new_tokens", "300"])
    printed = capsys.readouterr().out
    assert "### Hello there!\nThinking:\nThe user greets me. I greet back.\n\nHello! How can I help?\n" in printed
    [record] = [json.loads(line) for line in output.read_text().splitlines()]
    assert record["reasoning"] == "The user greets me. I greet back." and record["response"] == "Hello! How can I help?"
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]))
    for given in ([], ["--tools", str(tools)]):  # a call only of a tool given
        answer(qwen3, CALL)
        generate.main(["--prompts", "Weather?", "--output", str(output), "--max_new_tokens", "300", *given])
        [record] = [json.loads(line) for line in output.read_text().splitlines()]
        calls = [{"name": "get_weather", "arguments": '{"city": "Paris"}'}] if given else []
        assert record["tool_calls"] == calls and ("get_weather" in record["response"]) == (not given)


def test_the_app_in_front_of_an_engine_passes_reasoning_and_calls_through(qwen3, client):
    from fixtures.app_server import serve_engine
    from local_chat.engine.remote import RemoteEngine

    _, url = client
    with serve_engine(RemoteEngine(url + "/v1")) as front:
        api = OpenAI(base_url=front + "/v1", api_key="unused", max_retries=0)
        answer(qwen3, THOUGHT_AND_ANSWER)
        message = (
            api.chat.completions.create(model="q", messages=[{"role": "user", "content": "Hi"}]).choices[0].message
        )
        assert parsed(message) == {
            "content": "Hello! How can I help?",
            "reasoning": "The user greets me. I greet back.",
            "calls": [],
        }
        answer(qwen3, CALL)
        reply = api.chat.completions.create(
            model="q", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER]
        )
        assert parsed(reply.choices[0].message)["calls"] == [("get_weather", {"city": "Paris"})]
        assert reply.choices[0].finish_reason == "tool_calls"


def test_the_app_in_front_of_transformers_serve_passes_reasoning_and_calls_through(peer):
    from fixtures.app_server import serve_engine
    from local_chat.engine.remote import RemoteEngine

    servers, tokenizer, folder = peer
    theirs, forced = servers["theirs"]
    with serve_engine(RemoteEngine(str(theirs.base_url).rstrip("/"))) as front:
        api = OpenAI(base_url=front + "/v1", api_key="unused", max_retries=0)
        forced.again("<think>\nI need the weather.\n</think>\n\n" + CALL, tokenizer, END)
        reply = api.chat.completions.create(
            model=folder, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER], max_tokens=300
        )
        assert parsed(reply.choices[0].message) == {
            "content": "", "reasoning": "I need the weather.", "calls": [("get_weather", {"city": "Paris"})]
        }  # fmt: skip
        forced.again(THOUGHT_AND_ANSWER, tokenizer, END)
        reply = api.chat.completions.create(
            model=folder, messages=[{"role": "user", "content": "Hi"}], reasoning_effort="high", max_tokens=300
        )
    assert reply.choices[0].message.content == "Hello! How can I help?"  # with reasoning_effort and tool_choice sent


def test_reasoning_an_engine_sends_raw_is_split_out_of_the_answer():
    from local_chat.prompting.response_formats import ThinkSplitter

    def split(pieces, opened=False):
        splitter, events = ThinkSplitter(opened), []
        for piece in pieces:
            events += splitter.feed(piece)
        events += splitter.finish()
        kinds = {"Reasoning": "", "Delta": ""}
        for event in events:
            kinds[type(event).__name__] += event.text
        return kinds["Reasoning"], kinds["Delta"]

    assert split(["<thi", "nk>\nHm, ", "yes.</th", "ink>\n\nYes."]) == ("Hm, yes.", "Yes.")
    assert split(["Plain answer."]) == ("", "Plain answer.")
    assert split(["Hm.</think>Yes."], opened=True) == ("Hm.", "Yes.")  # the prompt opened the block
    assert split(["Plain ", "answer."], opened=True) == ("", "Plain answer.")  # it opened none: all answer


def test_langchain_completes_a_tool_round_trip(qwen3, client):
    """LangChain's ChatOpenAI, a client nobody here wrote, binds a tool, gets the call, runs it, and gets the answer."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        return f'{{"city": "{city}", "weather": "sunny"}}'

    _, url = client
    chat = ChatOpenAI(base_url=url + "/v1", api_key="unused", model="q", temperature=0, max_retries=0)
    bound = chat.bind_tools([get_weather])
    messages = [HumanMessage("What is the weather in Paris?")]
    answer(qwen3, "<think>\nI need the weather.\n</think>\n\n" + CALL)
    called = bound.invoke(messages)
    assert [(c["name"], c["args"]) for c in called.tool_calls] == [("get_weather", {"city": "Paris"})]
    messages += [
        called,
        ToolMessage(get_weather.invoke(called.tool_calls[0]["args"]), tool_call_id=called.tool_calls[0]["id"]),
    ]
    answer(qwen3, "It is sunny in Paris.")
    assert bound.invoke(messages).content == "It is sunny in Paris."


# ----- Qwen3-VL: the same through a vision model's processor, with an image -----


@pytest.fixture(scope="module")
def qwen3_vl(tmp_path_factory):
    from fixtures import vlm_families

    model = MetaModel.from_pretrained(str(vlm_families.build("qwen3_vl", tmp_path_factory.mktemp("qwen3_vl") / "m")))
    forced = tiny_models.ForcedAnswer(model.llma, model.processor.tokenizer, "x", END)
    yield model, forced
    forced.remove()


def red_square_question(text: str) -> dict:
    from PIL import Image

    from local_chat.prompting import png_bytes, png_data_url

    url = png_data_url(png_bytes(Image.new("RGB", (64, 64), (220, 20, 20))))
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}],
    }


def test_qwen3_vl_prompt_with_an_image_and_tools_is_its_processors_own(qwen3_vl):
    model, forced = qwen3_vl
    forced.again("Hi.", model.processor.tokenizer, END)
    messages = [{"role": "system", "content": "Be brief."}, red_square_question("What is this?")]
    rendered = events_of(model, messages, tools=[WEATHER])[0]
    expected = model.processor.apply_chat_template(
        [messages[0], {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}],
        tools=[WEATHER],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert rendered.text == expected and rendered.images == 1 and "<|image_pad|>" in expected
    assert "get_weather" in expected and rendered.prompt_tokens > len(model.processor.tokenizer.encode(expected))


def test_qwen3_vl_reasoning_and_a_tool_round_trip_through_v1(qwen3_vl):
    model, forced = qwen3_vl
    tokenizer = model.processor.tokenizer
    specials = tokenizer.all_special_tokens + tiny_models.QWEN_ADDED
    question = [red_square_question("What color is it, and what is the weather in Paris?")]
    with serve(model) as (url, _):
        api = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        forced.again(THOUGHT_AND_ANSWER, tokenizer, END)
        message = api.chat.completions.create(model="q", messages=question).choices[0].message
        assert message.content == "Hello! How can I help?"
        assert message.model_extra["reasoning_content"] == "The user greets me. I greet back."
        assert not any(s in message.content + message.model_extra["reasoning_content"] for s in specials)

        forced.again(THOUGHT_AND_ANSWER, tokenizer, END)
        chunks = [c.choices[0].delta for c in api.chat.completions.create(model="q", messages=question, stream=True)]
        assert "".join(d.content or "" for d in chunks) == "Hello! How can I help?"
        assert (
            "".join((d.model_extra or {}).get("reasoning", "") for d in chunks) == "The user greets me. I greet back."
        )

        forced.again(CALL, tokenizer, END)
        choice = api.chat.completions.create(model="q", messages=question, tools=[WEATHER]).choices[0]
        [call] = choice.message.tool_calls
        assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"} and not choice.message.content

        follow_up = question + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"weather": "sunny"}'},
        ]
        forced.again("It is red, and sunny in Paris.", tokenizer, END)
        reply = api.chat.completions.create(model="q", messages=follow_up, tools=[WEATHER])
        assert reply.choices[0].message.content == "It is red, and sunny in Paris."
    # the next turn's prompt is the template's rendering of the parsed reply
    expected = model.processor.apply_chat_template(
        [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": question[0]["content"][1]["text"]}],
            },
            {**follow_up[1], "content": ""},
            follow_up[2],
        ],
        tools=[WEATHER],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert events_of(model, follow_up, tools=[WEATHER])[0].text == expected and '"city": "Paris"' in expected
