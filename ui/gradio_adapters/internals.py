"""Every Gradio internal Owlet reads, named once, and the one way Owlet replaces one.

Gradio keeps state and behaviour that the page's defences depend on in attributes outside its public API: its
queue's bookkeeping, the names it gives event tasks, a tab's state holder, a chat event's raw data, its login
cookies. Each is read here, by name, and nowhere else in ``ui/``. A read raises ``NotAdaptable`` when Gradio no
longer has it, or returns None where its caller then refuses (no login, no message index): never a default that
would quietly turn a defence into a no-op. The ``check_*`` functions here run at start-up through the registry
(``ui.gradio_adapters.registry``), so on the verified Gradio no read fails at run time.

An adapter that replaces a Gradio attribute does it with ``replace``: it refuses when the attribute is not there,
and returns a ``Patch`` that the registry checks is still in place once the page is built.

The queue maps (``gradio.queueing.Queue``):

- ``pending_event_ids_session``: session hash → ids of its events whose completion the client has not read yet
  (queued, running, or finished but unread);
- ``event_ids_to_events``: event id → the event, while it is queued or running;
- ``pending_messages_per_session``: session hash → the messages waiting for its stream (``tab_queues``);
- ``event_queue_per_concurrency_id``: the waiting lines, and ``active_jobs``: the events running now
  (``fair_event_slots``).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass


class NotAdaptable(Exception):
    """A Gradio internal an adaptation needs is missing, or not of the shape the adaptation was written for."""


@dataclass(frozen=True)
class Patch:
    """One attribute of Gradio's that Owlet replaced: ``owner.attribute`` is ``value`` while the patch holds."""
    owner: object
    attribute: str
    value: object

    def in_place(self) -> bool:
        return getattr(self.owner, self.attribute, None) is self.value

    def __str__(self) -> str:
        return f"{_name(self.owner)}.{self.attribute}"


def _name(owner) -> str:
    if inspect.ismodule(owner) or inspect.isclass(owner):
        return owner.__name__
    return type(owner).__name__


def require(owner, attribute: str):
    """``owner.attribute``, or ``NotAdaptable`` naming what is missing."""
    try:
        return getattr(owner, attribute)
    except AttributeError:
        raise NotAdaptable(f"{_name(owner)}.{attribute} is missing") from None


def require_type(owner, attribute: str, kind):
    """``owner.attribute`` when it is a ``kind``; ``NotAdaptable`` otherwise."""
    value = require(owner, attribute)
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise NotAdaptable(f"{_name(owner)}.{attribute} is a {type(value).__name__}, not a {names}")
    return value


def require_parameters(owner, attribute: str, names: tuple[str, ...]):
    """``owner.attribute`` when it is a callable taking (at least) parameters ``names``."""
    function = require(owner, attribute)
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        raise NotAdaptable(f"{_name(owner)}.{attribute} is not a function") from None
    missing = [name for name in names if name not in parameters]
    if missing:
        raise NotAdaptable(f"{_name(owner)}.{attribute} takes no {', '.join(missing)}")
    return function


def replace(owner, attribute: str, value) -> Patch:
    """Set ``owner.attribute`` to ``value`` (the attribute must exist, and be callable if ``value`` is)."""
    original = require(owner, attribute)
    if callable(value) and not callable(original):
        raise NotAdaptable(f"{_name(owner)}.{attribute} is not callable")
    setattr(owner, attribute, value)
    return Patch(owner, attribute, value)


# ---- the queue ------------------------------------------------------------------------------------------------

def queue_of(page):
    """The page's ``gradio.queueing.Queue`` (made by ``page.queue(...)``)."""
    return require(page, "_queue")


def pending_by_session(queue) -> dict:
    """The live ``session hash → pending event ids`` map (mutable: callers may drop a session from it)."""
    return require(queue, "pending_event_ids_session")


def pending_events(queue, session_hash: str):
    """Ids of the session's events whose completion its client has not read (running ones included)."""
    return pending_by_session(queue).get(session_hash) or ()


def live_events(queue) -> dict:
    """``event id → event`` for events still queued or running."""
    return require(queue, "event_ids_to_events")


def message_queues(queue):
    """``session hash → messages waiting for the session's stream``."""
    return require(queue, "pending_messages_per_session")


def has_message_queue(queue, session_hash: str) -> bool:
    """Whether Gradio keeps a message queue for the session, so a stream of it has something to read."""
    return session_hash in message_queues(queue)


