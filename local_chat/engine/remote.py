"""An engine that is another server: vLLM, SGLang, TGI, `transformers serve` or another local-chat, reached over the
OpenAI protocol at `--api_base` (the launchers load no model then). What the page and /v1 offer works against it.

- Chat messages go to `/v1/chat/completions` as they are (the engine applies its own chat template; engine/chats.py
  leaves out the oldest turns that do not fit); raw prompts (the Single-turn tab, Accessory's templates) go to
  `/v1/completions`. Images go as `data:` URLs.
- Stop (or a client gone) closes the request's stream: vLLM, SGLang, TGI and local-chat abort a request whose client
  leaves. Stop strings are cut here too, exactly as the local engines cut them, whatever the engine does with them.
- The context is what `/v1/models` says (vLLM's `max_model_len`, local-chat's `context_length`), else unknown (the
  engine's own 400 then shows). Prompts are counted with the engine's `/tokenize` where it has one (vLLM, SGLang,
  local-chat), else estimated from the characters per token of the last answer's `usage.prompt_tokens`.
- An engine that cannot be reached at start-up is one sentence (the launcher exits 1); one that goes down mid-answer
  ends that answer with a sentence, and the next request reaches it again once it is back. An engine's 4xx is shown
  with its own message.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import httpx

from local_chat.errors import UserError, described
from local_chat.model.detokenize import StopCutter
from local_chat.prompting.chat import image_parts, message_text
from local_chat.prompting.response_formats import Region

from .interface import (
    Answer,
    Delta,
    End,
    EngineSummary,
    Event,
    FinishReason,
    Reasoning,
    Request,
    Sampling,
    collect_at_once,
)
from .openai_wire import (
    chunk_logprobs,
    engine_message,
    finish_from_wire,
    prompt_characters,
    raw_think_splitter,
    reasoning_and_calls,
    request_fields,
    server_events,
    transport_errors,
)

CONNECT_TIMEOUT_S = 10.0
CANCEL_POLL_S = 0.02  # how often an answer's cancel flag is looked at while the engine is silent
TEMPLATE_TOKENS = 256  # more than any chat template adds around a short conversation's messages
CHARS_PER_TOKEN = 4.0  # the estimate of a prompt's tokens until the engine's first usage says better
UNKNOWN_CONTEXT = 1 << 20  # an engine that does not say its context: never shortened here, its own 400 shows
CONTEXT_FIELDS = ("max_model_len", "context_length", "max_context_length", "max_total_tokens", "context_window")
IMAGES_NEED_MESSAGES = "Images go to the engine with its chat template: choose the template chat_template."


class EngineTemplate:
    """The `chat_renderer` of an engine that applies its model's chat template itself (see templates/multi_turn.py)."""

    applied_by_engine = True
    chat_template = "the engine's own"


class TokenEstimate:
    """The `tokenizer` of a remote engine: it counts a text's tokens (prompting/'s history cuts), nothing else."""

    def __init__(self, engine: RemoteEngine):
        self._engine = engine

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        return [0] * self._engine.estimated_tokens(len(text))


def shown_url(url: str) -> str:
    """`url` without a user name or password, as the page and the terminal show it."""
    parts = urlsplit(url)
    return (
        urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))
        if parts.hostname
        else url
    )


