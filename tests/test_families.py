"""The 2026 families (fixtures/text_families.py): each a tiny random model of its real class with its published chat
template and special tokens, made to write what a trained one would (tiny_models.ForcedAnswer). Its prompt is its
template's own; its reasoning, answer and tool calls come apart through /v1 (the `openai` client, streamed and not),
with no special token left in them; the next turn renders the parsed reply as the template does; and with the
session cache, in the batch, and with --compile it answers as it does without them, or refuses in one sentence."""

import json

import pytest
from openai import OpenAI

from fixtures import text_families, tiny_models
from fixtures.app_server import serve
from fixtures.tiny_models import WEATHER
from local_chat.engine import ChatOptions, Delta, Rendered, Request, Sampling, ToolCallDelta, collect
from local_chat.engine.chats import ChatEngine
from local_chat.errors import UserError
from local_chat.model.meta import MetaModel

REASONING, ANSWER = "The user greets me. I greet back.", "Hello! How can I help?"
NAMES = list(text_families.FAMILIES)


@pytest.fixture(scope="module", params=NAMES)
def family(request, tmp_path_factory):
    """(the Family, its model, its forcing) for each family in turn."""
    name = request.param
    folder = text_families.build(name, tmp_path_factory.mktemp(name) / "m")
    model = MetaModel.from_pretrained(str(folder))
    kind = text_families.FAMILIES[name]
    forced = tiny_models.ForcedAnswer(model.llma, model.tokenizer.hf, "x", kind.end)
    yield kind, model, forced
    forced.remove()


def force(family, text: str, end: str | None = None) -> None:
    kind, model, forced = family
    forced.again(text, model.tokenizer.hf, end or kind.end)


def rendered(model, messages, **options) -> Rendered:
    request = Request(messages=messages, sampling=Sampling(max_new_tokens=1), chat=ChatOptions(**options))
    return next(iter(ChatEngine(model.engine, "chat_template").stream(request)))


def as_the_template_reads(messages: list[dict], kind=None) -> list[dict]:
    """The messages as the published templates expect them: a call's arguments as an object (as JSON text where the
    template joins them to its text), its content "" (the call as the model wrote it, where the template renders no
    calls), and the reasoning under each name they read it by."""
    out = []
    for message in messages:
        message = {k: v for k, v in message.items() if v is not None}
        if message.get("tool_calls") and kind is not None and kind.calls_in_text:
            calls = message.pop("tool_calls")
            message["content"] = "".join(kind.call(c["function"]["name"], c["function"]["arguments"]) for c in calls)
        elif message.get("tool_calls"):
            message["content"] = message.get("content") or ""
            as_text = kind is not None and kind.arguments_as_text
            message["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": a if as_text else json.loads(a)}}
                for c in message["tool_calls"]
                for a in [c["function"]["arguments"]]
            ]
        if message.get("reasoning_content"):
            message["thinking"] = message["reasoning_content"]
        out.append(message)
    return out


OFF = {"template_kwargs": {"enable_thinking": False}}  # the page's switch
EFFORT_NONE = {"template_kwargs": {"reasoning_effort": "none"}}  # /v1's reasoning_effort


@pytest.mark.parametrize(
    "options", [{}, OFF, EFFORT_NONE, {"tools": [WEATHER]}], ids=["on", "off", "effort-none", "tools"]
)
def test_the_prompt_is_the_templates_own(family, options):
    """With thinking switched off (by the page or by reasoning_effort), the template's own switch is set."""
    kind, model, _ = family
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!"}]
    expected_messages, variables = messages, {}
    if options in (OFF, EFFORT_NONE) and isinstance(kind.off, str):  # a flag in the system prompt
        expected_messages = [{"role": "system", "content": f"Be brief. {kind.off}"}, messages[1]]
    elif options in (OFF, EFFORT_NONE):
        variables = kind.off
    expected = model.tokenizer.hf.apply_chat_template(
        expected_messages, tools=options.get("tools"), tokenize=False, add_generation_prompt=True, **variables
    )
    assert rendered(model, messages, **options).text == expected


def specials_in(family, *texts) -> list[str]:
    kind, model, _ = family
    specials = set(model.tokenizer.hf.all_special_tokens) | set(kind.specials)
    return [s for s in specials for t in texts if s in t]


