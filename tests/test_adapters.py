"""PEFT LoRA adapters (--lora NAME=DIR, model/adapters.py): each answer equals PEFT's own `generate` with that
adapter (greedy, token for token), the model alone equals the base, answers of different adapters never mix (in the
batch, through /v1, 8 clients at once), the KV caches are kept per adapter, --merge_lora and --quant 4 agree, the
page's picker offers "BASE + NAME", and a folder that does not fit is one sentence naming its file while the others
are served. Two adapters made with PEFT on a tiny Llama, of different ranks and layers."""

import json
import shutil
import threading
import time

import psutil
import pytest
import torch
from openai import APIStatusError, OpenAI
from playwright.sync_api import expect
from test_browser import ARTIFACTS, browser, open_page, send  # noqa: F401
from test_models_dir import model_processes

from fixtures import tiny_models
from fixtures.app_server import generate_here, launched
from local_chat.engine.interface import Request, Sampling, collect
from local_chat.launchers import browser as launchers
from local_chat.model.meta import MetaModel

PROMPTS = ["Hello there", "The capital of France is", "def add(a, b):"]
GREEDY = Sampling(max_new_tokens=16, temperature=0.0)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, byte_tokenizer, byte_llama_dir) -> dict:
    """alpha (rank 4: attention and down_proj) and beta (rank 8: k_proj and the MLP's inputs) over byte_llama_dir's
    weights, and folders that do not fit it."""
    base = tiny_models.random_llama(len(byte_tokenizer), seed=1)  # byte_llama_dir's weights
    top = tmp_path_factory.mktemp("adapters")
    made = {
        "alpha": tiny_models.save_lora(base, top / "alpha", seed=10),
        "beta": tiny_models.save_lora(base, top / "beta", seed=11, targets=("k_proj", "gate_proj", "up_proj"), rank=8),
    }
    wider = tiny_models.random_llama(len(byte_tokenizer), seed=1, hidden_size=96, num_attention_heads=4)
    made["wider"] = tiny_models.save_lora(wider, top / "wider", seed=12)  # trained on another base
    made["broken"] = tiny_models.save_lora(base, top / "broken", seed=13)
    (made["broken"] / "adapter_config.json").write_text("{not json")
    made["unknown"] = tiny_models.save_lora(base, top / "unknown", seed=14)
    config = json.loads((made["unknown"] / "adapter_config.json").read_text())
    (made["unknown"] / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["nope_proj"]}))
    made["empty"] = top / "empty"
    made["empty"].mkdir()
    return made


@pytest.fixture(scope="module")
def served(byte_llama_dir, adapters) -> MetaModel:
    """The base with alpha and beta, and the folders that do not fit (left out, each with its sentence)."""
    names = ("alpha", "beta", "wider", "broken", "unknown", "empty")
    return MetaModel.from_pretrained(str(byte_llama_dir), lora={name: adapters[name] for name in names})


