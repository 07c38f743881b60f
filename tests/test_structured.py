"""Structured answers: `response_format` holds an answer to a JSON schema (or to any JSON object) token by token
(model/constraints.py, by llguidance). Random weights write garbage unless the mask holds, so every answer of a tiny
random model of three families, sampled at temperature 1 under 20 seeds, must validate; and the demo model's, through
the official `openai` client, including its `parse()` of a Pydantic model."""

import json
import math
import threading

import jsonschema
import pytest
from openai import BadRequestError, OpenAI
from pydantic import BaseModel, Field

from bench.families import ForcedAnswer
from fixtures import text_families, tiny_models
from fixtures.app_server import serve
from local_chat.defaults import DEMO_MODEL
from local_chat.engine import AnswerFormat, ChatOptions, End, Request, Sampling, collect
from local_chat.engine.chats import ChatEngine
from local_chat.engine.openai_wire import request_fields
from local_chat.model.constraints import MAX_GRAMMARS
from local_chat.model.meta import MetaModel

# every string, number and array bounded, so that the longest valid answer fits in ANSWER_TOKENS
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "height": {"type": "number", "minimum": 0, "maximum": 3},
        "pets": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "admin": {"type": "boolean"},
    },
    "required": ["name", "age", "pets", "kind", "admin"],
    "additionalProperties": False,
}
ANSWER_TOKENS = 400  # above the longest valid answer, byte by byte with every character escaped
SEEDS = range(20)


@pytest.fixture(scope="module", params=["demo", "llama3_1", "qwen3", "gpt_oss"])
def model(request, tmp_path_factory):
    """The demo model, and random ones of three families with their real classes, tokenizers and templates."""
    folder = tmp_path_factory.mktemp(request.param) / "m"
    if request.param == "demo":
        return MetaModel.from_pretrained(str(DEMO_MODEL))
    if request.param == "qwen3":
        return MetaModel.from_pretrained(str(tiny_models.save_tiny_qwen3(folder)))
    return MetaModel.from_pretrained(str(text_families.build(request.param, folder)))


def person(engine, seed: int, logprobs: int | None = None, temperature: float = 1.0):
    asked = Request(
        "Describe a person as JSON.",
        Sampling(ANSWER_TOKENS, temperature=temperature, top_p=1.0, seed=seed),
        logprobs=logprobs,
        answer_format=AnswerFormat("json_schema", PERSON),
    )
    events = list(engine.stream(asked))
    return collect(iter(events)), events


def test_twenty_seeds_at_temperature_1_all_validate_and_differ(model):
    answers = []
    for seed in SEEDS:
        answer, events = person(model.engine, seed, logprobs=0)
        assert answer.end.finish_reason == "stop", answer.end.error
        jsonschema.validate(json.loads(answer.text), PERSON)
        answers.append(answer.text)
        # each token has a finite log-probability under the masked distribution
        logprobs = [lp.logprob for event in events if not isinstance(event, End) for lp in event.logprobs]
        assert logprobs and all(math.isfinite(lp) for lp in logprobs)
    assert len(set(answers)) > 1, answers


def test_without_the_format_the_random_models_answer_is_not_that_json(model):
    """What makes the test above mean something: the same sampling without the mask writes no such JSON."""
    if model.llma.config.model_type == "llava":
        pytest.skip("the demo model is trained: it answers in sentences")
    free = collect(model.engine.stream(Request("Describe a person as JSON.", Sampling(60, temperature=1.0, seed=0))))
    with pytest.raises((ValueError, jsonschema.ValidationError)):
        jsonschema.validate(json.loads(free.text), PERSON)


def test_a_batch_holds_each_row_to_its_own_format_and_leaves_free_rows_as_alone(model):
    """`Engine.complete` (the command line's --batch_size, Accessory's `generate`): a mask per row."""
    small = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3}
    formats = [AnswerFormat("json_schema", small), None, AnswerFormat("json_schema", {"enum": ["yes", "no"]}), None]
    greedy = Sampling(24, temperature=0.0)
    requests = [Request(f"Question {i}:", greedy, answer_format=f) for i, f in enumerate(formats)]
    answers = model.engine.complete(requests)
    jsonschema.validate(json.loads(answers[0].text), small)
    assert json.loads(answers[2].text) in ("yes", "no")
    for i in (1, 3):
        assert answers[i].text == collect(model.engine.stream(requests[i])).text


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL))