def test_reasoning_and_the_answer_come_apart_through_v1(family):
    kind, model, _ = family
    question = [{"role": "user", "content": "Hello there!"}]
    reasoning = REASONING if "{r}" in kind.thought else None
    with serve(model) as (url, _):
        api = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        thinking = {"extra_body": {"chat_template_kwargs": kind.thinking}} if kind.thinking else {}
        force(family, kind.think(REASONING, ANSWER))
        reply = api.chat.completions.create(model="m", messages=question, max_tokens=300, **thinking)
        message = reply.choices[0].message
        got = (message.model_extra or {}).get("reasoning_content")
        assert (message.content, got, reply.choices[0].finish_reason) == (ANSWER, reasoning, "stop")
        assert not specials_in(family, message.content, got or "")

        force(family, kind.think(REASONING, ANSWER))
        stream = api.chat.completions.create(model="m", messages=question, stream=True, **thinking)
        chunks = [c.choices[0] for c in stream]
        assert "".join(c.delta.content or "" for c in chunks) == ANSWER
        assert "".join((c.delta.model_extra or {}).get("reasoning_content") or "" for c in chunks) == (reasoning or "")

    # the next turn renders the parsed reply as the template does
    follow_up = question + [
        {"role": "assistant", "content": ANSWER, "reasoning_content": got},
        {"role": "user", "content": "Thanks!"},
    ]
    expected = model.tokenizer.hf.apply_chat_template(
        as_the_template_reads(follow_up), tokenize=False, add_generation_prompt=True
    )
    assert rendered(model, follow_up).text == expected


def test_a_tool_call_comes_apart_and_goes_back(family):
    kind, model, _ = family
    if kind.called is None:
        pytest.skip(f"{kind.name}'s template renders calls, but the family is not trained to make them")
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    with serve(model) as (url, _):
        api = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        force(family, kind.call("get_weather", '{"city": "Paris"}'), kind.call_end)
        choice = api.chat.completions.create(model="m", messages=question, tools=[WEATHER], max_tokens=300).choices[0]
        [call] = choice.message.tool_calls
        assert (choice.finish_reason, call.function.name) == ("tool_calls", "get_weather")
        assert json.loads(call.function.arguments) == {"city": "Paris"} and not choice.message.content

        force(family, kind.call("get_weather", '{"city": "Paris"}'), kind.call_end)
        stream = api.chat.completions.create(model="m", messages=question, tools=[WEATHER], stream=True)
        pieces = [c.choices[0] for c in stream if c.choices]
        calls = [tc for p in pieces for tc in (p.delta.tool_calls or [])]
        assert calls[0].function.name == "get_weather" and pieces[-1].finish_reason == "tool_calls"
        assert json.loads("".join(c.function.arguments or "" for c in calls)) == {"city": "Paris"}
        assert not "".join(p.delta.content or "" for p in pieces).strip()

        follow_up = question + [
            {**choice.message.model_dump(exclude_none=True), "content": None},
            {"role": "tool", "tool_call_id": call.id, "content": '{"weather": "sunny"}'},
        ]
        plain = kind.thinking is not None  # thinking is off (the template's default): the answer comes alone
        force(family, "It is sunny in Paris." if plain else kind.think("It is sunny.", "It is sunny in Paris."))
        reply = api.chat.completions.create(model="m", messages=follow_up, tools=[WEATHER], max_tokens=300)
        assert reply.choices[0].message.content == "It is sunny in Paris."
    extra = {k: v for k, v in follow_up[1].items() if k not in ("reasoning", "refusal", "annotations", "audio")}
    expected = model.tokenizer.hf.apply_chat_template(
        as_the_template_reads([question[0], extra, follow_up[2]], kind),
        tools=[WEATHER],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert rendered(model, follow_up, tools=[WEATHER]).text == expected


def test_the_session_cache_and_the_batch_answer_as_one_fresh_answer_does(family):
    """Unforced (random) answers: a conversation's second turn with its session's cache, and three answers batched
    together, each the same as the answer from scratch, one at a time."""
    kind, model, forced = family
    with forced.paused():
        engine = ChatEngine(model.engine, "chat_template")
        turns = [[{"role": "user", "content": q}] for q in ("Hi", "What is the capital of France?", "Tell me more.")]
        sampling = Sampling(temperature=0, max_new_tokens=8)
        fresh = [a.text for a in engine.complete([Request(messages=m, sampling=sampling) for m in turns])]
        first = engine.complete([Request(messages=turns[0], sampling=sampling, session="s")])[0]
        second = turns[0] + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "More?"}]
        again = [engine.complete([Request(messages=second, sampling=sampling, session=s)])[0].text for s in ("s", None)]
        assert again[0] == again[1]
        places = model.engine.start_batching(4)
        try:
            batched = [a.text for a in engine.complete([Request(messages=m, sampling=sampling) for m in turns])]
        finally:
            model.engine.stop_batching()
        assert batched == fresh, places


def test_qwen3_5_refuses_compile_in_one_sentence(tmp_path):
    folder = text_families.build("qwen3_5", tmp_path / "m")
    with pytest.raises(UserError, match=r"^--compile: Qwen3_5ForCausalLM's linear-attention layers keep a running"):
        MetaModel.from_pretrained(str(folder), compile=True)


