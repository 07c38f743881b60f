"""Real checkpoints of the families that hear: each a tiny random model of its real transformers class, saved with its
real processor class and published chat template (fixtures/audio_families.py). A recording goes in a message as
OpenAI's `input_audio` part; the prompt is the processor's rendering, the answer the model's own `generate`'s, and
the session's KV cache holds the clip across turns."""

import base64

import pytest

from fixtures import audio_families
from fixtures.app_server import serve
from local_chat.engine import Request, Sampling, collect
from local_chat.engine.chats import ChatEngine
from local_chat.errors import NO_HEARING
from local_chat.model.meta import MetaModel
from local_chat.voice.clips import Clip, wav_bytes

pytest.importorskip("soundfile")

SYSTEM = "Be brief."
FIRST, SECOND = "What is this sound?", "And how loud is it?"
RATE = 16_000
LOW, HIGH = Clip(audio_families.tone(220, 1.0), RATE), Clip(audio_families.tone(1760, 1.5), RATE)
GREEDY = Sampling(temperature=0, max_new_tokens=6)


@pytest.fixture(scope="module")
def folders():
    return {}


@pytest.fixture(scope="module")
def family(request, folders, tmp_path_factory):
    """(name, loaded MetaModel) of the family named by the test's parameter."""
    name = request.param
    if name not in folders:
        folders[name] = audio_families.build(name, tmp_path_factory.mktemp(name) / name)
    return name, MetaModel.from_pretrained(str(folders[name]), max_seq_len=1024)


def input_audio(clip: Clip) -> dict:
    """OpenAI's part for a recording: its WAV file's bytes in base64."""
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(clip)).decode(), "format": "wav"}}


def conversation(clip: Clip, first_answer: str | None = None) -> list[dict]:
    """The app's messages: a question about `clip`; with `first_answer`, its answer and a second question."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [input_audio(clip), {"type": "text", "text": FIRST}]},
    ]
    if first_answer is not None:
        messages += [{"role": "assistant", "content": first_answer}, {"role": "user", "content": SECOND}]
    return messages


def reference(clip: Clip, first_answer: str) -> list[dict]:
    """The same two turns as a user of transformers writes them for the processor."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "audio", "audio": clip.samples}, {"type": "text", "text": FIRST}]},
        {"role": "assistant", "content": first_answer},
        {"role": "user", "content": SECOND},
    ]


def answer(model, messages, session=None):
    engine = ChatEngine(model.engine, "chat_template")
    request = Request(messages=messages, sampling=GREEDY, session=session)
    events = list(engine.stream(request))
    return events[0], collect(iter(events[1:]))


@pytest.mark.parametrize("family", audio_families.FAMILIES, indirect=True)
def test_two_turns_about_a_clip_are_the_processors_prompt_and_generates_tokens(family):
    """The second turn's prompt is the processor's rendering of the same conversation, its token ids (the clip's
    audio tokens among them) the processor's, and its greedy tokens those of transformers' `generate`; it runs from
    the session's cache of the first turn, clip included."""
    _, model = family
    _, one = answer(model, conversation(LOW), session="tab")
    assert one.end.error is None and one.end.cached_tokens == 0
    rendered, two = answer(model, conversation(LOW, one.text), session="tab")
    assert two.end.error is None and two.end.cached_tokens > 0
    expected_text = model.processor.apply_chat_template(reference(LOW, one.text), add_generation_prompt=True,
                                                        tokenize=False)  # fmt: skip
    assert rendered.text == expected_text
    expected = model.processor.apply_chat_template(
        reference(LOW, one.text), add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    ours = model.engine.encoder.prepare_inputs([rendered.text], [[LOW]])
    assert ours.input_ids[0].tolist() == expected["input_ids"][0].tolist()
    audio_id = model.engine.sessions.audio_token_id
    assert (ours.input_ids == audio_id).sum() > 10
    generated = model.llma.generate(**expected, max_new_tokens=len(two.end.token_ids), do_sample=False)
    assert two.end.token_ids == generated[0, expected["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("family", audio_families.FAMILIES, indirect=True)
def test_the_answer_is_about_the_clip_of_its_turn(family):
    """Two clips, two answers; a new clip in the same session's second turn is heard (not the cached first)."""
    _, model = family
    low, high = answer(model, conversation(LOW))[1], answer(model, conversation(HIGH))[1]
    assert low.end.token_ids != high.end.token_ids
    answer(model, conversation(LOW), session="s")
    again = answer(model, conversation(HIGH), session="s")[1]
    assert again.end.token_ids == high.end.token_ids


def test_a_model_that_cannot_hear_says_so_in_one_sentence(byte_model):
    chats = ChatEngine(byte_model.engine, "chat_template")
    result = collect(chats.stream(Request(messages=conversation(LOW), sampling=GREEDY)))
    assert result.end.error == NO_HEARING


@pytest.mark.parametrize("family", audio_families.FAMILIES[:1], indirect=True)
def test_a_recording_through_v1_with_the_openai_client(family):
    """/v1/chat/completions with an `input_audio` part (and one that is not sound: its sentence, a 400)."""
    import openai
    from openai import OpenAI

    _, model = family
    expected = answer(model, conversation(LOW))[1]
    with serve(model) as (url, _):
        api = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        reply = api.chat.completions.create(model="m", messages=conversation(LOW), max_tokens=6, temperature=0)
        assert reply.choices[0].message.content == expected.text
        broken = conversation(LOW)
        broken[1]["content"][0]["input_audio"]["data"] = base64.b64encode(b"not sound at all").decode()
        with pytest.raises(openai.BadRequestError) as error:
            api.chat.completions.create(model="m", messages=broken, max_tokens=6)
    assert "cannot be read as sound" in str(error.value)


@pytest.mark.parametrize("family", audio_families.FAMILIES, indirect=True)
def test_answers_about_clips_at_once_are_those_given_alone(family):
    """Four answers about four clips at the same time (they run in the batch beside each other) are the greedy
    answers each gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    _, model = family
    clips = [Clip(audio_families.tone(hertz, seconds), RATE) for hertz, seconds in ((220, 1), (440, 1.2), (880, 1.4),
                                                                                     (1760, 2))]  # fmt: skip
    alone = [answer(model, conversation(clip))[1].end.token_ids for clip in clips]
    model.engine.start_batching(4)
    try:
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda clip: answer(model, conversation(clip))[1].end.token_ids, clips))
    finally:
        model.engine.stop_batching()
    assert together == alone and len(set(map(tuple, alone))) == 4
