"""The OpenAI-compatible API: /v1/chat/completions, /v1/completions and /v1/models beside the page, on its host
and port (Starlette routes handed to Gradio's FastAPI app), over the same engine as the page.

Chat requests go to the engine as messages, as the page's do (engine/chats.py renders them in the launcher's
template, the oldest turns left out whole when the conversation outgrows the context, and parses the answer), and
reuse the KV cache of the earlier turns of a conversation by its longest cached token prefix (`V1_CACHE_POOL`, a pool of
model/prefix_cache.py). Every answer waits in the one queue of the page and the API (engine/in_order.py).
A client that goes away, streaming or not, cancels its answer.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from local_chat.documents import Shelf
from local_chat.engine import End, Engine, FinishReason, Request, checkpoint_name
from local_chat.engine.chats import ChatEngine
from local_chat.engine.choices.folders import Models, NotLoaded
from local_chat.engine.choices.served import EngineModels
from local_chat.engine.interface import SessionKey
from local_chat.engine.openai_wire import Reply, sse
from local_chat.engine.threaded import in_own_thread
from local_chat.errors import UserError
from local_chat.voice import Voice
from local_chat.web import WebTools

from .audio import AudioAPI
from .documents import with_file_parts
from .requests import APIError, Call, bad, chat_messages, chat_options, completion_prompt, parse_call, parse_json
from .web import NO_WEB, searched, with_web_rounds

V1_CACHE_POOL = SessionKey("", "v1", pool=True)  # conversations matched by their longest cached token prefix
LOAD_COMMENT_S = 1.0  # how often a streamed answer waiting for its model's load says what it waits for
ANSWER_TOKENS_BUDGET = 256  # room kept for the answer when a conversation must be shortened and max_tokens is unset


def model_name(engine: Engine) -> str:
    """The loaded model's name: its checkpoint folder's (nothing else of the server's disk)."""
    return checkpoint_name(engine.summary()) or "model"


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


@dataclass(frozen=True)
class Served:
    """The model that answers one request: its engine (messages rendered), its name, and what to call once the
    answer is over (with --models_dir, the model is held loaded until then)."""

    engine: ChatEngine
    name: str
    release: Callable[[], None] = lambda: None


class OpenAIAPI:
    """The /v1 routes' handlers over `engine`."""

    def __init__(
        self,
        engine: Engine,
        template: str,
        image_transform: str | None,
        max_upload_mb: float,
        api_keys: list[str] | None = None,
        name: str | None = None,
        models: Models | EngineModels | None = None,
        loads: bool = True,
    ):
        """`name`: what /v1 calls the model (default: its folder's name). `models`: with --models_dir, every model
        listed, `engine` being the one named `name`: a request's `model` picks among them, loaded on demand where
        `loads` (with --admins, only the loaded ones answer)."""
        self.engine, self.template, self.image_transform = (
            ChatEngine.over(engine, template, max_upload_mb),
            template,
            image_transform,
        )
        self.max_upload_mb = max_upload_mb
        self.max_body_bytes = int(max_upload_mb * 1e6 * 4 / 3) + 2**20  # one image at the cap, base64, and text
        self.api_keys = [key.encode() for key in api_keys or []]
        self.name = name or model_name(engine)
        self.listed, self.loads = models, loads
        self.created = int(time.time())
        self.shelf = Shelf()  # the documents of file parts, read once (documents/context.py)
        self.web = None  # `web_search_options`' search (web/context.py's WebResearch, --web_search), where there is one
        self.voice = Voice()  # /v1/audio's speech and transcription (voice/: --tts_model, --stt_model)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.model, methods=["GET"]),
            *AudioAPI(self.voice, self._authorize, self.max_upload_mb).routes(),
            Route("/v1/{rest:path}", self.not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
        ]

    # ----- the endpoints -----

    async def chat_completions(self, http: HTTPRequest) -> Response:
        return await self._answer(http, chat=True)

    async def completions(self, http: HTTPRequest) -> Response:
        return await self._answer(http, chat=False)

    async def tokenize(self, http: HTTPRequest) -> Response:
        """vLLM's and SGLang's POST /tokenize: the tokens of a `prompt`, or of `messages` with the template (all their
        turns, whatever their length), and the context: {"count", "max_model_len"}."""
        try:
            self._authorize(http)
            body = parse_json(await self._body(http))
            served = await run_in_threadpool(self._served, body.get("model"))
        except APIError as error:
            return error_response(error)
        try:
            count = await run_in_threadpool(self._count, served.engine, body)
        except UserError as error:
            return error_response(bad(str(error)))
        finally:
            served.release()
        return JSONResponse({"count": count, "max_model_len": served.engine.max_seq_len})

    @staticmethod
    def _count(engine: ChatEngine, body: dict) -> int:
        if "messages" not in body:
            return engine.prompt_length(completion_prompt(body))
        return engine.count(chat_messages(body), chat_options(body, answer_tokens=0))

    async def models(self, http: HTTPRequest) -> Response:
        try:
            self._authorize(http)
        except APIError as error:
            return error_response(error)
        if self.listed is None:
            return JSONResponse({"object": "list", "data": [self._model_card()]})
        cards = [self._model_card(id_, state) for id_, state in self.listed.states()]
        return JSONResponse({"object": "list", "data": cards})

    async def model(self, http: HTTPRequest) -> Response:
        asked = http.path_params["model"]
        try:
            self._authorize(http)
            if self.listed is not None and self.listed.known(asked):
                return JSONResponse(self._model_card(asked, dict(self.listed.states())[asked]))
            if asked != self.name or self.listed is not None:
                raise APIError(404, self._unknown(asked))
        except APIError as error:
            return error_response(error)
        return JSONResponse(self._model_card())

    async def not_found(self, http: HTTPRequest) -> Response:
        return error_response(
            APIError(
                404,
                f"There is no {http.method} {http.url.path} here; the API has POST /v1/chat/completions, "
                "POST /v1/completions, GET /v1/models, GET /v1/models/ID, POST /v1/audio/speech, "
                "POST /v1/audio/transcriptions, POST /v1/audio/translations and POST /tokenize.",
            )
        )

    def _model_card(self, model_id: str | None = None, state: str | None = None) -> dict:
        """A model's card: with --models_dir, its state; else the one model's, with its context. An adapter's
        (--lora) names its base as its `parent`, as vLLM's do."""
        card = {"id": model_id or self.name, "object": "model", "created": self.created, "owned_by": "local-chat"}
        if self.listed is not None and (parent := self.listed.parent_of(card["id"])) is not None:
            card["parent"] = parent
        if state is not None:
            context = self.listed.context_of(card["id"])
            return {**card, "state": state} | ({"max_model_len": context, "context_length": context} if context else {})
        context = self.engine.max_seq_len
        return {**card, "max_model_len": context, "context_length": context}

    # ----- one request -----

    def _unknown(self, asked) -> str:
        if self.listed is not None:
            return self.listed.unknown_sentence(asked)
        return f"There is no model {asked!r} here; this server has {self.name!r}."

    def _served(self, asked) -> Served:
        """The model a request's `model` names, loaded (it may take a while: call it in a thread). Without
        --models_dir, any `model` is answered by the one loaded."""
        if self.listed is None:
            return Served(self.engine, self.name)
        asked = asked or self.name
        if not self.listed.known(asked):
            if self.listed.strict:
                raise APIError(404, self._unknown(asked))
            asked = self.name  # an engine's front: a name its engine does not list is the one --model named
        try:
            lease = self.listed.lease(asked, self.loads)
        except NotLoaded as error:  # --admins: an admin loads it on the page
            raise APIError(409, str(error)) from None
        except UserError as error:  # it could not load
            raise APIError(503, str(error)) from None
        return Served(ChatEngine(lease.engine, lease.template, self.max_upload_mb), asked, lease.release)

    async def _answer(self, http: HTTPRequest, chat: bool) -> Response:
        try:
            self._authorize(http)
            body = parse_json(await self._body(http))
            if self._loads_first(body):
                return StreamingResponse(
                    self._after_the_load(http, body, chat),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"},
                )
            served = await run_in_threadpool(self._served, body.get("model"))
        except APIError as error:
            return error_response(error)
        handed_over = False
        try:
            response = await self._answer_with(served, http, body, chat)
            handed_over = isinstance(response, StreamingResponse)  # released as its stream ends
            return response
        finally:
            if not handed_over:
                served.release()

    def _loads_first(self, body: dict) -> bool:
        """Whether the request is a streamed answer of a --models_dir model that must load first (one this door may
        load): its stream then begins at once, saying what it waits for."""
        asked = body.get("model") or self.name
        return (
            isinstance(self.listed, Models)
            and self.loads
            and body.get("stream") is True
            and isinstance(asked, str)
            and self.listed.known(asked)
            and self.listed.loaded(asked) is None
        )

    async def _after_the_load(self, http: HTTPRequest, body: dict, chat: bool) -> AsyncIterator[str]:
        """A streamed answer after its model's load: meanwhile an SSE comment each LOAD_COMMENT_S (": loading
        MODEL: weights 40%, 12 s"), which clients skip and which keeps them and proxies from timing out; a load
        that fails is an error event, as a failure mid-answer is."""
        asked = body.get("model") or self.name
        loading = asyncio.get_running_loop().run_in_executor(None, self._served, asked)
        try:
            while not loading.done():
                yield f": {self.listed.waiting_sentence(asked)}\n\n"
                await asyncio.wait([loading], timeout=LOAD_COMMENT_S)
        except BaseException:  # the client left during the load: the model, once had, is given back
            loading.add_done_callback(_release_once_served)
            raise
        try:
            served = loading.result()
        except APIError as error:
            yield sse(error.body()) + "data: [DONE]\n\n"
            return
        response = await self._answer_with(served, http, body, chat)
        if not isinstance(response, StreamingResponse):  # refused once the model was known (its context, say)
            served.release()
            yield sse(json.loads(response.body)) + "data: [DONE]\n\n"
            return
        try:
            async for piece in response.body_iterator:  # releases the model as it ends
                yield piece
        finally:
            await response.body_iterator.aclose()

    async def _answer_with(self, served: Served, http: HTTPRequest, body: dict, chat: bool) -> Response:
        engine = served.engine
        try:
            call = parse_call(body, engine.generation_defaults(), engine.max_seq_len, chat)
            request = await run_in_threadpool(self._request, body, call, chat)  # prompt lengths ask the model
            cited = None  # the web pages the answer may cite, with web_search_options
            if chat:
                request.messages, documents = await with_file_parts(engine, request, self.shelf, self.max_upload_mb)
                if call.web_pages is not None:
                    cited = await searched(engine, self.web, request, call.web_pages, first=documents + 1)
                if call.web_tools and self.web is None:
                    raise bad(NO_WEB, "tools")
        except APIError as error:
            return error_response(error)
        except UserError as error:
            return error_response(bad(str(error)))
        if engine.failure is not None:
            return error_response(APIError(503, engine.failure))
        events = engine.stream(request)
        first = await run_in_threadpool(next, events, None)  # a chat's messages rendered, or refused with a 400
        if isinstance(first, End) and first.finish_reason == FinishReason.ERROR:
            return error_response(self._error_of(first, engine))
        events = resumed(first, events)
        if call.web_tools:  # the model's calls of web_search and fetch_page run here
            events = with_web_rounds(engine, request, events, WebTools(self.web))
        reply = Reply(served.name, chat, call.include_usage, call.logprobs, cited)
        watcher = asyncio.create_task(cancel_when_gone(http, request.cancel))
        if call.stream:
            return StreamingResponse(
                self._sse(events, request, reply, watcher, served),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        try:
            async for batch in in_own_thread(events):
                reply.take(batch)
        finally:
            watcher.cancel()
            request.cancel.set()
        if reply.end.finish_reason == FinishReason.ERROR:
            return error_response(self._error_of(reply.end, engine))
        return JSONResponse(reply.whole())

    async def _sse(
        self, events, request: Request, reply: Reply, watcher: asyncio.Task, served: Served
    ) -> AsyncIterator[str]:
        try:
            yield sse(reply.first_chunk())
            async for batch in in_own_thread(events):
                if text := "".join(sse(chunk) for chunk in reply.chunks(batch)):  # what was made meanwhile, one write
                    yield text
            if reply.end.finish_reason == FinishReason.ERROR:
                yield sse(self._error_of(reply.end, served.engine).body())
            elif reply.include_usage:
                yield sse(reply.usage_chunk())
            yield "data: [DONE]\n\n"
        finally:
            watcher.cancel()
            request.cancel.set()  # a client gone mid-stream: the model stops at its next step
            served.release()

    @staticmethod
    def _error_of(end: End, engine: ChatEngine) -> APIError:
        if end.caller_error:
            return bad(end.error)
        return APIError(503 if engine.failure is not None else 500, end.error)

    def _request(self, body: dict, call: Call, chat: bool) -> Request:
        """The engine request for a checked body: a raw prompt, or chat messages (the engine renders them, leaving
        out the oldest turns when they do not fit)."""
        request = Request(
            sampling=call.sampling,
            stop=call.stop,
            image_transform=self.image_transform,
            session=V1_CACHE_POOL,
            logprobs=call.logprobs,
            cancel=threading.Event(),
            answer_format=call.answer_format,
        )
        if not chat:
            request.prompt = completion_prompt(body)
            return request
        budget = call.sampling.max_new_tokens if call.max_tokens_given else ANSWER_TOKENS_BUDGET
        request.messages, request.chat = chat_messages(body), chat_options(body, budget)
        return request

    def _authorize(self, http: HTTPRequest) -> None:
        if not self.api_keys:
            return
        scheme, _, given = http.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not any(hmac.compare_digest(given.strip().encode(), k) for k in self.api_keys):
            raise APIError(401, "The API key is missing or wrong; send the header Authorization: Bearer YOUR_KEY.")

    async def _body(self, http: HTTPRequest) -> bytes:
        """The body, refused once it passes the cap (before it is all read)."""
        limit = self.max_body_bytes
        declared = http.headers.get("content-length")
        too_big = APIError(
            413,
            f"The request body is over {limit / 1e6:.0f} MB; send smaller images (the server's --max_upload_mb is "
            f"{self.max_upload_mb:g}).",
        )
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks, size = [], 0
        async for chunk in http.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)


async def cancel_when_gone(http: HTTPRequest, cancel: threading.Event) -> None:
    """Set `cancel` once the client has disconnected. The request's body is read whole by then, so the next message
    the server gives is "http.disconnect": waited for, not polled (a poll every 20 ms cost the answer's tokens/s about
    1% where the model's threads take every core)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass
    cancel.set()


def _release_once_served(loading: asyncio.Future) -> None:
    if not loading.cancelled() and loading.exception() is None:
        loading.result().release()


def resumed(first, events):
    """`events` with its `first` item, already taken, in front (closing it closes `events`)."""
    try:
        if first is not None:
            yield first
        yield from events
    finally:
        events.close()