@pytest.mark.parametrize("name", ["gpt_oss", "gemma4_text", "qwen3_5"])
def test_tensor_parallel_answers_as_one_process_does(name, tmp_path):
    """--n_gpus 2 (gloo, two CPU processes) over the families whose layers are least like Llama's: experts, layers
    of two widths, linear attention."""
    from fixtures.app_server import generate, generate_here

    folder = text_families.build(name, tmp_path / "m")
    flags = ["--pretrained_path", str(folder), "--template", "chat_template", "--max_new_tokens", "8"]
    flags += ["--prompts", "Hi", "What is the capital of France?", "--temperature", "0"]
    one = generate_here(tmp_path, "one", *flags)  # the reference in this process: no Python to start
    assert generate(tmp_path, "two", *flags, "--n_gpus", "2", "--device", "cpu") == one and len(one.splitlines()) == 2


def test_gemma4_compiled_answers_as_eager_does(tmp_path):
    """--compile over the family least like Llama that takes it: Gemma 4's sliding and full layers of two widths
    (gpt-oss, SmolLM3, Ministral 3, Llama 3.1 and the R1 distills answered the same too when tried by hand)."""
    import torch

    folder = text_families.build("gemma4_text", tmp_path / "m")
    prompts = ["Hi there", "What is the capital of France?"]
    eager = MetaModel.from_pretrained(str(folder)).generate(prompts, max_gen_len=8)
    torch._dynamo.reset()
    compiled = MetaModel.from_pretrained(str(folder), compile=True)
    assert compiled.engine.compiled is not None and compiled.generate(prompts, max_gen_len=8) == eager


def test_calls_only_of_the_tools_the_request_declared(family):
    """With no tools the answer stays text (Llama 3.1's JSON answer is no call then), and so does a call of a tool
    the request did not declare."""
    kind, model, _ = family
    if kind.called is None:
        pytest.skip(f"{kind.name} is not trained to make calls")
    for tools, name in ((None, "get_weather"), ([WEATHER], "get_time")):
        force(family, kind.call(name, '{"city": "Paris"}'), kind.call_end)
        request = Request(messages=[{"role": "user", "content": "Weather?"}], chat=ChatOptions(tools=tools))
        events = list(ChatEngine(model.engine, "chat_template").stream(request))
        assert not [e for e in events if isinstance(e, ToolCallDelta)]
        if tools or kind.name != "gpt_oss":  # harmony's message to a function is no answer text
            assert name in "".join(e.text for e in events if isinstance(e, Delta))


def test_the_page_shows_the_thought_apart(family):
    """The chat tab's handler (in-process): the thought is a Thinking entry above the answer, which stands alone."""
    from fixtures.app_server import submit
    from local_chat.ui.chat import Cancels
    from local_chat.ui.chat_tab import ChatTab
    from local_chat.ui.history import SavedChats
    from local_chat.ui.turns import kind_of

    kind, model, _ = family
    force(family, kind.think(REASONING, ANSWER))
    tab = ChatTab(model.engine, Cancels(), "chat_template", "padded_resize", SavedChats(None))
    thinking = True if kind.thinking else None  # the page's switch on, where the template's default is off
    entries, *_ = submit(tab, "Hello there!", template="chat_template", max_gen_len=300, thinking=thinking)
    thought = ["thinking"] if "{r}" in kind.thought else []
    assert [kind_of(e) for e in entries] == ["question", *thought, "answer", "stats"], entries
    assert entries[-2]["content"] == ANSWER and (not thought or entries[1]["content"] == REASONING)


ZONE = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def required(model, tools, seed: int | None = None, **options):
    sampling = Sampling(max_new_tokens=120, temperature=1.0 if seed is not None else 0.0, seed=seed)
    chat = ChatOptions(tools=tools, tool_choice="required", **options)
    request = Request(messages=[{"role": "user", "content": "Weather and time?"}], sampling=sampling, chat=chat)
    return collect(ChatEngine(model.engine, "chat_template").stream(request))


def test_a_required_call_is_held_to_the_familys_own_call_format(family):
    """tool_choice "required": what a trained model writes passes the family's grammar as it is; and a random model
    sampled at temperature 1 (its reasoning switched off where the template can) writes a valid call."""
    kind, model, forced = family
    if kind.called is None or kind.name == "gemma4_text":
        pytest.skip(f"{kind.name}: no call grammar here")
    force(family, kind.call("get_weather", '{"city": "Paris"}'), kind.call_end)
    answer = required(model, [WEATHER, ZONE])
    assert [(c.name, json.loads(c.arguments)) for c in answer.tool_calls] == [("get_weather", {"city": "Paris"})]
    if kind.name in ("minimax_m2", "ministral3", "lfm2_moe", "lfm2"):
        return  # no switch turns their reasoning off, and a random model that starts reasoning never stops
    with forced.paused():
        for seed in range(3):
            answer = required(model, [ZONE], seed, template_kwargs={"reasoning_effort": "none"})
            assert [json.loads(c.arguments)["zone"] for c in answer.tool_calls] in (["UTC"], ["CET"]), answer


