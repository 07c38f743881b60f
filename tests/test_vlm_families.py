"""Real checkpoints of the popular vision-language families: each a tiny random model of its real transformers class,
saved with its real processor class and published chat template (fixtures/vlm_families.py), answers as the model's
own processor and `generate` say it should."""

import json
import pickle
import struct
import subprocess
import sys
import threading
import time

import pytest
import torch
from PIL import Image
from transformers import DynamicCache

from fixtures import vlm_families
from fixtures.app_server import ForwardCounter, launched, serve
from local_chat.engine.process import model_facts
from local_chat.errors import UserError
from local_chat.model.generation import prefill
from local_chat.model.meta import MetaModel
from local_chat.prompting import chat_prompt, default_template, png_bytes, png_data_url

SYSTEM = "Be brief."
FIRST, SECOND = "What is in the image?", "And what colour is it?"


WITH_TEMPLATE = [f for f in vlm_families.FAMILIES if f != "paligemma"]


def picture(color) -> Image.Image:
    """A coloured square on a light, wide canvas (not square: processors that tile or resize dynamically must)."""
    image = Image.new("RGB", (56, 40), (235, 235, 235))
    image.paste(color, (10, 6, 38, 34))
    return image


RED, BLUE = picture((220, 20, 20)), picture((20, 40, 220))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {}


@pytest.fixture(scope="module")
def family(request, folders, tmp_path_factory):
    """(name, folder, loaded MetaModel) of the family named by the test's parameter."""
    name = request.param
    if name not in folders:
        folders[name] = vlm_families.build(name, tmp_path_factory.mktemp(name) / name)
    return name, folders[name], MetaModel.from_pretrained(str(folders[name]), max_seq_len=1024)