def peft_tokens(base_dir, adapter_dir, prompt_ids: list[int], quant=None) -> list[int]:
    """PEFT's own greedy answer (its stop token left out) over transformers' model of `base_dir`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from local_chat.model.loading import quantization_config

    model = AutoModelForCausalLM.from_pretrained(
        base_dir, quantization_config=quantization_config(quant, torch.float32)
    )
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir))
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=GREEDY.max_new_tokens, do_sample=False)
    tokens = out[0, len(prompt_ids) :].tolist()
    return tokens[:-1] if tokens and tokens[-1] == 2 else tokens


def engine_tokens(model: MetaModel, prompt: str, adapter=None, session=None):
    end = collect(model.engine.stream(Request(prompt, GREEDY, session=session, adapter=adapter))).end
    assert end.error is None, end.error
    return end


def prompt_ids(model: MetaModel, prompt: str) -> list[int]:
    return model.engine.encoder.prepare_inputs([prompt], None, None).input_ids[0].tolist()


def test_each_adapter_answers_as_peft_does_and_the_model_alone_as_the_base(served, byte_llama_dir, adapters):
    answers = {}
    for name in (None, "alpha", "beta"):
        for prompt in PROMPTS:
            expected = peft_tokens(byte_llama_dir, adapters[name] if name else None, prompt_ids(served, prompt))
            answers[name, prompt] = engine_tokens(served, prompt, name).token_ids
            assert answers[name, prompt] == expected, (name, prompt)
    assert all(answers[None, p] != answers["alpha", p] != answers["beta", p] for p in PROMPTS)  # they differ
    # Accessory's API takes the adapter too, in a left-padded batch
    assert (
        served.generate(PROMPTS, max_gen_len=16, adapter="beta", return_details=True)[1]["token_ids"]
        == (answers["beta", PROMPTS[1]])
    )
    summary = served.engine.summary()
    assert summary.adapters == ("alpha", "beta") and summary.adapter == ""


def test_answers_of_two_adapters_and_the_base_at_once_never_mix(served):
    """Nine answers at once over three adapters, in the batch: each equals its own alone. Their prompt is the same
    and spans several pages of the batch's paged cache, whose pages one adapter's answer must not take from
    another's."""
    prompt = " ".join(PROMPTS * 12)
    alone = {name: engine_tokens(served, prompt, name).token_ids for name in (None, "alpha", "beta")}
    served.engine.start_batching(4)
    try:
        got: dict = {}

        def answer(index: int, name):
            got[index] = engine_tokens(served, prompt, name).token_ids

        threads = [threading.Thread(target=answer, args=(i, [None, "alpha", "beta"][i % 3])) for i in range(9)]
        [thread.start() for thread in threads]
        [thread.join(60) for thread in threads]
        assert served.engine.batcher.answers >= 1 + 6  # its start-up check, and each adapter's answers but the first
    finally:
        served.engine.stop_batching()
    assert all(got[i] == alone[[None, "alpha", "beta"][i % 3]] for i in range(9)), got


def test_the_kv_caches_are_kept_per_adapter(served):
    """One conversation goes from the base to alpha: alpha's first turn reuses none of the base's keys and values
    (they are not alpha's), its next turn reuses its own."""
    first = engine_tokens(served, PROMPTS[1], None, session="talk")
    again = engine_tokens(served, PROMPTS[1], "alpha", session="talk")
    assert again.cached_tokens == 0 and again.token_ids == engine_tokens(served, PROMPTS[1], "alpha").token_ids
    assert first.token_ids != again.token_ids
    follow_up = PROMPTS[1] + " and the capital of Spain is"
    assert engine_tokens(served, follow_up, "alpha", session="talk").cached_tokens > 0
    assert engine_tokens(served, PROMPTS[1] + " and", None, session="talk").cached_tokens > 0  # the base's kept too


def test_a_folder_that_does_not_fit_is_one_sentence_naming_its_file_and_the_others_are_served(served, adapters):
    problems = dict(served.engine.summary().adapter_problems)
    assert set(problems) == {"wider", "broken", "unknown", "empty"}
    assert f"in {adapters['wider'] / 'adapter_model.safetensors'} is [96, 4], where this model's" in problems["wider"]
    assert "trained on another base" in problems["wider"]
    assert f"{adapters['broken']}/adapter_config.json is not valid JSON" in problems["broken"]
    assert "targets nope_proj, which this model (LlamaForCausalLM) does not have" in problems["unknown"]
    assert f"{adapters['empty']} has no adapter_config.json" in problems["empty"]
    assert all(sentence.count(". ") == 0 for sentence in problems.values()), problems  # one sentence each
    end = collect(served.engine.stream(Request("Hi", GREEDY, adapter="wider"))).end
    assert end.finish_reason == "error" and end.error == problems["wider"]
    end = collect(served.engine.stream(Request("Hi", GREEDY, adapter="gamma"))).end
    assert end.error == "There is no adapter 'gamma' here; the adapters are alpha, beta."


