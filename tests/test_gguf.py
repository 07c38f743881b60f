"""GGUF files served by llama.cpp (engine/llama_cpp.py, model/gguf.py): tiny Qwen3 models of the real class with
Qwen3's published template, converted by llama.cpp's own converter (tests/gguf_models.py), answered through every
door as a Hugging Face folder of the family is."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from gguf_models import CALL, THINKING_ANSWER, gguf_of, tiny_qwen2_vl, tiny_qwen3
from openai import OpenAI
from test_browser import ARTIFACTS, attach, browser, open_page, send, wait_for_answer  # noqa: F401
from test_models_dir import model_processes

from fixtures.app_server import ROOT, launched
from fixtures.tiny_models import WEATHER, save_hf
from local_chat.errors import UserError
from local_chat.launchers.flags import parser
from local_chat.launchers.loading import check_gguf_flags, choose_listed_model, load_gguf
from local_chat.model.gguf import read_gguf

pytest.importorskip("xllamacpp", reason='GGUF files need the gguf extra: pip install -e ".[gguf]"')


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A --models_dir of GGUF files: a random Qwen3 (Q8_0 and BF16), one that thinks, then answers "Paris", and one
    that calls get_weather (tests/gguf_models.py)."""
    work = tmp_path_factory.mktemp("gguf")
    folder = work / "models"
    folder.mkdir()
    random = tiny_qwen3(work / "qwen3-random")
    shutil.move(gguf_of(random, "q8_0"), folder / "qwen3-random.gguf")
    shutil.move(gguf_of(random, "bf16"), folder / "qwen3-random-bf16.gguf")
    for name, answer in (("qwen3-thinks", THINKING_ANSWER), ("qwen3-calls", f"<tool_call>{CALL}</tool_call>")):
        shutil.move(gguf_of(tiny_qwen3(work / name, answer)), folder / f"{name}.gguf")
    return folder


@pytest.fixture(scope="module")
def app(models):
    app, client = launched("--models_dir", str(models), "--max_loaded_models", "4", "--no_history")
    yield app, client
    app.terminate()
    app.communicate(timeout=30)


def api_of(client) -> OpenAI:
    return OpenAI(base_url=client.src.rstrip("/") + "/v1", api_key="unused", max_retries=0)


def test_the_header_the_tokenizer_and_the_template_are_the_folders(models, tmp_path):
    """What model/gguf.py reads of a file is what its Hugging Face folder holds: the family, the weights' type, the
    template and a tokenizer that gives the same ids."""
    from transformers import AutoTokenizer

    from local_chat.model.gguf import gguf_tokenizer

    model = read_gguf(models / "qwen3-random.gguf")
    assert (model.architecture, model.model_type, model.file_type) == ("qwen3", "qwen3", "Q8_0")
    assert read_gguf(models / "qwen3-random-bf16.gguf").file_type == "BF16"
    folder = AutoTokenizer.from_pretrained(models.parent / "qwen3-random")
    assert model.chat_template == folder.chat_template
    from_file = gguf_tokenizer(model)
    messages = [{"role": "user", "content": "What is the weather in Paris? It's 12 degrees."}]
    rendered = folder.apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True, tokenize=False)
    assert from_file.apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True, tokenize=False) == (
        rendered
    )
    assert from_file.encode(rendered + THINKING_ANSWER) == folder.encode(rendered + THINKING_ANSWER)


def test_listed_by_name_and_answering_through_v1(app):
    """--models_dir lists each GGUF file by its name, and each answers through /v1."""
    _, client = app
    api = api_of(client)
    ids = [card.id for card in api.models.list().data]
    assert ids == ["qwen3-calls", "qwen3-random-bf16", "qwen3-random", "qwen3-thinks"]  # by file name
    for name in ("qwen3-random", "qwen3-random-bf16"):
        reply = api.completions.create(model=name, prompt="The quick brown fox", max_tokens=8, temperature=0)
        assert reply.usage.completion_tokens >= 1 and reply.model == name