def waiting_lines(queue) -> list[list]:
    """Each concurrency id's line of waiting events, oldest first (the lists themselves: reordering them reorders
    Gradio's queue)."""
    return [line.queue for line in require(queue, "event_queue_per_concurrency_id").values()]


def running_events(queue) -> list:
    """The events running in Gradio's slots now."""
    return [event for job in require(queue, "active_jobs") if job for event in job]


def enqueue_time(event) -> float:
    """When the event joined the queue (``time.monotonic()``)."""
    return event.enqueue_time


def request_of(event):
    """The HTTP request that joined the event (what ``ClientAddresses`` reads the client's address from)."""
    return event.request


def event_task_name(session_hash: str, fn_index, event_id: str) -> str:
    """The name Gradio's queue gives the asyncio task running an event (``set_task_name``)."""
    return f"{session_hash}_{fn_index}<gradio-sep>{event_id}"


def check_queue_reads(page) -> None:
    """The queue maps the tab guard reads are there, and the queue names event tasks as ``event_task_name`` does."""
    from gradio import queueing

    queue = queue_of(page)
    require_type(queue, "pending_event_ids_session", dict)
    require_type(queue, "event_ids_to_events", dict)
    messages = message_queues(queue)
    if not all(hasattr(messages, method) for method in ("__contains__", "__setitem__", "items")):
        raise NotAdaptable(f"Queue.pending_messages_per_session is a {type(messages).__name__}, not a mapping")

    class Task:
        name = None

        def set_name(self, name: str) -> None:
            self.name = name

    task, expected = Task(), event_task_name("tab", 3, "event")
    try:
        require(queueing, "set_task_name")(task, "tab", 3, "event", False)
    except TypeError as exc:
        raise NotAdaptable(f"gradio.queueing.set_task_name takes other arguments: {exc}") from None
    if task.name != expected:
        raise NotAdaptable(f"gradio.queueing.set_task_name names an event's task {task.name!r}, not {expected!r}")


# ---- events, tabs, logins, launch -------------------------------------------------------------------------------

def event_data(data):
    """The raw payload of a ``gr.EventData`` (a chat's retry or edit: ``{"index": ..., "value": ...}``). Read past
    ``EventData.__getattr__``, which itself looks in the payload."""
    try:
        return object.__getattribute__(data, "_data")
    except AttributeError:
        return None


def check_event_data() -> None:
    import gradio as gr

    if event_data(gr.EventData(None, {"index": 1})) != {"index": 1}:
        raise NotAdaptable("gr.EventData keeps its payload elsewhere than _data")


def session_config(state) -> tuple[dict, dict]:
    """A tab's (``SessionState``'s) components by id, and their config values by id."""
    return require(require(state, "blocks_config"), "blocks"), require(state, "config_values")


def state_holder(page):
    """The page's ``StateHolder`` (every tab's ``gr.State``), made by ``page.launch()``."""
    return require(page, "state_holder")


LOGIN_COOKIES = ('f"access-token-{app.cookie_id}"', 'f"access-token-unsecure-{app.cookie_id}"')


def login_tokens(app) -> dict | None:
    """The access tokens of the logins Gradio's app has accepted (None: not Gradio's app)."""
    return getattr(app, "tokens", None)


def login_cookie_names(app) -> tuple[str, ...]:
    """The cookies in which a browser presents its access token to Gradio's app."""
    cookie_id = getattr(app, "cookie_id", None)
    return (f"access-token-{cookie_id}", f"access-token-unsecure-{cookie_id}")


def check_login_cookies(page) -> None:
    """Gradio's app keeps its login tokens and cookie id where ``login_tokens`` reads them, and names the cookies
    as ``login_cookie_names`` does."""
    from gradio import routes

    app = require(page, "app")
    require_type(app, "tokens", dict)
    require_type(app, "cookie_id", str)
    source = inspect.getsource(routes)
    missing = [cookie for cookie in LOGIN_COOKIES if cookie not in source]
    if missing:
        raise NotAdaptable(f"gradio.routes no longer sets the cookie {missing[0]}")


SKIP_URL_CHECK = {"_frontend": False}  # launch() then skips networking.url_ok (the only thing the flag gates)


def check_launch_flag(page) -> None:
    require_parameters(page, "launch", tuple(SKIP_URL_CHECK))