def test_merge_lora_and_quant_4_answer_as_peft_does(byte_llama_dir, adapters):
    merged = MetaModel.from_pretrained(str(byte_llama_dir), lora={"alpha": adapters["alpha"]}, merge_lora=True)
    assert merged.engine.summary().adapter == "alpha" and not hasattr(merged.llma, "peft_config")
    for prompt in PROMPTS:
        ids = prompt_ids(merged, prompt)
        assert engine_tokens(merged, prompt).token_ids == peft_tokens(byte_llama_dir, adapters["alpha"], ids)
    pytest.importorskip("bitsandbytes")
    quantized = MetaModel.from_pretrained(str(byte_llama_dir), quant=4, lora={"beta": adapters["beta"]})
    ids = prompt_ids(quantized, PROMPTS[0])
    assert engine_tokens(quantized, PROMPTS[0], "beta").token_ids == peft_tokens(
        byte_llama_dir, adapters["beta"], ids, quant=4
    )


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--lora", "a=X", "b=Y", "--merge_lora"], "--merge_lora folds one --lora adapter into the model; give one"),
        (["--lora", "a=X", "a=Y"], "--lora names 'a' twice"),
        (["--lora", "a+b=X"], "give NAME=DIR (a name without '+')"),
        (["--lora", "a=X", "--n_gpus", "2", "--device", "cpu"], "--lora works on one device for now"),
        (["--lora", "a=X", "--quant", "4", "--merge_lora"], "--merge_lora would round the adapter"),
        (["--lora", "a=X", "--compile"], "--compile cannot switch LoRA adapters between answers"),
    ],
)
def test_flags_that_cannot_go_together_are_one_sentence(byte_llama_dir, adapters, flags, said, capsys):
    flags = [flag.replace("X", str(adapters["alpha"])).replace("Y", str(adapters["beta"])) for flag in flags]
    with pytest.raises(SystemExit):
        launchers.app(["--pretrained_path", str(byte_llama_dir), "--no_history", *flags])
    assert said in capsys.readouterr().err


def test_the_command_line_answers_with_an_adapter_and_merged_alike(tmp_path, byte_llama_dir, adapters):
    common = ["--pretrained_path", str(byte_llama_dir), "--prompts", *PROMPTS, "--max_new_tokens", "12"]
    with_adapter = generate_here(
        tmp_path, "adapter", *common, "--lora", f"alpha={adapters['alpha']}", "--adapter", "alpha"
    )
    merged = generate_here(tmp_path, "merged", *common, "--lora", f"alpha={adapters['alpha']}", "--merge_lora")
    alone = generate_here(tmp_path, "alone", *common)
    responses = lambda text: [json.loads(line)["response"] for line in text.splitlines()]  # noqa: E731
    assert responses(with_adapter) == responses(merged) != responses(alone)
    with pytest.raises(SystemExit):
        generate_here(tmp_path, "gamma", *common, "--adapter", "gamma")