def parts(text: str, images=()) -> list[dict]:
    return [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": text}]


# the roles whose content a family's template reads as a string only (it prints typed parts as Python text)
STRING_ROLES = {"glm4v": ("system", "assistant"), "gemma4": ("system",)}


def reference_messages(first_answer: str, image=RED, name: str = "") -> list[dict]:
    """The conversation a user of transformers would write for the app's two turns."""
    text = STRING_ROLES.get(name, ())
    return [
        {"role": "system", "content": SYSTEM if "system" in text else parts(SYSTEM)},
        {"role": "user", "content": parts(FIRST, [image])},
        {"role": "assistant", "content": first_answer if "assistant" in text else parts(first_answer)},
        {"role": "user", "content": parts(SECOND)},
    ]


def two_turns(model: MetaModel, image=RED, tokens: int = 6):
    """The app's two turns about `image` (the second from the session's cache): (second prompt, last pieces)."""
    template = default_template(model.engine)
    first = chat_prompt(model.engine, template, SYSTEM, [], FIRST, tokens, image)
    one = list(
        model.stream_generate(
            first.text,
            image=first.images,
            max_gen_len=tokens,
            additional_stop_symbols=first.stop_symbols,
            session="tab",
        )
    )[-1]
    history = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": one["text"]}]
    second = chat_prompt(model.engine, template, SYSTEM, history, SECOND, tokens, image)
    two = list(
        model.stream_generate(
            second.text,
            image=second.images,
            max_gen_len=tokens,
            additional_stop_symbols=second.stop_symbols,
            session="tab",
        )
    )[-1]
    return second, one, two


@pytest.mark.parametrize("family", WITH_TEMPLATE, indirect=True)
def test_the_prompt_and_its_ids_are_the_processors_own(family):
    name, _, model = family
    assert default_template(model.engine) == "chat_template"
    second, one, _ = two_turns(model)
    messages = reference_messages(one["text"], name=name)
    assert second.text == model.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = model.processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    ours = model.engine.encoder.prepare_inputs([second.text], [second.images])
    assert ours.input_ids[0].tolist() == expected["input_ids"][0].tolist()  # image tokens, BOS once, markers
    image_id = model.engine.sessions.image_token_id
    assert (ours.input_ids == image_id).sum() == (expected["input_ids"] == image_id).sum() > 0


@pytest.mark.parametrize("family", WITH_TEMPLATE, indirect=True)
def test_two_turns_with_an_image_are_the_tokens_generate_gives(family):
    """The second turn runs from the session's cache; its greedy tokens are those of transformers' own `generate`
    on the processor's inputs for the same conversation."""
    name, _, model = family
    _, one, two = two_turns(model)
    assert two["cached_tokens"] > 0
    expected = model.processor.apply_chat_template(
        reference_messages(one["text"], name=name),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    expected = {k: v for k, v in expected.items() if k != "labels"}
    generated = model.llma.generate(**expected, max_new_tokens=len(two["token_ids"]), do_sample=False)
    assert two["token_ids"] == generated[0, expected["input_ids"].shape[1] :].tolist()[: len(two["token_ids"])]


@pytest.mark.parametrize("family", vlm_families.FAMILIES, indirect=True)
def test_two_images_give_two_first_steps(family):
    name, _, model = family
    logits = []
    for image in (RED, BLUE):
        prompt = chat_prompt(model.engine, default_template(model.engine), None, [], FIRST, 0, image).text
        with torch.inference_mode():
            logits.append(prefill(model.llma, model.engine.encoder.prepare_inputs([prompt], [[image]]), DynamicCache()))
    assert not torch.allclose(logits[0], logits[1])


def test_paligemma_gets_its_processors_own_prompt_format(tmp_path):
    """No chat template: the processor lays out the image tokens, BOS and the closing newline itself."""
    model = MetaModel.from_pretrained(str(vlm_families.build("paligemma", tmp_path / "paligemma")))
    assert default_template(model.engine) == "default"
    inputs = model.engine.encoder.prepare_inputs(["What is in the image?"], [RED])
    processor = model.processor
    expected = processor(text="What is in the image?", images=RED, return_tensors="pt")
    assert inputs.input_ids[0].tolist() == expected["input_ids"][0].tolist()
    assert "labels" not in inputs.extra and "token_type_ids" in inputs.extra
    pieces = list(model.stream_generate("What is in the image?", image=RED, max_gen_len=4, session="s"))
    again = list(model.stream_generate("What is in the image? Tell me.", image=RED, max_gen_len=4, session="s"))
    assert pieces[-1]["completion_tokens"] == 4 and again[-1]["cached_tokens"] == 0  # its prompt attends both ways
    with pytest.raises(UserError, match="This model takes one image per conversation, and this one has 2; start a new"):
        model.generate(["Compare them."], images=[[RED, BLUE]])


@pytest.mark.parametrize("family", WITH_TEMPLATE, indirect=True)
def test_the_end_of_turn_token_ends_the_answer_and_never_shows(family, monkeypatch):
    """Forced after 3 tokens (its logit raised), the template's end-of-turn token, or EOS where the template has
    none, ends the answer as "stop", with or without generation_config.json."""
    name, folder, _ = family
    (folder / "generation_config.json").unlink(missing_ok=True)
    model = MetaModel.from_pretrained(str(folder), max_seq_len=1024, speculative="off")  # a token a forward pass
    chat = chat_prompt(model.engine, "chat_template", SYSTEM, [], FIRST, 8, RED)
    end = chat.stop_symbols[0]
    end_id = model.tokenizer.special_token_id(end)
    if end_id is None:  # a text marker ("USER:"): LLaVA's answers end with EOS
        end, end_id = model.tokenizer.hf.eos_token, model.tokenizer.eos_id
    calls = []

    def force_end(module, args, kwargs, output):
        calls.append(1)
        if len(calls) > 3:
            output.logits[..., end_id] = 1e4
        return output

    model.llma.register_forward_hook(force_end, with_kwargs=True)
    last = list(
        model.stream_generate(chat.text, image=chat.images, max_gen_len=20, additional_stop_symbols=chat.stop_symbols)
    )[-1]
    assert last["finish_reason"] == "stop" and last["completion_tokens"] == 3
    assert end not in last["text"] and end_id not in last["token_ids"]


def test_phi3_stops_at_end_without_generation_config(tmp_path):
    """Phi-3's template writes EOS after the last message only when no answer is asked for: the stop is "<|end|>"."""
    from transformers import Phi3Config, Phi3ForCausalLM

    tok = vlm_families.family_tokenizer(
        ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], "<s>", "<|endoftext|>", "<|endoftext|>"
    )
    tok.chat_template = vlm_families.template("phi3")
    torch.manual_seed(0)
    config = Phi3Config(**vlm_families.text_config(tok, max_position_embeddings=512, pad_token_id=0))
    Phi3ForCausalLM(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    model = MetaModel.from_pretrained(str(tmp_path))
    chat = chat_prompt(model.engine, default_template(model.engine), None, [], "Hi", 8)
    assert chat.stop_symbols == ["<|end|>"]
    assert model.tokenizer.special_token_id("<|end|>") in model.engine.eos_ids(chat.stop_symbols)


def test_a_chat_template_only_in_chat_template_json_is_used(tmp_path):
    folder = vlm_families.build("llava", tmp_path / "llava", template_in="legacy_json")
    assert not (folder / "chat_template.jinja").exists() and (folder / "chat_template.json").exists()
    model = MetaModel.from_pretrained(str(folder))
    assert default_template(model.engine) == "chat_template"
    assert chat_prompt(model.engine, "chat_template", None, [], "Hi", 0).text == "USER: Hi ASSISTANT:"


def test_a_chat_template_that_fails_is_one_sentence_at_start_up(tmp_path):
    folder = vlm_families.build("llava", tmp_path / "llava", template_in="processor")
    (folder / "chat_template.jinja").write_text("{{ raise_exception('Only user roles, please') }}")
    model = MetaModel.from_pretrained(str(folder))
    with pytest.raises(
        UserError,
        match=r"This model's chat template fails: .*Only user roles, please; pass "
        r"--template NAME \(one of default, ",
    ):
        default_template(model.engine)


@pytest.mark.skipif(
    vlm_families.torchvision_loads(), reason="torchvision loads here: Llama 4's processor needs no sentence"
)
def test_an_image_processor_that_needs_torchvision_is_one_sentence(tmp_path):
    folder = vlm_families.save_llama4_files(tmp_path / "llama4")
    with pytest.raises(
        UserError,
        match=r"llama4 model, whose processor needs torchvision, which is not installed "
        r"or does not load beside torch",
    ):
        MetaModel.from_pretrained(str(folder))


@pytest.mark.skipif(vlm_families.torchvision_loads(), reason="torchvision loads here: the video processor loads too")
@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen_vl_loads_without_its_video_processor_where_torchvision_is_missing(name, tmp_path):
    """Its folder describes a video processor, which needs torchvision; image chat does not: its own processor class
    loads without that part."""
    import transformers

    folder = vlm_families.build(name, tmp_path / name)
    assert "video_processor" in json.loads((folder / "processor_config.json").read_text())
    model = MetaModel.from_pretrained(str(folder))
    real_class = {"qwen2_vl": transformers.Qwen2VLProcessor, "qwen2_5_vl": transformers.Qwen2_5_VLProcessor}[name]
    assert isinstance(model.processor, real_class)
    assert model.processor.get_attributes() == ["image_processor", "tokenizer"]


def two_turns_with_an_image(client, image_path) -> None:
    """Two /chat turns about the image at `image_path`, through gradio_client: each a text answer."""
    from gradio_client import handle_file

    first = client.predict(
        message=FIRST, history=[], image=handle_file(str(image_path)), max_gen_len=6, api_name="/chat"
    )
    history = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": first}]
    second = client.predict(
        message=SECOND, history=history, image=handle_file(str(image_path)), max_gen_len=6, api_name="/chat"
    )
    assert isinstance(first, str) and isinstance(second, str)


UNPICKLING = """
import pickle, struct, sys
while header := sys.stdin.buffer.read(4):
    data = sys.stdin.buffer.read(struct.unpack(">I", header)[0])
    try:
        said = str(type(pickle.loads(data)["chat_renderer"]))
    except Exception as error:
        said = "failed: " + repr(error)
    print(said.replace("\\n", " "), flush=True)
"""


@pytest.fixture(scope="module")
def server_interpreter():
    """Another interpreter, which never ran this module, as the launchers' spawned web server is: it unpickles what
    it is sent (a model's facts) and says the type of the chat renderer, or why it failed. One for the module: the
    families do not each pay for starting Python and importing transformers."""
    process = subprocess.Popen(
        [sys.executable, "-c", UNPICKLING], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )

    def unpickled(data: bytes) -> str:
        process.stdin.write(struct.pack(">I", len(data)) + data)
        process.stdin.flush()
        return process.stdout.readline().decode().strip() or "failed: " + process.stderr.read().decode()[-2000:]

    yield unpickled
    process.stdin.close()
    process.wait(timeout=30)


@pytest.mark.parametrize("family", vlm_families.FAMILIES, indirect=True)
def test_the_app_answers_two_turns_with_an_image(family, tmp_path, server_interpreter):
    """The page's /chat over each family's model, served in this process; what the web server's own process gets
    of the model (its processor, made here for some families) unpickles in another interpreter, as the launchers'
    spawned server does. (`test_a_vision_checkpoint_launched_as_a_user_starts_it` runs the two processes.)"""
    from gradio_client import Client

    name, _, model = family
    RED.save(tmp_path / "red.png")
    with serve(model) as (url, _):
        two_turns_with_an_image(Client(url, verbose=False), tmp_path / "red.png")
    said = server_interpreter(pickle.dumps(model_facts(model.engine)))
    assert said.startswith("<class ") and not said.startswith("failed"), said


def test_a_vision_checkpoint_launched_as_a_user_starts_it(tmp_path):
    """`python app.py --pretrained_path DIR` on a family whose processor class is made here (Mistral 3's Pixtral
    stand-in), through gradio_client."""
    folder = vlm_families.build("mistral3", tmp_path / "mistral3")
    RED.save(tmp_path / "red.png")
    app, client = launched("--pretrained_path", str(folder), "--max_seq_len", "1024")
    try:
        two_turns_with_an_image(client, tmp_path / "red.png")
    finally:
        app.terminate()
        app.wait(timeout=30)


@pytest.mark.parametrize("family", ["idefics3", "mllama", "llava"], indirect=True)
def test_several_images_each_in_the_turn_it_was_given(family):
    """A conversation's images go to the model in order, each marker in its own turn, as the processor renders it."""
    from local_chat.templates.multi_turn import get_conversation

    name, _, model = family
    conv = get_conversation("chat_template", model.engine.chat_renderer, SYSTEM, takes_media=True)
    conv.load_qas([[(FIRST, [RED]), "A red square."], [(SECOND, [BLUE]), None]])
    prompt = conv.get_prompt()
    messages = [
        {"role": "system", "content": parts(SYSTEM)},
        {"role": "user", "content": parts(FIRST, [RED])},
        {"role": "assistant", "content": parts("A red square.")},
        {"role": "user", "content": parts(SECOND, [BLUE])},
    ]
    expected = model.processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    ours = model.engine.encoder.prepare_inputs([prompt], [[RED, BLUE]])
    assert ours.input_ids[0].tolist() == expected["input_ids"][0].tolist()
    last = list(model.stream_generate(prompt, image=[RED, BLUE], max_gen_len=4))[-1]
    assert last["completion_tokens"] >= 1


def data_url(image) -> str:
    return png_data_url(png_bytes(image))


@pytest.mark.parametrize("family", ["idefics3"], indirect=True)
def test_history_images_as_data_urls_go_in_their_own_turns(family):
    """/chat's history may carry an image in any user turn (OpenAI-style parts); an http URL is one sentence."""
    name, _, model = family
    history = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": data_url(RED)}}, {"type": "text", "text": FIRST}],
        },
        {"role": "assistant", "content": "A red square."},
    ]
    chat = chat_prompt(model.engine, "chat_template", SYSTEM, history, SECOND, 0, BLUE)
    assert len(chat.images) == 2 and chat.text.count("<image>") == 2
    assert chat.images[0].getpixel((28, 20)) == BLUE.getpixel((28, 20))  # the conversation's image leads
    assert chat.images[1].getpixel((28, 20)) == RED.getpixel((28, 20))
    assert list(model.stream_generate(chat.text, image=chat.images, max_gen_len=3))[-1]["completion_tokens"] >= 1
    history[0]["content"][0]["image_url"]["url"] = "http://127.0.0.1:9/cat.png"
    with pytest.raises(UserError, match="send images as data: URLs .*never fetches outside addresses"):
        chat_prompt(model.engine, "chat_template", SYSTEM, history, SECOND, 0)