def test_eight_requests_at_once_with_different_schemas_and_none(demo):
    """Four held to a schema (one also asking for log-probabilities), two free asking for log-probabilities, two
    free: the held ones and those asking for log-probabilities in the step batch, the others in transformers'
    continuous batch beside it; each valid, and each the answer (and log-probabilities) it gets alone."""
    demo.engine.start_batching(8)
    try:
        schemas = [{**PERSON, "required": [key]} for key in ("name", "age", "pets", "kind")]
        formats = [AnswerFormat("json_schema", s) for s in schemas] + [None] * 4
        logprobs = [2, None, None, None, 2, 0, None, None]
        requests = [
            Request(
                f"Tell me about person {i}.", Sampling(ANSWER_TOKENS, temperature=0.0), answer_format=f, logprobs=n
            )  # fmt: skip
            for i, (f, n) in enumerate(zip(formats, logprobs))
        ]
        alone = [with_logprobs(demo.engine, r) for r in requests]
        stepped = demo.engine.batcher.stepped.answers
        together: list = [None] * 8

        def answer(i: int) -> None:
            together[i] = with_logprobs(demo.engine, requests[i])

        threads = [threading.Thread(target=answer, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert demo.engine.batcher.stepped.answers - stepped >= 5  # the first may begin alone: it joins
    finally:
        demo.engine.stop_batching()
    for i, schema in enumerate(schemas):
        jsonschema.validate(json.loads(together[i][0].text), schema)
    assert [a.text for a, _ in together] == [a.text for a, _ in alone]
    for i, count in enumerate(logprobs):
        (_, batched), (_, single) = together[i], alone[i]
        assert len(batched) == (0 if count is None else together[i][0].end.completion_tokens)
        assert [(lp.token_id, [t for t, _ in lp.top]) for lp in batched] == [
            (lp.token_id, [t for t, _ in lp.top]) for lp in single
        ]
        assert [lp.logprob for lp in batched] == pytest.approx([lp.logprob for lp in single], abs=1e-3)


def with_logprobs(engine, request: Request) -> tuple:
    """The answer to `request`, and the log-probabilities its pieces carried."""
    events = list(engine.stream(request))
    return collect(iter(events)), [lp for event in events if not isinstance(event, End) for lp in event.logprobs]


def test_stop_ends_a_constrained_answer_within_two_steps(demo):
    cancel = threading.Event()
    calls, original = [0], demo.llma.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    demo.llma.forward = counted
    try:
        asked = Request(
            "Describe a person.",
            Sampling(ANSWER_TOKENS, temperature=1.0, seed=3),
            cancel=cancel,
            answer_format=AnswerFormat("json_schema", {"type": "array", "items": {"type": "integer"}}),
        )
        stream = demo.engine.stream(asked)
        for _ in range(5):
            next(stream)
        cancel.set()
        at_cancel = calls[0]
        end = [event for event in stream if isinstance(event, End)][0]
    finally:
        del demo.llma.forward
    assert end.finish_reason == "cancelled" and calls[0] - at_cancel <= 2


def test_a_tokenizer_llguidance_cannot_read_is_one_sentence(checkpoints):
    accessory = MetaModel.from_pretrained(str(checkpoints["accessory"]))
    [end] = list(accessory.engine.stream(Request("Hi", answer_format=AnswerFormat("json_object"))))
    assert end.caller_error and "sentencepiece" in end.error and "response_format" in end.error


def test_a_schema_llguidance_cannot_hold_is_refused_naming_why(demo):
    lookahead = {"type": "string", "pattern": "(?=a)b"}
    [end] = list(demo.engine.stream(Request("Hi", answer_format=AnswerFormat("json_schema", lookahead))))
    assert end.caller_error and end.error.startswith("The response_format's schema cannot be enforced:")


def test_compiled_grammars_are_kept_for_the_last_64_schemas(demo):
    grammars = demo.engine.grammars
    for i in range(MAX_GRAMMARS + 3):
        grammars.matcher(AnswerFormat("json_schema", {"type": "integer", "maximum": i}))
    kept = grammars._compiled
    assert len(kept) == MAX_GRAMMARS and AnswerFormat("json_schema", {"type": "integer", "maximum": 2}).key not in kept


def test_chat_messages_are_held_to_the_format_after_the_template(demo):
    asked = Request(
        messages=[{"role": "user", "content": "Who are you?"}],
        sampling=Sampling(ANSWER_TOKENS, temperature=1.0, seed=1),
        chat=ChatOptions(template="default"),
        answer_format=AnswerFormat("json_schema", PERSON),
    )
    answer = collect(ChatEngine(demo.engine, "default").stream(asked))
    jsonschema.validate(json.loads(answer.text), PERSON)


def test_another_engine_gets_the_format_as_openai_sends_it():
    schema = AnswerFormat("json_schema", PERSON, "person")
    fields, _ = request_fields(Request(messages=[], answer_format=schema), chat=True, context=4096)
    assert fields["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    fields, _ = request_fields(Request("Hi", answer_format=AnswerFormat("json_object")), chat=False, context=4096)
    assert fields["extra_body"]["response_format"] == {"type": "json_object"}


# ----- through /v1, with the official client -----


class Pet(BaseModel):
    name: str = Field(max_length=8)
    legs: int = Field(ge=0, le=8)


class Household(BaseModel):
    city: str = Field(max_length=8)
    pets: list[Pet] = Field(max_length=2)


@pytest.fixture(scope="module")
def client(demo):
    with serve(demo) as (url, _):
        yield OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_parse_returns_the_pydantic_object(client):
    """`parse()` sends the model's schema with its $defs and $ref, strict; the answer comes back as the object."""
    for seed in range(3):
        parsed = client.chat.completions.parse(
            model="m",
            messages=[{"role": "user", "content": "Describe a household."}],
            response_format=Household,
            temperature=1.0,
            seed=seed,
            max_tokens=ANSWER_TOKENS,
        )
        assert isinstance(parsed.choices[0].message.parsed, Household)


def test_json_schema_and_json_object_streamed_and_on_completions(client):
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    chunks = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Who are you?"}],
        response_format=schema,
        stream=True,
        temperature=1.0,
        seed=4,
        max_tokens=ANSWER_TOKENS,
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)
    completion = client.completions.create(
        model="m",
        prompt="A person:",
        extra_body={"response_format": {"type": "json_object"}},
        temperature=0.0,
        max_tokens=60,
    )
    assert completion.choices[0].text.startswith("{")


@pytest.mark.parametrize("family", ["qwen2_5", "llama3_1"])
def test_a_model_that_does_not_reason_is_held_to_the_schema_from_its_first_token(family, tmp_path):
    """Qwen2.5's template (and tokenizer) show no reasoning, nor do Llama 3.1's: the answer is JSON in `content` from
    its first token, and never filed as reasoning, under 20 seeds at temperature 1 through /v1 (strict schema)."""
    model = MetaModel.from_pretrained(str(text_families.build(family, tmp_path / "m")))
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    with serve(model) as (url, _):
        api = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for seed in SEEDS:
            message = (
                api.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "Describe a person as JSON."}],
                    response_format=schema,
                    temperature=1.0,
                    seed=seed,
                    max_tokens=ANSWER_TOKENS,
                )
                .choices[0]
                .message
            )
            assert not (message.model_extra or {}).get("reasoning_content"), message
            jsonschema.validate(json.loads(message.content), PERSON)


