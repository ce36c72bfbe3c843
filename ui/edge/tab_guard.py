"""A tab's session hash is bound to the network that first used it, and Gradio's routes that act on a whole tab
by its hash need more than the hash.

A tab's session hash is made up by its client and sent in every request, so Owlet never treats it as an identity
(``ui.identity``). Gradio's queue does, though: whoever names a session hash can join events to it, read its
stream, and end its events, in more ways than one:

- ``POST /gradio_api/cancel`` ends *every* running task of ``(session_hash, fn_index)`` before it looks at the
  ``event_id`` (and, for an id that is not pending, never tells the tab's client that its event ended, so that
  client waits forever). An event of one's own, joined to the victim's hash, made any id "pending";
- a stream of the session (``GET /gradio_api/queue/data``, or ``GET /gradio_api/call/<api>/<id>``, which falls back
  to the id as a session hash) that is opened and closed ends all the session's events, and one that stays open
  takes the tab's messages;
- when any heartbeat of a session closes, Gradio ends all its events.

So the first request that names a session hash binds it to the client's address (``ui.identity.ClientAddresses``,
as every per-address limit counts it), and a request naming that hash from another address is refused (403) before
Gradio runs. Within one address (people behind one NAT, and every visitor of a share link, which arrive as one
address) the hash stays the tab's secret, so on top of that: a cancel passes only with an event id pending in
that session, and ends that event only; and a session holds one heartbeat at a time (409 for another).

And two requests that cost the page more than they should: a queue stream, or an API result stream, of a session
the queue does not know starts a 200 stream in Gradio, then fails inside it with a logged traceback (about 9 ms of
the event loop and 6 KB of log a request, ten times a plain 404). They are answered 404 here, before Gradio runs, as
Gradio would have answered them.

What the hash still gives someone on the same address is documented in docs/security.md ("Known limits").
"""
from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ui.edge.request_body import buffered, json_object, replaying, session_hash_of
from ui.edge.tab_budget import SESSION_HASH
from ui.gradio_adapters.internals import (event_task_name, has_message_queue, live_events, pending_by_session,
                                         pending_events)
from ui.identity import DIRECT, ClientAddresses
from ui.shared.refusals import TOO_MANY_UNREAD_EVENTS, refusal

CANCEL_PATH = "/gradio_api/cancel"
JOIN_PATH = "/gradio_api/queue/join"
QUEUE_DATA_PATH = "/gradio_api/queue/data"
HEARTBEAT_PREFIX = "/gradio_api/heartbeat/"
CALL_PREFIX = "/gradio_api/call/"
# POSTs whose JSON body may name a session hash (the direct API routes take one too).
NAMING_POSTS = (CANCEL_PATH, JOIN_PATH)
NAMING_POST_PREFIXES = (CALL_PREFIX, "/gradio_api/run/", "/gradio_api/api/")

NOT_PENDING = "No such event is running in this session."
HEARTBEAT_TAKEN = "This page session is already open in another connection. Reload the page."
# Gradio keeps every message of an event until the session's stream reads its completion; a tab reads at once, so
# it has one or two events pending. Past this many, a session's next event is refused: a client that never read
# its stream kept every answer (and every question a refusal handed back) in the page's memory.
MAX_UNREAD_EVENTS = 8
TOO_MANY_UNREAD = ("This page session has too many answers that were never read. Read its stream "
                   "(/gradio_api/queue/data), or reload the page.")
NOT_YOURS = "This page session was opened from another network. Reload the page to start your own."
NOT_FOUND = "Session not found."