def start_up_failure(folder) -> str:
    """What `python app.py --pretrained_path folder` prints when it refuses to start (exit code 1)."""
    import subprocess
    import sys

    from fixtures.app_server import ENV, ROOT

    result = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "--pretrained_path", str(folder)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def test_the_launcher_refuses_a_failing_chat_template_in_one_sentence(tmp_path):
    folder = vlm_families.build("llava", tmp_path / "llava", template_in="processor")
    (folder / "chat_template.jinja").write_text("{{ raise_exception('Only user roles, please') }}")
    assert "error: This model's chat template fails: " in start_up_failure(folder)


@pytest.mark.skipif(
    vlm_families.torchvision_loads(), reason="torchvision loads here: Llama 4's processor needs no sentence"
)
def test_the_launcher_refuses_an_image_processor_that_needs_torchvision_in_one_sentence(tmp_path):
    assert "whose processor needs torchvision" in start_up_failure(vlm_families.save_llama4_files(tmp_path / "l4"))


@pytest.mark.parametrize("family", ["mllama"], indirect=True)
def test_mllama_second_turn_whose_prompt_changed_under_its_cache_answers(family):
    """A session's second turn whose prompt changes before the image (a system prompt added) runs the image again:
    its cross-attention keys and values are made afresh, not added to the first turn's. Where the prompt keeps the
    cached image, the cache is reused. Either way the answer is the one from scratch."""
    from local_chat.engine import Request, Sampling, collect
    from local_chat.engine.chats import ChatEngine

    _, _, model = family
    engine = ChatEngine(model.engine, "chat_template")
    question = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(RED)}},
                                            {"type": "text", "text": FIRST}]}  # fmt: skip
    sampling = Sampling(temperature=0, max_new_tokens=6)

    def answer(messages, session):
        return collect(engine.stream(Request(messages=messages, sampling=sampling, session=session)))

    first = answer([question], "s")
    for system, session in ((SYSTEM, "s"), (None, "t")):
        answer([question], session)  # the session's cache holds the first turn
        turn = [question, {"role": "assistant", "content": first.text}, {"role": "user", "content": SECOND}]
        turn = [{"role": "system", "content": system}] * bool(system) + turn
        cached, fresh = answer(turn, session), answer(turn, None)
        assert cached.end.error is None and cached.text == fresh.text
        assert (cached.end.cached_tokens > 0) == (system is None)