def test_a_bad_response_format_is_a_400_sentence(client):
    cases = [
        ({"type": "xml"}, 'send {"type": "json_schema"'),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "the schema a JSON object"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(?=a)b"}}}, "cannot be"),
    ]
    for response_format, said in cases:
        with pytest.raises(BadRequestError) as refused:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Hi"}], response_format=response_format
            )
        assert said in refused.value.body["message"], refused.value.body


def test_the_command_line_holds_every_record_to_the_schema_file(tmp_path, capsys):
    from local_chat.launchers import generate

    (tmp_path / "person.json").write_text(json.dumps(PERSON))
    output = tmp_path / "out.jsonl"
    questions = ["Who are you?", "What is the capital of France?", "What is 2 plus 3?"]
    flags = ["--json_schema", str(tmp_path / "person.json"), "--temperature", "1", "--seed", "5", "--batch_size", "2"]
    generate.main(["--prompts", *questions, "--max_new_tokens", str(ANSWER_TOKENS), "--output", str(output), *flags])
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["prompt"] for r in records] == questions
    for record in records:
        jsonschema.validate(json.loads(record["response"]), PERSON)
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(SystemExit):
        generate.main(["--prompts", "Hi", "--json_schema", str(tmp_path / "bad.json")])
    assert "is not JSON" in capsys.readouterr().err