class RemoteEngine:
    """The engine (engine/interface.py) of a model another server serves over the OpenAI protocol."""

    def __init__(
        self,
        api_base: str,
        api_key: str | None = None,
        model: str | None = None,
        sees_images: bool = False,
        context: int | None = None,
    ):
        """`context`: the model's, in tokens, where the engine's /v1/models does not say it."""
        from openai import OpenAI

        self.api_base = api_base.rstrip("/")
        self.url = shown_url(self.api_base)
        self._key = api_key or "none"
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        self.client = OpenAI(base_url=self.api_base, api_key=self._key, max_retries=0, timeout=timeout)
        card = self._model_card(model)
        self.model = card["id"]
        said = next((card[f] for f in CONTEXT_FIELDS if isinstance(card.get(f), int) and card[f] > 0), None)
        self._context_given = context
        context = said or context
        self.context_known = context is not None
        self.max_seq_len = context or UNKNOWN_CONTEXT
        self.sees_images = sees_images
        self.chat_renderer = EngineTemplate()
        self.tokenizer = TokenEstimate(self)
        self.failure = None  # an engine that is down fails each request, not the app
        self._chars_per_token = CHARS_PER_TOKEN
        self._optional_refused = False  # the engine refused top_k / repetition_penalty / stream_options once
        self._http = httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {self._key}"})
        self.counts_with_tokenize = self._tokenize({"prompt": "Hi"}) is not None

    def serving(self, model: str) -> RemoteEngine:
        """The engine of another of this engine's models, with the same address, key and flags."""
        return RemoteEngine(self.api_base, self._key, model, self.sees_images, self._context_given)

    # ----- facts -----

    def _model_card(self, wanted: str | None) -> dict:
        """The engine's `/v1/models` entry for `wanted` (default: its first model)."""
        import openai

        try:
            cards = [card.to_dict() for card in self.client.models.list()]
        except openai.APIConnectionError as error:
            raise UserError(
                f"The engine at {self.url} cannot be reached ({described(error.__cause__ or error)}); start it, or "
                "check --api_base (its OpenAI address, for example http://127.0.0.1:8000/v1)."
            )
        except openai.AuthenticationError:
            raise UserError(f"The engine at {self.url} refused the key (401); pass its key with --api_base_key.")
        except openai.NotFoundError:
            raise UserError(
                f"{self.url} has no /models: is --api_base the engine's OpenAI address, ending in /v1 (for example "
                "http://127.0.0.1:8000/v1)?"
            )
        except openai.APIError as error:
            raise UserError(f"The engine at {self.url} answered its model list with an error: {engine_message(error)}")
        if not cards:
            raise UserError(f"The engine at {self.url} serves no model (its /v1/models is empty); load one there.")
        if wanted is None:
            return cards[0]
        card = next((card for card in cards if card.get("id") == wanted), None)
        if card is None:
            names = ", ".join(str(card.get("id")) for card in cards)
            raise UserError(f"The engine at {self.url} has no model {wanted!r}; pass --model with one of: {names}.")
        return card

    def summary(self) -> EngineSummary:
        return EngineSummary(
            path=self.model,
            context=self.max_seq_len,
            sees_images=self.sees_images,
            engine_url=self.url,
            context_known=self.context_known,
            architecture="served by an engine",
            batching="the engine's",
        )

    def generation_defaults(self) -> Sampling:
        return Sampling()

    def drop_sessions(self, browser_session: str) -> None:
        """Nothing is kept here between turns (the engine caches prefixes itself where it can)."""

    # ----- prompt lengths -----

    def prompt_length(self, prompt: str, images=None, image_transform: str | None = None) -> int:
        """A raw prompt's tokens: counted by the engine's /tokenize where it has one, else estimated (see
        `messages_length`)."""
        if images:
            raise UserError(IMAGES_NEED_MESSAGES)
        return self._length(len(prompt.encode()), len(prompt), {"prompt": prompt})

    def messages_length(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        """The tokens of chat messages (images as `data:` URLs, as engine/chats.py hands them over) with the engine's
        template and `tools`: counted by its /tokenize, else estimated."""
        texts = [json.dumps(tools)] if tools else []
        texts += [message_text(m.get("content")) + str(m.get("reasoning_content") or "") for m in messages]
        images = any(image_parts(m) for m in messages)
        size = sum(len(t.encode()) for t in texts) + (self.max_seq_len if images else 0)
        body = {"messages": messages, "add_generation_prompt": True, **({"tools": tools} if tools else {})}
        return self._length(size, sum(map(len, texts)), body)

    def _length(self, size: int, characters: int, body: dict) -> int:
        """A prompt's tokens, counted where it may not fit: one of `size` bytes (no tokenizer makes more tokens than
        UTF-8 bytes, and a template adds less than `TEMPLATE_TOKENS`) that surely fits in half the context is only
        estimated, from its `characters`: counting it would cost a round trip to the engine before every answer, and
        nothing is decided by its exact length (see prompting/messages.py)."""
        surely_fits = size + TEMPLATE_TOKENS <= self.max_seq_len // 2
        counted = self._tokenize(body) if self.counts_with_tokenize and not surely_fits else None
        return counted if counted is not None else self.estimated_tokens(characters)

    def estimated_tokens(self, characters: int) -> int:
        return math.ceil(characters / self._chars_per_token)

    def _tokenize(self, body: dict) -> int | None:
        """The engine's count of a prompt or of messages (vLLM's and SGLang's /tokenize, beside /v1), or None."""
        root = re.sub(r"/v1$", "", self.api_base)
        try:
            reply = self._http.post(root + "/tokenize", json={"model": self.model} | body)
            count = reply.json().get("count") if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return count if isinstance(count, int) else None

    # ----- answers -----

    def complete(self, requests: list[Request]) -> list[Answer]:
        """Whole answers, asked of the engine all at once (it batches them)."""
        return collect_at_once(self.stream, requests)

    def stream(self, request: Request) -> Iterator[Event]:
        import openai

        started = time.perf_counter()
        messages = request.messages
        if request.images and messages is None:
            yield End.failed(IMAGES_NEED_MESSAGES, caller_error=True)
            return
        try:
            reply = self._open(request, messages)
        except openai.APIConnectionError as error:
            yield End.failed(self._unreachable(error))
            return
        except openai.APIStatusError as error:
            yield End.failed(f"The engine refused the request: {engine_message(error)}", error.status_code < 500)
            return
        yield from self._read(reply, request, messages, started)

    def _open(self, request: Request, messages: list[dict] | None):
        """The engine's stream of chunks for `request`. An engine that refuses the optional fields (a 400 with them,
        none without) gets the request again without them, and from then on."""
        import openai

        fields, optional = request_fields(request, messages is not None, self.max_seq_len)
        if self._optional_refused or not optional:
            return self._create(messages, request.prompt, fields)
        try:
            extra_body = fields.get("extra_body", {}) | optional.get("extra_body", {})
            return self._create(
                messages, request.prompt, fields | optional | ({"extra_body": extra_body} if extra_body else {})
            )
        except (openai.BadRequestError, openai.UnprocessableEntityError):  # 422: FastAPI's checks
            reply = self._create(messages, request.prompt, fields)  # its own 400 is the one shown
            self._optional_refused = True
            names = ", ".join([*(k for k in optional if k != "extra_body"), *optional.get("extra_body", {})])
            print(f"note: the engine at {self.url} refuses {names}; they are left out from now on.", file=sys.stderr)
            return reply

    def _create(self, messages: list[dict] | None, prompt: str, fields: dict):
        """The engine's streamed response (raised: its 4xx or 5xx, or a failed connection). Its server-sent events
        are read as JSON here: the `openai` package's typed chunks cost more CPU per token than the rest of the
        front together, which on a machine shared with the engine slowed the engine itself."""
        if messages is not None:
            create = self.client.chat.completions.with_streaming_response.create
            return create(model=self.model, messages=messages, stream=True, **fields).__enter__()
        create = self.client.completions.with_streaming_response.create
        return create(model=self.model, prompt=prompt, stream=True, **fields).__enter__()

    def _read(self, reply, request: Request, messages: list[dict] | None, started: float) -> Iterator[Event]:
        """The answer's events from the engine's chunks: stop strings cut, Stop closing the stream."""

        finished = threading.Event()
        threading.Thread(target=close_on_cancel, args=(reply, request.cancel, finished), daemon=True).start()
        stops = StopCutter(request.stop)
        pieces, pending = 0, []
        usage, finish, first_at = None, None, None
        raw_reasoning = raw_think_splitter(request) if messages is not None else None
        reasoning, answer = Region(Reasoning), Region(Delta)  # whitespace at either end left out, as parsed
        try:
            for chunk in server_events(reply):
                if isinstance(chunk.get("error"), dict):  # an error event in the stream: the engine's own message
                    caller = chunk["error"].get("type") == "invalid_request_error"
                    sentence = chunk["error"].get("message") or "the engine gave no reason"
                    yield End.failed(f"The engine ended the answer with an error: {sentence}", caller)
                    return
                usage = chunk.get("usage") or usage
                choice = (chunk.get("choices") or [None])[0] or {}
                if messages is not None:
                    delta = choice.get("delta") or {}
                    if any(delta.get(k) for k in ("reasoning_content", "reasoning", "tool_calls")):
                        raw_reasoning = None  # the engine parses its answers itself
                    yield from reasoning_and_calls(delta, reasoning)
                piece = (choice.get("delta") or {}).get("content") if messages is not None else choice.get("text")
                if piece and raw_reasoning is not None:
                    split = raw_reasoning.feed(piece)
                    yield from (e for e in split if isinstance(e, Reasoning))
                    piece = "".join(e.text for e in split if isinstance(e, Delta))
                elif piece and messages is not None:  # the answer after the reasoning, trimmed as a parsed one is
                    piece = "".join(e.text for e in answer.chunk(piece))
                if piece:
                    first_at, pieces = first_at or time.perf_counter(), pieces + 1
                    pending += chunk_logprobs(choice.get("logprobs"), messages is not None)
                    if shown := stops.add(piece):
                        yield Delta(shown, pending)
                        pending = []
                    if stops.hit:
                        finish = FinishReason.STOP
                        break
                if choice.get("finish_reason"):
                    finish = finish_from_wire(choice["finish_reason"])
                if request.cancel is not None and request.cancel.is_set():
                    finish = FinishReason.CANCELLED
                    break
        except transport_errors() as error:
            if request.cancel is None or not request.cancel.is_set():
                yield End.failed(
                    f"The engine at {self.url} stopped in the middle of the answer ({described(error)}); the app "
                    "keeps running: send the message again once the engine is back."
                )
                return
            finish = FinishReason.CANCELLED
        finally:
            finished.set()
            reply.close()  # the engine aborts a request whose stream is closed
        if finish is None:
            cancelled = request.cancel is not None and request.cancel.is_set()
            finish = FinishReason.CANCELLED if cancelled else FinishReason.STOP
        if finish != FinishReason.CANCELLED and (tail := stops.finish()):
            yield Delta(tail, pending)  # what might have begun a stop string, at the end: it did not
        if raw_reasoning is not None and finish != FinishReason.CANCELLED:
            yield from raw_reasoning.finish()  # what the splitter held back: the end of a tag that never came
        yield self._end(finish, usage, pieces, prompt_characters(request.prompt, messages), started, first_at)

    renders_messages = True  # chat messages go to the engine as they are (engine/chats.py passes them through)

    def _end(self, finish: FinishReason, usage, pieces: int, prompt_chars: int, started: float, first_at) -> End:
        now = time.perf_counter()
        usage = usage or {}
        prompt_tokens = usage.get("prompt_tokens") or self.estimated_tokens(prompt_chars)
        completion = usage.get("completion_tokens") or pieces
        if usage.get("prompt_tokens"):
            self._chars_per_token = max(0.5, prompt_chars / usage["prompt_tokens"])
        details = usage.get("prompt_tokens_details") or {}
        total, decode = now - started, now - (first_at or now)
        return End(
            finish,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            cached_tokens=details.get("cached_tokens") or 0,
            time_to_first_token=(first_at or now) - started,
            total_time=total,
            tokens_per_second=completion / total if total > 0 else 0.0,
            decode_tokens_per_second=(completion - 1) / decode if completion > 1 and decode > 0 else 0.0,
        )

    def _unreachable(self, error: Exception) -> str:
        return (
            f"The engine at {self.url} cannot be reached ({described(error.__cause__ or error)}); the app keeps "
            "running: send the message again once the engine is back."
        )


def close_on_cancel(reply, cancel: threading.Event | None, finished: threading.Event) -> None:
    """Close `reply` (the engine then aborts the request) once `cancel` is set, even while the engine is silent."""
    if cancel is None:
        return
    while not finished.wait(CANCEL_POLL_S):
        if cancel.is_set():
            reply.close()
            return
