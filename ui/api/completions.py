"""``POST /v1/chat/completions``: one API request, from its key to its last chunk, through the page's own parts.

The API is one more client of the queue, served by the page process, and a request takes the page's path:

1. the key names the caller (``ui.api.api_keys``): its identity, its group (the address, or the login) and its address;
2. the body is read a few large ones at a time (``ui.api.bodies``) and parsed (``ui.api.chat_request``);
3. the caller's address takes one of its answer slots, the same ones the page's answers take
   (``ChatHandlers.event_slots``);
4. each picture is checked as an upload is, in the page's decode pool, with its per-address decode slot;
5. ``OwletClient.submit_messages`` admits the turn in one atomic step (every cap, rate limit and quota), continuing
   the stored conversation the earlier messages match, so the worker's session cache serves the follow-up;
6. the answer is followed through the page's one stream reader and update pacer (``ui.chat.job_follower``), and
   sent whole, or streamed as chunks with keep-alive comments while it waits in the queue.

A client that leaves (a closed connection, a stream dropped mid-answer) cancels the job at once: its engine row is
free within one step. Every refusal is an OpenAI error object with a sentence (``ui.api.errors``).
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, StreamingResponse

from ui.api import responses as shapes
from ui.api.api_keys import ApiKeys
from ui.api.bodies import ApiBodies
from ui.api.chat_request import ChatRequest, RequestLimits, parse_chat_request
from ui.api.errors import ApiError, for_failed_answer, from_exception
from ui.chat.job_follower import follow_job
from ui.shared import wording
from ui.shared.refusals import REFUSAL_CODE
from ui.uploads.image_check import UploadLimits, UploadRejected
from worker.store.jobs import Message, check_image_count

log = logging.getLogger("owlet.ui.api")

DISCONNECT_POLL_S = 0.5  # how often a request waiting for a whole answer checks that its client is still there
RESTARTED_DIFFERENTLY = ("The worker answering you was lost, and the answer started again differently from what was "
                         "already sent. Please ask again.")
CANCELLED = "The answer was cancelled."
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # nginx: pass each event on at once


class ChatCompletions:
    """The route's handler; built once per page from the page's handlers' shared parts (``ui.api.routes``)."""

    def __init__(self, handlers, keys: ApiKeys, metrics):
        config = handlers.config
        self.client, self.config, self.metrics, self.keys = handlers.client, config, metrics, keys
        self.slots, self.decoder = handlers.event_slots, handlers.decoder
        self.hub, self.pacer = handlers.hub, handlers.pacer
        self.request_limits = RequestLimits.from_config(config)
        self.upload_limits = UploadLimits.from_config(config)
        self.bodies = ApiBodies(config.max_request_bytes, config.api_max_request_bytes, config.api_bodies_max_bytes,
                                config.address_max_uploads)

    async def handle(self, request):
        """The route: the answer, whole or streamed, or an OpenAI error object."""
        try:
            caller = self.keys.caller(request)
            chat = await self._read(request, caller.address)
            await self._check_model(chat.model)
            self.slots.acquire(caller.address)
        except HTTPException:  # a body over its cap: the edge answers it (ui.edge.body_limits, ui.edge.api_refusals)
            raise
        except Exception as exc:  # noqa: BLE001 — every refusal is an answer, never a traceback
            return self.refused(exc, request)
        answer = Answer(self, caller, chat)
        try:
            await answer.submit()
        except BaseException as exc:  # its slot is freed whatever stopped it (nothing was admitted: no job to end)
            answer.end()
            if not isinstance(exc, Exception):
                raise
            return self.refused(exc, request)
        if chat.stream:
            return StreamingResponse(answer.chunks(), media_type="text/event-stream", headers=SSE_HEADERS,
                                     background=_Background(answer.end))
        try:
            return await answer.whole(request)
        finally:
            answer.end()

    async def _read(self, request, address: str) -> ChatRequest:
        declared = request.headers.get("content-length", "")
        with self.bodies.reading(address, int(declared) if declared.isdigit() else None):
            raw = await request.body()
            return await asyncio.to_thread(_parse, raw, self.request_limits)

    async def _check_model(self, model: str) -> None:
        served = await asyncio.to_thread(self.client.served_models)
        if served and model not in served:
            raise ApiError(404, f"The model {model!r} is not served here; GET /v1/models lists "
                                f"{', '.join(repr(m) for m in served)}.", "model_not_found", "model")

    def refused(self, exc: BaseException, request=None) -> JSONResponse:
        """The error response for what refused a request (counted; a server error is logged). Its code is left in
        the request's scope for the refusal brake (``ui.edge.refusal_brake``)."""
        error = from_exception(exc)
        if request is not None and error.code:
            request.scope[REFUSAL_CODE] = error.code
        if error.code == "internal_error":
            log.exception("API request failed", exc_info=exc)
        self.metrics.api_requests.labels("refused").inc()
        return error.response()