# ----- tool_choice: a call required, in the family's own format -----

CITY = {"type": "string", "maxLength": 8}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": CITY, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    },
    {
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
    },
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module", params=["qwen3", "llama3_1", "gpt_oss"])
def caller(request, tmp_path_factory):
    """A random model of a family whose call format has a grammar (Qwen3's real class and template, too)."""
    folder = tmp_path_factory.mktemp(request.param) / "m"
    if request.param == "qwen3":
        return MetaModel.from_pretrained(str(tiny_models.save_tiny_qwen3(folder)))
    return MetaModel.from_pretrained(str(text_families.build(request.param, folder)))


NO_THINKING = {"enable_thinking": False}  # a random model that may reason rambles on: Qwen3's calls come at once


def required_call(model, seed: int, only: str | None = None):
    asked = Request(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        sampling=Sampling(ANSWER_TOKENS, temperature=1.0, seed=seed),
        chat=ChatOptions(tools=TOOLS, tool_choice="required", tool_name=only, template_kwargs=NO_THINKING),
    )
    return collect(ChatEngine(model.engine, "chat_template").stream(asked))


def test_a_required_call_is_one_call_of_an_allowed_tool_parsed_as_tool_calls(caller):
    names = set()
    for seed in range(10):
        answer = required_call(caller, seed)
        assert answer.end.error is None and len(answer.tool_calls) == 1, (answer.text, answer.end)
        [call] = answer.tool_calls
        jsonschema.validate(json.loads(call.arguments), PARAMETERS[call.name])
        names.add(call.name)
    assert names <= set(PARAMETERS)
    for seed in range(3):
        [call] = required_call(caller, seed, only="get_time").tool_calls
        assert call.name == "get_time" and json.loads(call.arguments)["zone"] in ("UTC", "CET")


def test_a_model_without_a_call_format_cannot_be_required_to_call(byte_model):
    """A ChatML template on a Llama: tools rendered, but no call format known, so no grammar for a call."""
    asked = Request(
        messages=[{"role": "user", "content": "Hi"}],
        chat=ChatOptions(tools=TOOLS, tool_choice="required"),
    )
    [end] = list(ChatEngine(byte_model.engine, "chat_template").stream(asked))
    assert end.caller_error and "cannot be required" in end.error


def test_tool_choice_through_v1_with_the_openai_client(tmp_path_factory, client):
    qwen = MetaModel.from_pretrained(str(tiny_models.save_tiny_qwen3(tmp_path_factory.mktemp("q") / "q")))
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    with serve(qwen) as (url, _):
        api = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        named = {"type": "function", "function": {"name": "get_weather"}}
        reply = api.chat.completions.create(
            model="m",
            messages=question,
            tools=TOOLS,
            tool_choice=named,
            temperature=1.0,
            seed=2,
            max_tokens=300,
            extra_body={"chat_template_kwargs": NO_THINKING},
        )
    [call] = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS["get_weather"])
    refusals = [
        (dict(tool_choice="required"), "has no `tools`"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "fly"}}), "not among the `tools`"),
    ]
    for fields, said in refusals:
        with pytest.raises(BadRequestError) as refused:
            client.chat.completions.create(model="m", messages=question, **fields)
        assert said in refused.value.body["message"], refused.value.body


# ----- a reasoning model reasons first: the format holds from the end of its reasoning -----