@pytest.mark.parametrize("family", ["glm4v"], indirect=True)
def test_glm4v_answers_about_an_image_its_reasoning_and_answer_tags_apart(family):
    """GLM-4.1V-Thinking through /v1: a system prompt reaches its template as text, and `<think>...</think>
    <answer>...</answer>` comes back as the reasoning and the answer, with no tag left in either."""
    from openai import OpenAI

    from bench.families import ForcedAnswer
    from local_chat.engine import Request, Sampling
    from local_chat.engine.chats import ChatEngine

    _, _, model = family
    image = {"type": "image_url", "image_url": {"url": png_data_url(png_bytes(RED))}}
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [image, {"type": "text", "text": FIRST}]},
    ]
    written = "<think>A red square on grey.</think><answer>A red square.</answer>"
    forced = ForcedAnswer(model.llma, model.tokenizer.hf, written, "<|user|>")
    try:
        with serve(model) as (url, _):
            api = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            message = api.chat.completions.create(model="m", messages=messages, max_tokens=60).choices[0].message
    finally:
        forced.remove()
    assert (message.content, message.model_extra["reasoning_content"]) == ("A red square.", "A red square on grey.")
    request = Request(messages=messages, sampling=Sampling(max_new_tokens=1))
    rendered = next(iter(ChatEngine(model.engine, "chat_template").stream(request)))
    assert rendered.text.startswith("[gMASK]<sop><|system|>\nBe brief.<|user|>\n<|begin_of_image|>")