def test_reasoning_tool_calls_and_a_schema_through_v1(app):
    """The family registry reads llama.cpp's tokens as it reads transformers': the reasoning apart, the call as
    `tool_calls`, the tool's result answered; a JSON schema holds the answer (llguidance inside llama.cpp)."""
    _, client = app
    api = api_of(client)
    asked = [{"role": "user", "content": "What is the capital of France?"}]
    reply = api.chat.completions.create(model="qwen3-thinks", messages=asked, max_tokens=32, temperature=0)
    message = reply.choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == ("Let me think", "Paris")
    assert reply.choices[0].finish_reason == "stop"

    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    # "required": held to a call by llguidance in llama.cpp, token by token (the arguments pinned: this model's choice
    # among what the grammar allows is the lowest id, which would start another key after the city)
    only_paris = json.loads(json.dumps(WEATHER).replace('{"type": "string"}', '{"enum": ["Paris"]}'))
    only_paris["function"]["parameters"]["additionalProperties"] = False
    for choice, tool in (("auto", WEATHER), ("required", only_paris)):
        reply = api.chat.completions.create(
            model="qwen3-calls", messages=asked, tools=[tool], tool_choice=choice, max_tokens=64, temperature=0
        )
        assert reply.choices[0].message.tool_calls, reply
        [call] = reply.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
        assert reply.choices[0].finish_reason == "tool_calls"
    answered = asked + [
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."},
    ]
    again = api.chat.completions.create(model="qwen3-calls", messages=answered, tools=[WEATHER], max_tokens=32)
    assert again.choices[0].finish_reason in ("stop", "tool_calls")

    # after its reasoning, the answer held to the schema (where the model's own next token is not JSON, the grammar
    # leaves it the lowest id allowed, and the enum the rest)
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris"]}}, "required": ["city"]}
    schema["additionalProperties"] = False
    reply = api.chat.completions.create(
        model="qwen3-thinks",
        messages=[{"role": "user", "content": "Which city?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        max_tokens=64,
        temperature=0,
    )
    assert json.loads(reply.choices[0].message.content) == {"city": "Paris"}, reply
    assert reply.choices[0].message.model_extra["reasoning_content"] == "Let me think"


def test_log_probabilities_are_the_models_own(app, models):
    """/v1 asks for log-probabilities of a GGUF model's answer: one for each token, their texts the answer's, the
    alternatives best first; at the first token they are the Hugging Face folder's own (BF16 against float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, client = app
    api = api_of(client)
    prompt = "The quick brown fox"
    reply = api.completions.create(
        model="qwen3-random-bf16", prompt=prompt, max_tokens=8, temperature=0, logprobs=3
    ).choices[0]
    assert len(reply.logprobs.tokens) == 8 and "".join(reply.logprobs.tokens).lstrip() == reply.text
    for token, logprob, top in zip(reply.logprobs.tokens, reply.logprobs.token_logprobs, reply.logprobs.top_logprobs):
        assert len(top) == 3 and list(top.values()) == sorted(top.values(), reverse=True)
        assert top[token] == logprob == max(top.values())  # greedy: the likeliest token
    folder = models.parent / "qwen3-random"
    ids = AutoTokenizer.from_pretrained(folder).encode(prompt, return_tensors="pt")
    with torch.no_grad():
        first = torch.log_softmax(AutoModelForCausalLM.from_pretrained(folder).float()(ids).logits[0, -1], dim=-1)
    theirs = dict(reply.logprobs.top_logprobs[0])
    best = first.topk(3)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert [tokenizer.decode([i]) for i in best.indices.tolist()] == list(theirs)
    assert list(theirs.values()) == pytest.approx(best.values.tolist(), abs=0.05)

    chat = api.chat.completions.create(
        model="qwen3-random",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    pieces = [c.choices[0] for c in chat if c.choices]
    tokens = [t for p in pieces if p.logprobs for t in p.logprobs.content]
    assert "".join(t.token for t in tokens).lstrip() == "".join(p.delta.content or "" for p in pieces)
    assert tokens and all(len(t.top_logprobs) == 2 for t in tokens)


ENGINE_CHECKS = """
import json, sys, threading, time, httpx
from local_chat.engine.interface import Delta, End, Request, Sampling
from local_chat.engine.llama_cpp import LlamaCppEngine
from local_chat.model.gguf import read_gguf

same = []
for path in sys.argv[2:]:  # the same greedy tokens as llama.cpp's own handling of the text
    engine = LlamaCppEngine(read_gguf(path), 1024, 1, 2)
    prompt = "The quick brown fox jumps over the lazy dog. What is the capital of France?"
    ours = list(engine.stream(Request(prompt, Sampling(max_new_tokens=24, temperature=0))))[-1].token_ids
    body = {"prompt": prompt, "n_predict": 24, "temperature": 0, "cache_prompt": False, "return_tokens": True}
    theirs = httpx.post(engine.url + "/completion", json=body, headers=engine._http.headers, timeout=60).json()
    same.append([ours, theirs["tokens"]])
engine = LlamaCppEngine(read_gguf(sys.argv[1]), 1024, 1, 2)
slots = lambda: httpx.get(engine.url + "/slots", headers=engine._http.headers).json()[0]
prompt = "The quick brown fox jumps over the lazy dog. " * 8
cancel, pieces = threading.Event(), 0
for event in engine.stream(Request(prompt, Sampling(max_new_tokens=400, temperature=0), cancel=cancel)):
    pieces += isinstance(event, Delta)
    if pieces == 3 and not cancel.is_set():
        cancel.set()
        at_stop = len(engine.tokenizer.encode(prompt, bos=True))
stopped = event
deadline = time.time() + 10
while slots()["is_processing"] and time.time() < deadline:
    time.sleep(0.05)
decoded = slots()["n_prompt_tokens"] - at_stop  # the slot's cache: the prompt and the answer's tokens fed back
short = Sampling(max_new_tokens=8, temperature=0)
first = list(engine.stream(Request(prompt, short)))[-1]
second = list(engine.stream(Request(prompt + "And again, the quick", short)))[-1]
print(json.dumps({"reason": stopped.finish_reason, "tokens": stopped.completion_tokens, "decoded": decoded,
                  "prompt": first.prompt_tokens, "cached": second.cached_tokens, "same": same}))
"""


def test_greedy_tokens_stop_and_the_cache_across_turns(models):
    """In the engine (a process of its own, as the app runs it): a greedy answer is the one llama.cpp's own server
    gives for the same file and text (Q8_0 and BF16); Stop (the request's cancel flag) closes the stream, which
    llama.cpp aborts; a prompt that goes on from the last one is answered from llama.cpp's cached prefix."""
    files = [str(models / name) for name in ("qwen3-random.gguf", "qwen3-random.gguf", "qwen3-random-bf16.gguf")]
    done = subprocess.run(
        [sys.executable, "-c", ENGINE_CHECKS, *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    for ours, theirs in facts["same"]:
        assert ours == theirs and len(ours) >= 1
    assert facts["reason"] == "cancelled"
    # the answer shows at most 2 tokens after the one Stop came at; llama.cpp aborts the request instead of going on
    # to its 400 tokens (this model decodes a token in about a millisecond: the few it took past the close were
    # already decoded, or in flight, when the stream closed)
    assert facts["tokens"] <= 3 + 2 and facts["decoded"] < 50, facts
    assert facts["cached"] >= facts["prompt"], facts


def test_the_page_names_llama_cpp_and_folds_the_reasoning(browser, app):  # noqa: F811
    _, client = app
    page = open_page(browser, client.src)
    page.locator(".model-picker input").first.click()
    page.get_by_role("option", name="qwen3-thinks").click()
    from playwright.sync_api import expect

    expect(page.locator(".model-line").first).to_contain_text("llama.cpp · GGUF Q8_0", timeout=60_000)
    send(page, "What is the capital of France?")
    answer = wait_for_answer(page, lambda text: "Paris" in text, timeout=60)
    assert "<think>" not in answer and "Let me think" not in answer
    expect(page.get_by_text("Thinking").first).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "gguf-reasoning.png"), full_page=True)


def test_a_killed_llama_cpp_is_a_sentence_and_the_next_answer_loads_it_again(app):
    """llama.cpp dying mid-answer (an abort inside it ends its process) is one sentence; the server stays up and the
    next request loads the model again."""
    app_process, client = app
    api = api_of(client)
    api.completions.create(model="qwen3-random", prompt="Hi", max_tokens=2)
    before = set(model_processes(app_process))
    stream = api.completions.create(model="qwen3-random", prompt="Hi", max_tokens=3000, temperature=0, stream=True)
    pieces = iter(stream)
    next(pieces)
    for process in before:  # the one that answers is among them
        os.kill(process.pid, signal.SIGKILL)
    with pytest.raises(Exception, match="stopped|died|ended"):
        for _ in pieces:
            pass
    again = api.completions.create(model="qwen3-random", prompt="Hi", max_tokens=4, temperature=0)
    assert again.usage.completion_tokens == 4


def image_message(color: str, text: str = "What is in this picture?") -> dict:
    from PIL import Image

    from local_chat.prompting.images import png_bytes, png_data_url

    url = png_data_url(png_bytes(Image.new("RGB", (56, 56), color)))
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}],
    }