PAGE_SWITCH = {  # the page's thinking control for each family: what it sets, and what it starts as
    "gpt_oss": ("reasoning_effort", "medium"),
    "gemma4_text": ("enable_thinking", False),  # it thinks only when the variable is true
    "deepseek_v3_1": ("enable_thinking", False),  # its template thinks only when asked
    "deepseek_v3_1_llamacpp": ("enable_thinking", False),
    "seed_oss": ("enable_thinking", True),  # set as its thinking_budget
    "nemotron_h": ("enable_thinking", True),  # set as /think or /no_think in the system prompt
    "ministral3": (None, None),
    "r1_distill_qwen": (None, None),
    "llama3_1": (None, None),
    "kimi_k2": (None, None),
    "minimax_m2": (None, None),
    "granite4": (None, None),
    "lfm2_moe": (None, None),
    "lfm2": (None, None),
    "qwen2_5": (None, None),
}


def test_the_pages_thinking_switch_is_the_templates_own(family):
    from local_chat.ui.thinking import thinking_switch

    kind, model, _ = family
    assert thinking_switch(model.engine) == PAGE_SWITCH.get(kind.name, ("enable_thinking", True))


@pytest.fixture(scope="module", params=NAMES)
def flipped(request, tmp_path_factory):
    """Each family with its markers' kinds swapped (text_families.build's `flipped`)."""
    name = request.param
    folder = text_families.build(name, tmp_path_factory.mktemp(name) / "m", flipped=True)
    model = MetaModel.from_pretrained(str(folder))
    kind = text_families.FAMILIES[name]
    forced = tiny_models.ForcedAnswer(model.llma, model.tokenizer.hf, "x", kind.end)
    yield kind, model, forced
    forced.remove()


def test_the_markers_read_the_same_special_or_not(flipped):
    """Which of a family's markers the tokenizer marks special differs between uploads and conversions of one model:
    with them swapped, the reasoning and the answer still come apart, a call is still a call, and its tool result is
    answered (in process; the page and /v1 read the same events)."""
    kind, model, _ = flipped
    engine = ChatEngine(model.engine, "chat_template")
    thinking = ChatOptions(template_kwargs=kind.thinking) if kind.thinking else ChatOptions()
    force(flipped, kind.think(REASONING, ANSWER))
    answer = collect(engine.stream(Request(messages=[{"role": "user", "content": "Hi"}], chat=thinking)))
    reasoning = REASONING if "{r}" in kind.thought else ""
    assert (answer.text, answer.reasoning, answer.end.finish_reason) == (ANSWER, reasoning, "stop")
    assert not specials_in(flipped, answer.text, answer.reasoning)
    if kind.called is None:
        return
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    force(flipped, kind.call("get_weather", '{"city": "Paris"}'), kind.call_end)
    answer = collect(engine.stream(Request(messages=question, chat=ChatOptions(tools=[WEATHER]))))
    assert [(c.name, json.loads(c.arguments)) for c in answer.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert not answer.text.strip() and answer.end.finish_reason == "tool_calls"
    [call] = answer.tool_calls
    call = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    follow_up = question + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"weather": "sunny"}'},
    ]
    plain = kind.thinking is not None  # thinking is off (the template's default): the answer comes alone
    force(flipped, "It is sunny in Paris." if plain else kind.think("It is sunny.", "It is sunny in Paris."))
    answer = collect(engine.stream(Request(messages=follow_up, chat=ChatOptions(tools=[WEATHER]))))
    assert answer.text == "It is sunny in Paris." and answer.end.error is None


def test_a_template_with_a_familys_markers_but_no_family_is_named_in_the_terminal(tmp_path, caplog):
    """Qwen2.5's template (`<tool_call>`) on a Llama: no entry takes it, and the terminal names the closest and why."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from local_chat.prompting.families import PLAIN, chat_format

    folder = text_families.build("qwen2_5", tmp_path / "m")
    config = LlamaConfig(
        **{k: v for k, v in text_families._sizes(MetaModel.from_pretrained(str(folder)).tokenizer.hf).items()}
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    model = MetaModel.from_pretrained(str(folder))
    with caplog.at_level("WARNING", logger="local_chat.prompting.families"):
        assert chat_format(model.engine.chat_renderer, "llama") is PLAIN
    [record] = [r.getMessage() for r in caplog.records if "matches no known family" in r.getMessage()]
    assert record.startswith("The chat template holds '<tool_call>' but matches no known family: the closest, 'qwen")
    assert "its model type is 'llama'" in record