class TabGuard:
    """ASGI middleware over Gradio's app; ``queue`` is the page's Gradio ``Queue`` (its pending events and message
    queues). ``remembered`` bindings are kept; the least recently used one with nothing pending goes first (a
    session that comes back after its binding was forgotten is bound again by its next event)."""

    def __init__(self, app: ASGIApp, queue, addresses: ClientAddresses = DIRECT, remembered: int = 50_000,
                 heartbeats: set[str] | None = None) -> None:
        self.app, self.queue, self.addresses, self.remembered = app, queue, addresses, remembered
        self._bound: OrderedDict[str, str] = OrderedDict()
        # Sessions with an open heartbeat, i.e. a tab the page has open (shared with ui.gradio_adapters.tab_states).
        self._heartbeats: set[str] = set() if heartbeats is None else heartbeats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope.get("path", ""), scope.get("method", "")
        if method == "POST" and (path in NAMING_POSTS or path.startswith(NAMING_POST_PREFIXES)):
            return await self._naming_post(path, scope, receive, send)
        if method == "GET" and path.startswith(HEARTBEAT_PREFIX):
            return await self._heartbeat(path[len(HEARTBEAT_PREFIX):].strip("/"), scope, receive, send)
        if method == "GET" and path == QUEUE_DATA_PATH:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            named = query.get("session_hash", [])
            # Exactly one: with two, this would check one and Gradio read the other (it takes the last).
            return await self._stream(named[0] if len(named) == 1 else "", scope, receive, send)
        if method == "GET" and path.startswith(CALL_PREFIX) and "/" in path[len(CALL_PREFIX):].strip("/"):
            # <api>/<event id>, and Gradio's /call/v2/<api>/<event id> too: the event id is the last segment
            return await self._stream(self._session_of_event(path.rstrip("/").rsplit("/", 1)[1]), scope, receive, send)
        await self.app(scope, receive, send)

    # ---- the binding ------------------------------------------------------------------------------------

    def bind(self, session_hash: str, scope: Scope, new: bool = True) -> bool:
        """Whether the request may name ``session_hash``: it is bound to this request's address, or unbound (then
        it is bound now, if ``new``: only requests that open sessions bind, and those pass the new-tab budget
        and its hash format first, so one address cannot grow the map or flush it at network speed)."""
        address = self.addresses.of(Request(scope))
        owner = self._bound.get(session_hash)
        if owner is not None:
            self._bound.move_to_end(session_hash)
            return owner == address
        if new and SESSION_HASH.fullmatch(session_hash):
            self._bound[session_hash] = address
            self._forget_idle()
        return True

    def _forget_idle(self) -> None:
        """Keep ``remembered`` bindings: the least recently used one without a pending event or an open
        heartbeat goes first; a live session's binding is never forgotten (the map grows instead)."""
        if len(self._bound) <= self.remembered:
            return
        live = pending_by_session(self.queue)
        idle = next((s for s in self._bound if not live.get(s) and s not in self._heartbeats), None)
        if idle is not None:
            del self._bound[idle]

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await PlainTextResponse(NOT_YOURS, status_code=403)(scope, receive, send)

    # ---- the routes -------------------------------------------------------------------------------------

    async def _naming_post(self, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        body, replay, complete = await buffered(receive)  # bounded: the page's body limits sit outside this
        if not complete:
            return
        request = json_object(body, scope)  # parsed once per request: the new-tab budget parsed it already
        session_hash = session_hash_of(request)
        cancel = path == CANCEL_PATH  # a cancel opens no session: it binds nothing
        if session_hash is not None and not self.bind(session_hash, scope, new=not cancel):
            return await self._refuse(scope, receive, send)
        opens_event = path == JOIN_PATH or path.startswith(CALL_PREFIX)  # /call/<api> joins the queue as well
        if opens_event and session_hash is not None and self._unread(session_hash) >= MAX_UNREAD_EVENTS:
            return await refusal(scope, TOO_MANY_UNREAD_EVENTS, TOO_MANY_UNREAD)(scope, receive, send)
        if cancel:
            if not self.is_pending(request):
                return await JSONResponse({"success": False, "detail": NOT_PENDING}, status_code=404)(scope, receive,
                                                                                                      send)
            body = await self._cancel_only_the_named_event(request)
            replay = replaying(body, receive)
        if path.startswith(CALL_PREFIX) and session_hash is None:
            # Without a session hash, Gradio makes the event's id its session: bind that, before the caller learns it.
            send = self._binding_returned_event(scope, send)
        await self.app(scope, replay, send)

    def _unread(self, session_hash: str) -> int:
        """Events of the session whose completion its client has not read yet (running ones included)."""
        return len(pending_events(self.queue, session_hash))

    def _binding_returned_event(self, scope: Scope, send: Send) -> Send:
        """A ``send`` that binds the event id in a ``/call/<api>`` answer (``{"event_id": ...}``) to the caller's
        address, before the answer's last byte leaves."""
        chunks: list[bytes] = []

        async def binding_send(message) -> None:
            if message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    event_id = (json_object(b"".join(chunks)) or {}).get("event_id")
                    if isinstance(event_id, str) and event_id:
                        self.bind(event_id, scope)
            await send(message)
        return binding_send

    def is_pending(self, request) -> bool:
        """Whether a cancel request names an event that is pending in the session it names."""
        if not isinstance(request, dict):
            return False
        session_hash, event_id = request.get("session_hash"), request.get("event_id")
        if not isinstance(session_hash, str) or not isinstance(event_id, str):
            return False
        return event_id in pending_events(self.queue, session_hash)

    @staticmethod
    async def _cancel_only_the_named_event(request: dict) -> bytes:
        """Cancel the named event's task, and return the cancel for Gradio to finish (its queue entry, the
        client's completion message, the handler's iterator) with an event index no task has: Gradio's own task
        cancel would end every task of the session and event index, an event of one's own joined to someone
        else's session included."""
        name = event_task_name(request["session_hash"], request.get("fn_index"), request["event_id"])
        tasks = [task for task in asyncio.all_tasks() if task.get_name() == name]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return json.dumps({**request, "fn_index": -1}).encode()

    def _session_of_event(self, event_id: str) -> str:
        """The session an API result stream reads, as Gradio finds it: the event's, else the id itself."""
        event = live_events(self.queue).get(event_id)
        if event is not None:
            return event.session_hash
        pending = pending_by_session(self.queue)
        return next((session for session, ids in pending.items() if event_id in ids), event_id)

    async def _stream(self, session_hash: str, scope: Scope, receive: Receive, send: Send) -> None:
        if not has_message_queue(self.queue, session_hash):
            return await PlainTextResponse(NOT_FOUND, status_code=404)(scope, receive, send)
        if not self.bind(session_hash, scope, new=False):  # a known session was bound by the event that opened it
            return await self._refuse(scope, receive, send)
        await self.app(scope, receive, send)

    async def _heartbeat(self, session_hash: str, scope: Scope, receive: Receive, send: Send) -> None:
        # A tab opens its heartbeat and its first event at once, in either order: the event binds the session.
        if not SESSION_HASH.fullmatch(session_hash):
            return await PlainTextResponse(NOT_FOUND, status_code=404)(scope, receive, send)
        if not self.bind(session_hash, scope, new=False):
            return await self._refuse(scope, receive, send)
        if session_hash in self._heartbeats:
            return await PlainTextResponse(HEARTBEAT_TAKEN, status_code=409)(scope, receive, send)
        self._heartbeats.add(session_hash)
        try:
            await self.app(scope, receive, send)
        finally:
            self._heartbeats.discard(session_hash)