@pytest.mark.parametrize("family", WITH_TEMPLATE, indirect=True)
def test_an_answer_about_an_image_in_the_step_batch_is_the_answer_alone(family):
    """Beside long answers of text in the step batch, a greedy answer about an image runs there too (prefilled alone
    with its pixels, then a row like any other: Qwen2-VL's 3-D positions beside the text rows') and is the answer it
    gets alone; a family whose decode steps take more than a token (Mllama's cross-attention mask) runs it alone, and
    the model panel says so."""
    from local_chat.engine import Request, Sampling, collect

    name, _, model = family
    engine = model.engine
    asked = chat_prompt(engine, default_template(engine), SYSTEM, [], FIRST, 8, RED)
    request = Request(asked.text, Sampling(8, temperature=0.0), tuple(asked.stop_symbols), images=asked.images)
    alone = collect(engine.stream(request))
    said = engine.start_batching(4)
    long = Request("Tell a story.", Sampling(150, temperature=1.0, seed=1))  # a seed: a row of the step batch
    keepers = [threading.Thread(target=lambda: collect(engine.stream(long))) for _ in range(2)]
    slow = ForwardCounter(model, delay=0.01)  # the long answers last seconds
    try:
        assert engine.batcher is not None and engine.batcher.stepped is not None, said
        engine.eos_ids = lambda stop_symbols=(): set()  # and run to their length...
        for keeper in keepers:  # the first begins alone (a family with per-token inputs keeps it there)
            keeper.start()
            time.sleep(0.2)
        del engine.eos_ids  # ...the one about the image stops where it does alone
        assert all(keeper.is_alive() for keeper in keepers)
        before = engine.batcher.stepped.answers  # the long answers are in it by now
        beside = collect(engine.stream(request))
        joined = engine.batcher.stepped.answers - before
    finally:
        for keeper in keepers:
            if keeper.is_alive():
                keeper.join()
        slow.restore()
        engine.stop_batching()
    assert beside.end.token_ids == alone.end.token_ids and beside.text == alone.text
    if name == "mllama":
        assert "answers about an image run on their own" in said and joined == 0
    else:
        assert joined == 1, said  # the one about the image