SMALL = {
    "type": "object",
    "properties": {"n": {"type": "string", "maxLength": 6}, "k": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n", "k"],
    "additionalProperties": False,
}


def forced_chat(model, family: str, written: str, chat: ChatOptions, answer_format=None):
    """The answer to a chat question of a family's random model made to write `written` (as a trained one would)
    wherever the mask lets it; each token the mask refuses is the model's own choice among those it allows."""
    end = "<|im_end|>" if family == "qwen3" else text_families.FAMILIES[family].end
    forced = ForcedAnswer(model.llma, model.engine.tokenizer.hf, written, end)
    asked = Request(
        messages=[{"role": "user", "content": "Who?"}],
        sampling=Sampling(ANSWER_TOKENS, temperature=0.0),
        chat=chat,
        answer_format=answer_format,
    )
    try:
        return collect(ChatEngine(model.engine, "chat_template").stream(asked))
    finally:
        forced.remove()


REASONERS = ["smollm3", "gpt_oss", "ministral3", "r1_distill_qwen", "qwen3_5"]
REASONERS += ["glm4_moe", "glm4_moe_lite", "minimax_m2", "seed_oss", "lfm2_moe", "nemotron_h"]


@pytest.fixture(scope="module", params=REASONERS)
def reasoner(request, tmp_path_factory):
    folder = text_families.build(request.param, tmp_path_factory.mktemp(request.param) / "m")
    return request.param, MetaModel.from_pretrained(str(folder))


def test_the_schema_holds_from_where_the_reasoning_ends(reasoner):
    family, model = reasoner
    written = text_families.FAMILIES[family].think("I reason.", "Not JSON, but prose.")
    answer = forced_chat(model, family, written, ChatOptions(), AnswerFormat("json_schema", SMALL))
    assert answer.end.error is None and answer.reasoning == "I reason.", (answer.reasoning, answer.text)
    jsonschema.validate(json.loads(answer.text), SMALL)
    valid = '{"n":"Al","k":3}'  # what a trained model writes after its reasoning passes as it is
    written = text_families.FAMILIES[family].think("I reason.", valid)
    assert forced_chat(model, family, written, ChatOptions(), AnswerFormat("json_schema", SMALL)).text == valid


@pytest.mark.parametrize("family", ["qwen3", "gemma4_text"])
def test_with_thinking_off_the_schema_holds_from_the_first_token(family, tmp_path):
    """Qwen3's template closes the reasoning when enable_thinking is false; Gemma 4's unless it is true."""
    folder = tmp_path / "m"
    build = tiny_models.save_tiny_qwen3 if family == "qwen3" else lambda f: text_families.build(family, f)
    model = MetaModel.from_pretrained(str(build(folder)))
    think = {"qwen3": "<think>\n{r}\n</think>\n\n{a}", "gemma4_text": text_families.FAMILIES["gemma4_text"].thought}
    written = think[family].replace("{r}", "I reason.").replace("{a}", "Prose.")
    off = ChatOptions(template_kwargs={"enable_thinking": False})
    answer = forced_chat(model, family, written, off, AnswerFormat("json_schema", SMALL))
    assert answer.reasoning == "" and answer.end.error is None
    jsonschema.validate(json.loads(answer.text), SMALL)
    on = ChatOptions(template_kwargs={"enable_thinking": True})
    answer = forced_chat(model, family, written, on, AnswerFormat("json_schema", SMALL))
    assert answer.reasoning == "I reason.", answer
    jsonschema.validate(json.loads(answer.text), SMALL)


@pytest.mark.parametrize("family", ["smollm3", "gpt_oss", "ministral3"])
def test_a_required_call_may_follow_the_reasoning(family, tmp_path):
    model = MetaModel.from_pretrained(str(text_families.build(family, tmp_path / "m")))
    written = text_families.FAMILIES[family].call("get_time", '{"zone": "UTC"}')
    answer = forced_chat(model, family, written, ChatOptions(tools=TOOLS, tool_choice="required"))
    [call] = answer.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get_time", {"zone": "UTC"}) and answer.text == ""
    assert answer.reasoning == ("" if family == "ministral3" else "I call it.")