def test_an_image_projector_beside_the_file_sees_the_image(browser, tmp_path):  # noqa: F811
    """A folder holding a vision model's GGUF and its `mmproj-*.gguf` (a tiny Qwen2-VL): through /v1, an answer
    about an image is the one llama.cpp's own chat endpoint gives for the same messages (its template, its place for
    the image); another image, another answer; the next turn is answered from the cache, the image's tokens too. On
    the page, an attached image is answered."""
    from PIL import Image
    from playwright.sync_api import expect

    from bench.cpu import llama_server

    folder = tiny_qwen2_vl(tmp_path)
    greedy = dict(max_tokens=12, temperature=0)
    app, client = launched("--pretrained_path", str(folder), "--no_history")
    try:
        page = open_page(browser, client.src)
        expect(page.locator(".model-line").first).to_contain_text("llama.cpp · GGUF Q8_0", timeout=60_000)
        Image.new("RGB", (56, 56), "red").save(tmp_path / "red.png")
        attach(page, tmp_path / "red.png")
        send(page, "What is in this picture?")
        answer = wait_for_answer(page, lambda text: bool(text.strip()), timeout=60)
        assert "llama.cpp" not in answer and "image" not in answer, answer  # no sentence of a failure
        assert page.locator('[data-testid="user"] img').count() == 1
        page.screenshot(path=str(ARTIFACTS / "gguf-vision.png"), full_page=True)
        api = api_of(client)
        ours = {"red": api.chat.completions.create(model="m", messages=[image_message("red")], **greedy)}
        follow_up = [
            image_message("red"),
            {"role": "assistant", "content": ours["red"].choices[0].message.content},
            {"role": "user", "content": "And its colour?"},
        ]
        again = api.chat.completions.create(model="m", messages=follow_up, **greedy)
        ours["blue"] = api.chat.completions.create(model="m", messages=[image_message("blue")], **greedy)
    finally:
        app.terminate()
        app.communicate(timeout=30)
    with llama_server(next(folder.glob("qwen2-vl*.gguf")), next(folder.glob("mmproj*.gguf"))) as url:
        peer = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        theirs = {c: peer.chat.completions.create(model="m", messages=[image_message(c)], **greedy) for c in ours}
    answers = {c: reply.choices[0].message.content for c, reply in ours.items()}
    assert answers == {c: reply.choices[0].message.content for c, reply in theirs.items()}
    assert answers["red"] != answers["blue"] and all(answers.values())
    assert ours["red"].usage.prompt_tokens == theirs["red"].usage.prompt_tokens  # the image's tokens counted
    assert again.usage.prompt_tokens_details.cached_tokens >= ours["red"].usage.prompt_tokens - 1