def test_v1_lists_the_adapters_with_their_base_and_answers_with_each(byte_llama_dir, adapters, served):
    """Through the real app: /v1/models lists "byte_llama + alpha" with its parent; each model's answer is the
    in-process one; 8 clients over two adapters and the base at once each get their own alone; nothing loads
    again (the app's processes stay as they were)."""
    lora = [f"{name}={adapters[name]}" for name in ("alpha", "beta", "wider")]
    app, client = launched("--pretrained_path", str(byte_llama_dir), "--lora", *lora, "--no_history")
    try:
        api = OpenAI(base_url=client.src.rstrip("/") + "/v1", api_key="unused", max_retries=0)
        cards = {card.id: card.model_extra for card in api.models.list().data}
        assert list(cards) == ["byte_llama", "byte_llama + alpha", "byte_llama + beta"]
        assert cards["byte_llama + alpha"]["parent"] == "byte_llama" and "parent" not in cards["byte_llama"]
        processes = len(psutil.Process(app.pid).children(recursive=True))
        models = {"byte_llama": None, "byte_llama + alpha": "alpha", "byte_llama + beta": "beta"}
        expected = {
            m: collect(served.engine.stream(Request(PROMPTS[2], GREEDY, adapter=a))).text for m, a in models.items()
        }

        def answer(model: str) -> str:
            reply = api.completions.create(model=model, prompt=PROMPTS[2], max_tokens=16, temperature=0)
            assert reply.model == model
            return reply.choices[0].text

        assert {model: answer(model) for model in models} == expected
        got: dict = {}
        names = list(models) * 3
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, answer(names[i]))) for i in range(8)]
        [thread.start() for thread in threads]
        [thread.join(60) for thread in threads]
        assert [got.get(i) for i in range(8)] == [expected[names[i]] for i in range(8)]
        assert len(psutil.Process(app.pid).children(recursive=True)) == processes  # no model loaded again
        with pytest.raises(APIStatusError) as wider:
            api.completions.create(model="byte_llama + wider", prompt="Hi", max_tokens=4)
        assert wider.value.status_code == 404 and "trained on another base" in wider.value.body["message"]
    finally:
        app.terminate()
        output = app.communicate(timeout=30)[0]
    assert "LoRA adapters: byte_llama + alpha, byte_llama + beta (each chosen as a model)." in output
    assert "warning: The adapter wider:" in output and "It is left out; the others are served." in output


def test_the_page_picker_offers_each_adapter_and_the_answer_names_it(browser, byte_llama_dir, adapters):  # noqa: F811
    lora = [f"{name}={adapters[name]}" for name in ("alpha", "beta")]
    app, client = launched("--pretrained_path", str(byte_llama_dir), "--lora", *lora, "--no_history")
    try:
        page = open_page(browser, client.src)
        page.locator(".model-picker input").first.click()
        options = [option.strip("✓ \n") for option in page.get_by_role("option").all_inner_texts()]
        assert options == ["byte_llama", "byte_llama + alpha", "byte_llama + beta"]
        page.screenshot(path=str(ARTIFACTS / "adapter-picker.png"), full_page=True)
        page.get_by_role("option", name="byte_llama + beta").click()
        expect(page.locator(".model-picker input").first).to_have_value("byte_llama + beta")
        # On failure, the status says where the switch was (empty: it never started; "Waiting...": it loads).
        expect(page.locator(".model-status").first).to_contain_text("Now answering: byte_llama + beta", timeout=60_000)
        assert "byte_llama + beta" in page.locator(".model-line").first.inner_text()
        send(page, "Hi")
        stats = page.locator("text=/tokens · first token/")
        stats.first.wait_for(timeout=60_000)
        assert stats.first.inner_text().endswith("· byte_llama + beta")
        page.screenshot(path=str(ARTIFACTS / "adapter-answer.png"), full_page=True)
    finally:
        app.terminate()
        app.communicate(timeout=30)