class Answer:
    """One admitted API turn: its slot, its job, and how it is followed to the end. ``end`` frees the slot and, unless
    the answer ended, cancels the job; it is called once whatever way the request ends (it runs in no await, since
    a cancelled stream's cleanup must not wait)."""

    def __init__(self, api: ChatCompletions, caller, chat: ChatRequest):
        self.api, self.caller, self.chat = api, caller, chat
        self.created = int(time.time())
        self.started = time.monotonic()
        self.job: str | None = None
        self.follow_up = len(chat.messages) > 1
        self.finished = self._ended = False

    async def submit(self) -> None:
        messages, pictures = await self._pictures()
        sub = await asyncio.to_thread(self.api.client.submit_messages, self.caller.user, messages, pictures,
                                      self.chat.sampling, self.caller.group, self.api.hub.started_key)
        self.job = sub.job

    async def _pictures(self) -> tuple[list[Message], dict[str, bytes]]:
        """Each picture checked as an upload is (once per distinct picture); the messages name them by sha256."""
        check_image_count([Message(m.role, "", "x" if m.picture else None) for m in self.chat.messages],
                          self.api.client.settings.max_images_per_request)
        checked: dict[bytes, str] = {}
        pictures: dict[str, bytes] = {}
        for picture in dict.fromkeys(m.picture for m in self.chat.messages if m.picture is not None):
            try:
                image = await self.api.decoder.check_bytes(picture, self.api.upload_limits, self.caller.address)
            except UploadRejected as exc:
                raise ApiError(400, exc.user_message, "invalid_image") from None  # the page's own sentence
            sha = hashlib.sha256(image.data).hexdigest()
            checked[picture], pictures[sha] = sha, image.data
        return [Message(m.role, m.text, checked.get(m.picture)) for m in self.chat.messages], pictures

    # ---- following the job ------------------------------------------------------------------------------------

    async def _progress(self, tick_s: float) -> AsyncIterator:
        """The job's ``Progress`` snapshots (``ui.chat.job_follower``), and None every ``tick_s`` without one."""
        api = self.api
        updates = follow_job(api.client, self.job, hub=api.hub, pacer=api.pacer, poll_s=api.config.queue_poll_s,
                             stall_timeout_s=api.config.stall_timeout_s, started_at=self.started,
                             eta=api.client.eta_s, workers_alive=api.client.workers_alive)
        pending = asyncio.ensure_future(updates.__anext__())
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=tick_s)
                if not done:
                    yield None
                    continue
                try:
                    progress = pending.result()
                except StopAsyncIteration:
                    return
                yield progress
                if progress.finished:
                    return
                pending = asyncio.ensure_future(updates.__anext__())
        finally:
            _close_later(updates, pending)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The streamed answer: a first chunk at once, keep-alives while queued, deltas, the finish, the usage chunk
        when asked, then ``[DONE]``. An error after the stream began is an error event, then ``[DONE]``."""
        yield shapes.sse(shapes.chunk(self.job, self.chat.model, self.created, {"role": "assistant", "content": ""}))
        async with contextlib.aclosing(self._progress(self.api.config.api_keepalive_s)) as progress:
            async for event in self._events(progress):
                yield event
        yield shapes.DONE

    async def _events(self, progress) -> AsyncIterator[bytes]:
        """The events after the first chunk, from the job's progress, until it ends."""
        chat, job, sent = self.chat, self.job, ""
        async for p in progress:
            if p is None:  # proxies and clients keep a silent connection open
                yield shapes.KEEP_ALIVE
                continue
            if not (p.answer.startswith(sent) or sent.startswith(p.answer)):  # a restart that answers differently
                yield shapes.sse(ApiError(503, RESTARTED_DIFFERENTLY, "answer_restarted").body())
                return
            if len(p.answer) > len(sent):
                yield shapes.sse(shapes.chunk(job, chat.model, self.created, {"content": p.answer[len(sent):]}))
                sent = p.answer
            if not p.finished:
                continue
            self.finished = p.state != "lost"  # a stream given up on still holds its job: end() cancels it
            if p.state != "done":
                yield shapes.sse(self._failure(p).body())
                return
            yield shapes.sse(shapes.chunk(job, chat.model, self.created, {},
                                          shapes.FINISH_REASONS.get(p.finish_reason or "", "stop")))
            if chat.include_usage:
                yield shapes.sse(shapes.chunk(job, chat.model, self.created, {}, choices=[],
                                              usage=shapes.usage(p.stats), owlet=self._stats(p)))
            self._record(p)
            return

    async def whole(self, request) -> JSONResponse:
        """The whole answer as one completion; a client that leaves meanwhile cancels it."""
        async with contextlib.aclosing(self._progress(DISCONNECT_POLL_S)) as progress:
            async for p in progress:
                if p is None or not p.finished:
                    if await request.is_disconnected():
                        break
                    continue
                self.finished = p.state != "lost"
                if p.state != "done":
                    return self._failure(p).response()
                self._record(p)
                return JSONResponse(shapes.completion(self.job, self.chat.model, self.created, p.answer,
                                                      p.finish_reason, p.stats, self._stats(p)))
        return ApiError(499, CANCELLED, "client_closed_request").response()

    def _failure(self, p) -> ApiError:
        self.api.metrics.api_requests.labels("error").inc()
        if p.state == "cancelled":
            return ApiError(503, CANCELLED, "cancelled")
        if p.state == "lost":
            return for_failed_answer(None, p.error or wording.WORKER_LOST)
        return for_failed_answer(p.error_kind, p.error or wording.ANSWER_FAILED)

    def _stats(self, p) -> dict:
        return shapes.owlet_stats(p.stats, self.follow_up, p.first_token_s)

    def _record(self, p) -> None:
        m = self.api.metrics
        m.api_requests.labels("done").inc()
        m.observe_done(p.stats, self.follow_up)
        if p.first_token_s is not None:
            m.ttft.observe(p.first_token_s)

    def end(self, cancel: bool = True) -> None:
        """Free the address's answer slot; cancel the job unless it finished (the client left, or the server
        stops). Idempotent, and awaits nothing."""
        if self._ended:
            return
        self._ended = True
        self.api.slots.release(self.caller.address)
        if cancel and self.job is not None and not self.finished:
            self.api.metrics.api_requests.labels("cancelled").inc()
            self.api.metrics.cancels.inc()
            asyncio.get_running_loop().run_in_executor(None, self._cancel)

    def _cancel(self) -> None:
        try:
            self.api.client.cancel(self.caller.user, self.job)
        except Exception:  # noqa: BLE001 — ended meanwhile, or Redis away: the deadline ends it then
            log.warning("cancel of API job %s failed", self.job, exc_info=True)


class _Background:
    """A StreamingResponse background task that runs a plain function: it ends the answer even when the stream
    was cancelled before its first chunk."""

    def __init__(self, func):
        self.func = func

    async def __call__(self) -> None:
        self.func()


def _parse(raw: bytes, limits: RequestLimits) -> ChatRequest:
    """Parse the body (in a thread: a large one takes milliseconds) and read it as a chat request."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise ApiError(400, "The request body is not valid JSON.", "invalid_json") from None
    return parse_chat_request(body, limits)


def _close_later(updates, pending: asyncio.Future) -> None:
    """Stop following without awaiting here (the caller may be a cancelled stream, whose cleanup must not wait): the
    follower's step in flight is cancelled, then its generator closed, which leaves the stream reader and the
    pacer."""
    async def close() -> None:
        pending.cancel()
        with contextlib.suppress(BaseException):
            await pending
        with contextlib.suppress(Exception):
            await updates.aclose()
    try:
        asyncio.get_running_loop().create_task(close())
    except RuntimeError:  # no loop any more: the process is stopping
        pass
