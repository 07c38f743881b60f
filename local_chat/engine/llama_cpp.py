"""`LlamaCppEngine`: a GGUF file's engine (engine/interface.py). llama.cpp computes the tokens; everything else is
the app's own, as for a Hugging Face folder of the same family.

- llama.cpp's server (xllamacpp's binding, prebuilt wheels) runs in the model's process (engine/process.py), on
  127.0.0.1 with a key of its own. An abort inside llama.cpp ends that process, which the chat tells in one sentence
  while the web server stays up, as for any model that dies.
- The prompt is rendered with the file's own chat template and tokenized here (model/gguf.py: transformers reads both
  from the file); llama.cpp gets the token ids and sends back each answer token's id, which `AnswerStream` turns into
  text, so stop strings, EOS and what a response parser reads are decided exactly as for a local model.
- Stop closes the request's stream, which llama.cpp aborts at its next token, even while the engine is silent.
- Each of llama.cpp's slots keeps the last conversation it answered: a turn that goes on from it reuses its KV cache
  (llama.cpp picks the slot whose cache shares the most of the prompt). Several answers run at once, one per slot.
- Answers held to a format (a JSON schema, a required tool call) go as llguidance grammars, which llama.cpp's
  sampler enforces token by token.
- A model with an image projector beside it (`mmproj*.gguf`) sees images as llama.cpp's own chat endpoint shows them:
  each image part of a message is rendered as llama.cpp's media marker (`MediaMarkers`), and the prompt goes as text
  with the images, which llama.cpp tokenizes, placing each image's tokens (and its family's image delimiters) at its
  marker.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator

import httpx

from local_chat.errors import UserError, described, failure_sentence
from local_chat.model.answer_stream import AnswerStream, answer_room
from local_chat.model.cpu_threads import hand_back_workers
from local_chat.model.gguf import INSTALL, GgufModel, gguf_tokenizer
from local_chat.model.tokenizer import HFTokenizer
from local_chat.prompting.answer_grammars import json_options
from local_chat.prompting.images import png_bytes

from .interface import (
    Answer,
    AnswerFormat,
    End,
    EngineSummary,
    Event,
    FinishReason,
    Request,
    Sampling,
    TokenLogprob,
    collect_at_once,
)
from .openai_wire import server_events
from .remote import close_on_cancel

log = logging.getLogger(__name__)
START_TIMEOUT_S = 600.0  # how long llama.cpp may take to load the file
START_POLL_S = 0.1
NO_IMAGES = "This GGUF model has no image projector (an mmproj*.gguf beside it); send the message without an image."


class LlamaCppEngine:
    """The engine of the GGUF `model`, with `max_seq_len` tokens of context for each of `slots` answers at a time,
    computed on `threads` CPU threads."""

    compiled = None  # --compile does not apply (launchers/loading.py)
    batcher = None
    failure = None  # llama.cpp failing ends this process, which the web server tells

    def __init__(self, model: GgufModel, max_seq_len: int, slots: int, threads: int):
        self.model, self.slots, self.threads = model, slots, threads
        self.max_seq_len = min(max_seq_len, model.context or max_seq_len)
        self.tokenizer = HFTokenizer(gguf_tokenizer(model))
        self._key = secrets.token_hex(16)
        self._server, self.url = _start_server(model, self.max_seq_len, slots, threads, self._key)
        self._http = httpx.Client(
            timeout=httpx.Timeout(None, connect=10.0), headers={"Authorization": f"Bearer {self._key}"}
        )
        # llama.cpp's marker for an image in a text prompt: random for each server, so no typed text can forge one
        self.media_marker = self._http.get(self.url + "/props").json()["media_marker"] if self.sees_images else ""
        self._image_tokens = 0  # the most tokens an image took so far (llama.cpp counts them as it reads the prompt)

    # ----- what the model is -----

    @property
    def sees_images(self) -> bool:
        return self.model.mmproj is not None

    @property
    def chat_renderer(self):
        if not self.tokenizer.hf.chat_template:
            return None
        return MediaMarkers(self.tokenizer.hf, self.media_marker) if self.sees_images else self.tokenizer.hf

    def summary(self) -> EngineSummary:
        path = self.model.path  # an Ollama blob goes by its model's name
        return EngineSummary(
            path=str(path) if path.suffix == ".gguf" else self.model.name,
            context=self.max_seq_len,
            sees_images=self.sees_images,
            architecture=self.model.architecture,
            model_type=self.model.model_type,
            format=self.model.described,
            served_by="llama.cpp",
            dtype="the file's",
            device=f"cpu, {self.threads} threads",
            quant=self.model.file_type,
            weight_mib=self.model.size_bytes / 2**20,
            batching=f"llama.cpp's {self.slots} slot{'s' if self.slots != 1 else ''}",
            image_marker=self.media_marker,
            image_token=self.media_marker,
        )

    def generation_defaults(self) -> Sampling:
        return Sampling()

    def eos_ids(self, stop: tuple[str, ...] = ()) -> set[int]:
        ids = set(self.tokenizer.eos_ids)
        ids.update(i for i in map(self.tokenizer.special_token_id, stop) if i is not None)
        return ids

    def prompt_length(self, prompt: str, images=None, image_transform: str | None = None) -> int:
        """The prompt's tokens: its text's, and for each image the most an image has taken so far (llama.cpp
        counts an image's tokens only as it reads it)."""
        if not images:
            return len(self.tokenizer.encode(prompt, bos=True))
        if not self.sees_images:
            raise UserError(NO_IMAGES)
        return len(self._text_ids(prompt)) + self._image_tokens * len(images)

    def _text_ids(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt.replace(self.media_marker, ""), bos=True)

    def start_batching(self, places: int, cache_bytes: int | None = None) -> str:
        """The answers at a time are llama.cpp's slots, set when it started."""
        return self.summary().batching

    def stop_batching(self) -> None:
        """Nothing to stop: llama.cpp's slots end with the process."""

    def drop_sessions(self, browser_session: str) -> None:
        """Nothing is kept per session here: llama.cpp's slots keep the last prompts they answered."""

    # ----- answers -----

    def complete(self, requests: list[Request]) -> list[Answer]:
        """Whole answers, asked of llama.cpp all at once (its slots run them together)."""
        return collect_at_once(self.stream, requests)

    def stream(self, request: Request) -> Iterator[Event]:
        """The answer's events; never raises: what fails is one sentence."""
        try:
            yield from self._answer(request)
        except UserError as error:
            yield End.failed(str(error), caller_error=True)
        except httpx.HTTPError as error:
            yield End.failed(f"llama.cpp stopped answering ({described(error)}); send the message again.")
        except Exception as error:
            log.exception("The answer failed")
            yield End.failed(failure_sentence(error))

    def _answer(self, request: Request) -> Iterator[Event]:
        if request.adapter:
            raise UserError("LoRA adapters are not served over a GGUF model; ask the model alone.")
        prompt, text_tokens = self._prompt(request.prompt, request.images or [])
        length = text_tokens + self._image_tokens * len(request.images or [])
        room = answer_room(self.max_seq_len, length, request.sampling.max_new_tokens)
        decode = self.tokenizer.decode_with_specials if request.special_tokens else self.tokenizer.decode
        stream = AnswerStream(decode, self.eos_ids(tuple(request.stop)), list(request.stop), room, request.cancel)
        body = completion_body(prompt, request.sampling, room, request.answer_format, request.logprobs)
        cached, sampled = 0, 0
        with self._http.stream("POST", self.url + "/completion", json=body) as reply:
            if reply.status_code != 200:
                raise UserError(f"llama.cpp refused the request: {_message(reply)}")
            finished = threading.Event()
            threading.Thread(target=close_on_cancel, args=(reply, request.cancel, finished), daemon=True).start()
            try:
                for chunk in _chunks(reply, stream):
                    sampled = self._take(chunk, sampled, stream, request.logprobs)
                    cached = (chunk.get("prompt_progress") or {}).get("cache", cached)
                    length = int(chunk.get("tokens_evaluated") or length)
                    if not stream.done and chunk.get("stop"):
                        stream.finish(FinishReason.LENGTH if chunk.get("stop_type") == "limit" else FinishReason.STOP)
                    if (delta := stream.next_delta(request.logprobs is not None)) is not None:
                        yield delta
                    if stream.done:
                        break
            finally:
                finished.set()
        if not stream.done:
            stream.finish(FinishReason.CANCELLED)
        if request.images:  # the most tokens an image took (`length`: the prompt's tokens as llama.cpp counted them)
            self._image_tokens = max(self._image_tokens, (length - text_tokens) // len(request.images))
        yield End(**stream.summary(length), cached_tokens=cached)

    def _prompt(self, text: str, images: list) -> tuple[list[int] | dict, int]:
        """(the prompt as llama.cpp takes it, its text's tokens): token ids; or, with images, the text with a media
        marker at each image (in front where the template placed none) and the images."""
        if not images:
            ids = self.tokenizer.encode(text, bos=True)
            return ids, len(ids)
        if not self.sees_images:
            raise UserError(NO_IMAGES)
        if self.media_marker not in text:  # a template with no place for images: they go first (Accessory's way)
            text = self.media_marker * len(images) + text
        bos = self.tokenizer.hf.bos_token
        if bos and self.tokenizer.adds_bos and text.startswith(bos):  # llama.cpp adds the BOS itself
            text = text[len(bos) :]
        data = [base64.b64encode(png_bytes(image)).decode() for image in images]
        return {"prompt_string": text, "multimodal_data": data}, len(self._text_ids(text))

    def _take(self, chunk: dict, sampled: int, stream: AnswerStream, logprobs: int | None) -> int:
        """Push the answer's tokens a chunk brings into `stream`, with their log-probabilities where the request asked
        for `logprobs` alternatives; gives how many tokens llama.cpp has sampled by then."""
        tokens, sampled = self._tokens_of(chunk, sampled)
        if logprobs is not None:
            stream.logprobs += self._token_logprobs(tokens, chunk.get("completion_probabilities") or [], logprobs)
        for token in tokens:
            stream.push(token)
            if stream.done:
                break
        return sampled

    def _token_logprobs(self, tokens: list[int], probabilities: list[dict], alternatives: int) -> list[TokenLogprob]:
        """Each of a chunk's tokens' log-probability (llama.cpp's, over the model's whole distribution) and the
        likeliest `alternatives`, their texts decoded as the local engine decodes them. llama.cpp reports the token it
        sends; the tokens it held back (they ended inside a character) it reports nowhere: theirs are unknown (None)."""
        reported = {int(p["id"]): p for p in probabilities[-1:]}
        out = []
        for at, token in enumerate(tokens):
            probability = reported.get(token) if at == len(tokens) - 1 else None
            if probability is None:
                out.append(TokenLogprob(token, self._text(token), None))
                continue
            top = [(self._text(int(t["id"])), float(t["logprob"])) for t in probability["top_logprobs"][:alternatives]]
            out.append(TokenLogprob(token, self._text(token), float(probability["logprob"]), top))
        return out

    def _text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def _tokens_of(self, chunk: dict, sampled: int) -> tuple[list[int], int]:
        """(the answer's tokens a chunk brings, how many llama.cpp has sampled by then). A token that ends inside a
        character is held back by llama.cpp's stream, and only the token that completes the character comes, with
        the text of them all: the text is then tokenized here (the same text; the ids of a re-tokenization). A chunk
        telling the prompt's progress brings none (its "tokens" holds a placeholder)."""
        if "prompt_progress" in chunk:
            return [], sampled
        tokens = [int(token) for token in chunk.get("tokens") or ()]
        now = int(chunk.get("tokens_predicted") or sampled + len(tokens))
        if tokens and now - sampled > len(tokens):
            tokens = self.tokenizer.encode(chunk.get("content") or "", bos=False)
        return tokens, now


def _chunks(reply, stream: AnswerStream) -> Iterator[dict]:
    """llama.cpp's streamed chunks; a stream closed by Stop just ends."""
    try:
        for chunk in server_events(reply):
            if isinstance(chunk.get("error"), dict):
                raise UserError(f"llama.cpp ended the answer with an error: {chunk['error'].get('message')}")
            yield chunk
    except httpx.HTTPError:
        if not stream.cancelled():
            raise


def _message(reply) -> str:
    reply.read()
    try:
        error = reply.json().get("error")
        return str(error.get("message") if isinstance(error, dict) else error)
    except ValueError:
        return reply.text[:300] or f"HTTP {reply.status_code}"


def completion_body(
    prompt: list[int] | dict, sampling: Sampling, room: int, answer_format: AnswerFormat | None, logprobs: int | None
) -> dict:
    """llama.cpp's /completion request for an answer to `prompt` (token ids, or text with images): its tokens
    streamed back by id."""
    body = {
        "prompt": prompt,
        "n_predict": room,
        "stream": True,
        "return_tokens": True,
        "cache_prompt": True,
        "return_progress": True,  # the prompt tokens its cache held, before the first token (none with each token)
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "min_p": 0.0,
        "repeat_penalty": sampling.repetition_penalty,
        "seed": sampling.seed if sampling.seed is not None else secrets.randbelow(2**31),
    }
    if logprobs is not None:  # each token's log-probability over the model's distribution, before sampling
        body.update(n_probs=max(logprobs, 1), post_sampling_probs=False)
    if sampling.greedy:  # the likeliest token: no sort of the whole vocabulary for top_p at every step
        body.update(top_k=1, top_p=1.0)
    if answer_format is not None:
        body["grammar"] = "%llguidance {}\n" + _lark(answer_format)
    return body


def _lark(answer_format: AnswerFormat) -> str:
    """The answer's format in llguidance's Lark, which llama.cpp's llguidance sampler takes."""
    if answer_format.kind == "lark":
        return answer_format.grammar
    schema = {**answer_format.held_schema, "x-guidance": json_options()}
    return f"start: %json {json.dumps(schema)}"


class MediaMarkers:
    """The chat renderer of a GGUF model that sees images: its chat template, with each image part of a message
    given to it as a text part holding llama.cpp's media marker (as llama.cpp's own chat endpoint renders one), so
    the prompt holds one marker where each image goes, whatever the family's own image tokens are."""

    def __init__(self, tokenizer, marker: str):
        self.tokenizer, self.marker = tokenizer, marker

    @property
    def chat_template(self) -> str:
        return self.tokenizer.chat_template

    def apply_chat_template(self, conversation: list[dict], **kwargs):
        return self.tokenizer.apply_chat_template([self._marked(m) for m in conversation], **kwargs)

    def _marked(self, message: dict) -> dict:
        content = message.get("content")
        if not isinstance(content, list):
            return message
        text = {"type": "text", "text": self.marker}
        return {**message, "content": [text if p.get("type") == "image" else p for p in content]}


def _start_server(model: GgufModel, context: int, slots: int, threads: int, key: str):
    """llama.cpp's server over `model`, in this process: (the server, its address), once it has loaded."""
    try:
        import xllamacpp
    except ImportError as error:
        raise UserError(f"{model.path.name} is a GGUF file; serving one needs llama.cpp: `{INSTALL}`.") from error
    params = xllamacpp.CommonParams()
    params.model.path = str(model.path)
    if model.mmproj is not None:
        params.mmproj.path = str(model.mmproj)
    params.n_ctx = context * slots
    params.n_parallel = slots
    params.kv_unified = False  # each slot its own context, as --max_seq_len says
    params.fit_params = False  # the context as asked, not fitted by llama.cpp
    params.api_keys = [key]
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
    params.verbosity = int(os.environ.get("LOCAL_CHAT_LLAMA_CPP_VERBOSITY", "0"))
    # llama.cpp's threads share torch's libgomp (one soname): a pool torch left in this thread would make them sleep
    # between their parallel regions instead of spinning (model/cpu_threads.py; llama.cpp's server alone on a 0.5B
    # Q8_0 file, 2 cores: 21.6 tokens/s after a matmul in its starting thread, 28.7 with the pool handed back)
    hand_back_workers()
    server = xllamacpp.Server(params)
    address = server.listening_address  # "http://127.0.0.1:PORT": the port is the system's choice
    url = address if address.startswith("http") else "http://" + address
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        time.sleep(START_POLL_S)
    raise UserError(f"llama.cpp did not load {model.path.name} in {START_TIMEOUT_S:.0f} s.")