def test_models_dir_lists_adapters_over_their_base_and_loads_the_base_once(tmp_path, byte_llama_dir, adapters, served):
    """--models_dir: an adapter folder whose config names a listed checkpoint (a hub id's last part, or its path) is
    the model "BASE + NAME", answered by the base's one process; one whose base is not listed says so."""
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copytree(byte_llama_dir, folder / "byte-llama")
    for name, base in (("alpha", "acme/byte-llama"), ("beta", str(folder / "byte-llama")), ("orphan", "acme/other")):
        shutil.copytree(adapters["beta" if name == "beta" else "alpha"], folder / name)
        config = json.loads((folder / name / "adapter_config.json").read_text())
        (folder / name / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base}))
    app, client = launched("--models_dir", str(folder), "--no_history")
    try:
        api = OpenAI(base_url=client.src.rstrip("/") + "/v1", api_key="unused", max_retries=0)
        cards = {card.id: card.model_extra for card in api.models.list().data}
        assert list(cards) == ["byte-llama", "byte-llama + alpha", "byte-llama + beta"]
        assert cards["byte-llama + beta"]["parent"] == "byte-llama"
        [process] = model_processes(app)
        for model, adapter in (("byte-llama + alpha", "alpha"), ("byte-llama + beta", "beta"), ("byte-llama", None)):
            reply = api.completions.create(model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0)
            assert (
                reply.choices[0].text
                == collect(served.engine.stream(Request(PROMPTS[0], GREEDY, adapter=adapter))).text
            )
        assert model_processes(app) == [process]  # the base's one process answered them all
        with pytest.raises(APIStatusError) as orphan:
            api.completions.create(model="orphan", prompt="Hi", max_tokens=4)
        assert (
            "its base 'acme/other' (base_model_name_or_path in its adapter_config.json) is not among"
            in (orphan.value.body["message"])
        )
    finally:
        app.terminate()
        output = app.communicate(timeout=30)[0]
    assert "byte-llama + alpha (LoRA adapter over byte-llama," in output


def test_answers_take_the_layers_in_arrival_order_one_adapter_at_a_time():
    """While answers of a run, one of b waits, and an answer of a that comes after it waits too (no starving b); once
    a's are over, b's turn takes every answer waiting for b (they run together), then a's; a cancelled wait ends at
    once."""
    from local_chat.model.adapters import Adapters, Cancelled

    class Layers:  # PEFT's calls, recorded
        def __init__(self):
            self.base_model, self.calls = self, []

        def set_adapter(self, name, inference_mode):
            self.calls.append(name)

        def enable_adapter_layers(self):
            pass

        def disable_adapter_layers(self):
            self.calls.append(None)

    layers = Layers()
    gate = Adapters(layers, ["a", "b"])
    order, running = [], {}

    def answer(name: str, tag: str, hold: threading.Event):
        with gate.holding(name):
            order.append(tag)
            running[tag] = True
            hold.wait(5)
            running[tag] = False

    def until(check) -> None:  # threads get their turn late on a busy machine: wait for the state, not a time
        deadline = time.monotonic() + 10
        while not check() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert check()

    def start(tags: tuple[str, ...]) -> dict:
        threads = {}
        for tag in tags:  # one after the other, each in the gate (running or waiting) before the next comes
            threads[tag] = threading.Thread(target=answer, args=(tag[0], tag, holds[tag]))
            threads[tag].start()
            until(lambda: len(gate._waiting) + sum(running.values()) == len(threads))
        return threads

    holds = {tag: threading.Event() for tag in ("a1", "b1", "a2", "b2")}
    threads = start(("a1", "b1", "a2", "b2"))
    assert order == ["a1"]  # b1 waits for a1, a2 behind b1, b2 with b1
    holds["a1"].set()
    until(lambda: len(order) == 3 and running["b1"] and running["b2"])
    assert set(order[1:]) == {"b1", "b2"}  # b's turn: both at once, before a2
    holds["b1"].set(), holds["b2"].set()
    until(lambda: len(order) == 4)
    assert order[3] == "a2"
    holds["a2"].set()
    [thread.join(5) for thread in threads.values()]
    assert layers.calls == [None, "a", "b", "a"]  # the model alone at first, then each switch
    holds = {tag: threading.Event() for tag in ("a3", "b3", "b4")}
    threads = start(("a3", "b3", "b4"))
    holds["a3"].set()
    until(lambda: running.get("b3") and running.get("b4"))  # of one adapter, arrived together: they run together
    holds["b3"].set(), holds["b4"].set()
    [thread.join(5) for thread in threads.values()]
    blocker = threading.Event()
    holder = threading.Thread(target=answer, args=("a", "a5", blocker))
    holder.start()
    until(lambda: running.get("a5"))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled), gate.holding("b", cancel):
        pass
    blocker.set()
    holder.join(5)