def test_bad_files_and_flags_that_do_not_apply_are_one_sentence(models, tmp_path, monkeypatch):
    whole = (models / "qwen3-random.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError, match="is truncated .*: download it again"):
        read_gguf(tmp_path / "cut.gguf")
    with pytest.raises(UserError, match="does not exist; check --pretrained_path"):
        read_gguf(tmp_path / "missing.gguf")
    (tmp_path / "notes.gguf").write_text("not a model")
    with pytest.raises(UserError, match="is not a GGUF file"):
        read_gguf(tmp_path / "notes.gguf")
    (tmp_path / "big-00001-of-00002.gguf").write_bytes(whole)
    with pytest.raises(UserError, match="big-00002-of-00002.gguf is not beside it"):
        read_gguf(tmp_path / "big-00001-of-00002.gguf")
    for flags, said in (
        (["--quant", "4"], "--quant does not apply to a GGUF file (it is quantized already)"),
        (["--n_gpus", "2"], "--n_gpus does not apply to a GGUF file"),
        (["--compile"], "--compile does not apply"),
    ):
        args = parser("test").parse_args(["--pretrained_path", str(models / "qwen3-random.gguf"), *flags])
        with pytest.raises(UserError, match=re.escape(said)):
            check_gguf_flags(args)
    (tmp_path / "models.yaml").write_text("qwen3-random:\n  quant: 4\n")
    args = parser("test").parse_args(["--models_dir", str(models), "--models_config", str(tmp_path / "models.yaml")])
    with pytest.raises(UserError, match=re.escape("--models_config: qwen3-random: --quant does not apply to a GGUF")):
        choose_listed_model(args)
    args = parser("test").parse_args(["--pretrained_path", str(models / "qwen3-random.gguf")])
    with pytest.raises(UserError, match=r"has no image projector beside it \(an mmproj\*\.gguf in its folder\)"):
        load_gguf(models / "qwen3-random.gguf", args, with_visual=True)  # the image demos' launch
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(UserError, match=r'pip install -e "\.\[gguf\]"'):
        read_gguf(models / "qwen3-random.gguf")


def test_the_command_line_launcher_answers_from_a_gguf_file(models):
    done = subprocess.run(
        [sys.executable, "-m", "local_chat.launchers.generate", "--pretrained_path", str(models / "qwen3-thinks.gguf"),
         "--prompts", "What is the capital of France?", "--template", "chat_template", "--max_gen_len", "16"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Paris" in done.stdout


ENGINE_ANSWER = """
import json, sys
from local_chat.engine.interface import Delta, Request, Sampling
from local_chat.engine.llama_cpp import LlamaCppEngine
from local_chat.model.gguf import read_gguf
engine = LlamaCppEngine(read_gguf(sys.argv[1]), 1024, 1, 2)
request = Request(sys.argv[2], Sampling(max_new_tokens=24, temperature=0), logprobs=2)
events = list(engine.stream(request))
deltas = [e for e in events if isinstance(e, Delta)]
print(json.dumps({"prompt": engine.tokenizer.encode(sys.argv[2], bos=True), "answer": events[-1].token_ids,
                  "text": "".join(d.text for d in deltas), "completion_tokens": events[-1].completion_tokens,
                  "logprobs": [[t.token, t.logprob] for d in deltas for t in d.logprobs]}))
"""


def engine_answer(gguf, prompt: str) -> dict:
    """The greedy answer of `gguf`'s LlamaCppEngine to `prompt` (a process of its own, as the app runs it)."""
    done = subprocess.run(
        [sys.executable, "-c", ENGINE_ANSWER, str(gguf), prompt], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_character_written_byte_by_byte_comes_whole(tmp_path):
    """A vocabulary with a token for each byte (Qwen's) writes "é" and "☕" in several tokens; llama.cpp's stream holds
    back a token that ends inside a character and sends only the one that completes it: the answer's text is whole,
    its tokens all counted, and the held-back tokens' log-probabilities unknown (None), the others' llama.cpp's."""
    answer = "Café ☕!"
    from transformers import AutoTokenizer

    folder = tiny_qwen3(tmp_path / "bytes", answer, every_byte=True)
    ours = engine_answer(gguf_of(folder), "Order something.\n")
    written = AutoTokenizer.from_pretrained(folder).encode(answer, add_special_tokens=False)
    assert ours["text"] == answer and ours["answer"] == written and ours["completion_tokens"] == len(written)
    assert len(ours["logprobs"]) == len(written)  # a byte's own text is "\ufffd", as the local engine's
    unknown = [token for token, logprob in ours["logprobs"] if logprob is None]
    assert len(unknown) == 3 and all(logprob is None or logprob <= 0 for _, logprob in ours["logprobs"])


def test_a_sentencepiece_llama_answers_as_its_hugging_face_folder(checkpoints, sp_model_file, tmp_path):
    """A Llama with a SentencePiece tokenizer (what LLaMA2-Accessory's and Meta's checkpoints use), converted as it
    is: the file's tokenizer gives sentencepiece's ids, and an Accessory template's prompt (`format_prompt(...,
    sys_name="alpaca")`) is answered with transformers' greedy tokens on the Hugging Face folder (F32 file, float32
    folder)."""
    import sentencepiece
    import torch
    from transformers import LlamaForCausalLM

    from bench.cpu import convert
    from local_chat.model.gguf import gguf_tokenizer
    from local_chat.templates.single_turn import format_prompt

    sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_model_file))
    # a Llama that writes whole characters (no byte token: llama.cpp's stream holds back a token that ends inside a
    # character, and sends only the id of the one that completes it)
    folder = LlamaForCausalLM.from_pretrained(checkpoints["hf"]).float()
    with torch.no_grad():
        folder.lm_head.weight[[i for i in range(sp.vocab_size()) if sp.IsByte(i)]] = 0
    source = save_hf(folder, tmp_path / "llama", tokenizer_model=sp_model_file)
    gguf = convert(source, "f32", tmp_path / "llama-f32.gguf")
    text = "Hello world, it's 1234 degrees. Émile naïve"
    assert gguf_tokenizer(read_gguf(gguf)).encode(text, add_special_tokens=False) == sp.encode(text)

    prompt = format_prompt({"instruction": "What is the capital of France?"}, sys_name="alpaca")
    ours = engine_answer(gguf, prompt)
    assert ours["prompt"] == [sp.bos_id(), *sp.encode(prompt)]
    # each token of llama.cpp's greedy answer is the folder's likeliest at its place, but for ties within llama.cpp's
    # rounding (its KV cache is F16): transformers' log-probabilities over the prompt and that answer
    answer = ours["answer"]
    with torch.no_grad():
        logits = folder(torch.tensor([ours["prompt"] + answer])).logits[0, len(ours["prompt"]) - 1 : -1]
    scores = torch.log_softmax(logits, dim=-1)
    behind = scores.max(dim=-1).values - scores[torch.arange(len(answer)), answer]
    assert len(answer) == 24 and behind.max() < 0.01, behind


def test_ollamas_and_lm_studios_folders_list_their_models_by_their_names(models, tmp_path):
    """--models_dir alone reads Ollama's store (manifests naming their model's blob), LM Studio's PUBLISHER/REPO
    folders and the Hugging Face cache where they are, nothing copied; a manifest whose blob is missing is listed
    with its sentence."""
    import hashlib

    ollama = tmp_path / ".ollama" / "models"
    (ollama / "blobs").mkdir(parents=True)
    for name, source in (("qwen3-thinks", "qwen3-thinks.gguf"), ("gone", None)):
        data = (models / (source or "qwen3-random.gguf")).read_bytes()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if source:
            (ollama / "blobs" / digest.replace(":", "-")).write_bytes(data)
        manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / name / "latest"
        manifest.parent.mkdir(parents=True)
        layer = {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": len(data)}
        manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [layer]}))
    studio = tmp_path / ".lmstudio" / "models"
    for repo, files in (
        ("Qwen3-Tiny-GGUF", ["qwen3-random.gguf"]),
        ("Qwen3-Both-GGUF", ["a-Q8_0.gguf", "b-BF16.gguf"]),
    ):
        (studio / "acme" / repo).mkdir(parents=True)
        for file in files:
            source = "qwen3-random-bf16.gguf" if "BF16" in file else "qwen3-random.gguf"
            os.symlink(models / source, studio / "acme" / repo / file)
    hub = tmp_path / ".cache" / "huggingface" / "hub"  # a GGUF repo's two quantizations, downloaded by the Hub
    snapshot = hub / "models--acme--Qwen3-Tiny-GGUF" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    os.symlink(models / "qwen3-random.gguf", snapshot / "qwen3-tiny-Q8_0.gguf")
    os.symlink(models / "qwen3-random-bf16.gguf", snapshot / "qwen3-tiny-BF16.gguf")
    home = {"HOME": str(tmp_path), "OLLAMA_MODELS": str(ollama), "HF_HOME": str(hub.parent), "HF_HUB_CACHE": str(hub)}
    app, client = launched("--models_dir", "--no_history", env=home)
    try:
        api = api_of(client)
        ids = [card.id for card in api.models.list().data]
        studios = ["acme/Qwen3-Both-GGUF/a-Q8_0", "acme/Qwen3-Both-GGUF/b-BF16", "acme/Qwen3-Tiny-GGUF"]
        hubs = ["acme/Qwen3-Tiny-GGUF/qwen3-tiny-BF16", "acme/Qwen3-Tiny-GGUF/qwen3-tiny-Q8_0"]
        assert ids == ["qwen3-thinks:latest", *studios, *hubs]
        asked = [{"role": "user", "content": "What is the capital of France?"}]
        reply = api.chat.completions.create(model="qwen3-thinks:latest", messages=asked, max_tokens=16, temperature=0)
        assert reply.choices[0].message.content == "Paris"
        reply = api.completions.create(model="acme/Qwen3-Both-GGUF/b-BF16", prompt="Hi", max_tokens=4)
        assert reply.usage.completion_tokens >= 1
    finally:
        app.terminate()
        output = app.communicate(timeout=30)[0]
    assert "gone:latest: Ollama's blob sha256-" in output and "is missing." in output
