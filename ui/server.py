"""Wire config, worker client, metrics, handlers and page together, and serve them (``serve``).

Gradio's concurrency is configured explicitly here: answer streams have no per-event limit
(``concurrency_limit=None`` in ``ui.app`` and ``default_concurrency_limit=None`` below), so users are never
serialised behind each other; ``max_threads`` bounds how many run at once and ``max_size`` how many more
may wait in Gradio's queue before new ones are told the page is busy.

Public-facing defaults (README "Running it in public"): Gradio's upload limit equals Owlet's own, its upload
cache is cleaned on a schedule (``ui.app``), every other request body is capped (``ui.body_limits``), uploads
have byte budgets per address and in total (``ui.upload_budget``), requests that stay open are limited per address
and uploads must arrive in time (``ui.held_connections``), only the routes the page uses answer
(``ui.public_routes``), ``/metrics`` needs a bearer token
(``ui.ops``), and the client address is the socket peer unless the operator names trusted proxies. Gradio's
own traffic monitoring (``/monitoring``, public by default) is off.
"""
from __future__ import annotations

import gc

from gradio.utils import get_upload_folder
from starlette.middleware import Middleware

from ui.app import CSS, build_page
from ui.body_limits import PageBodyLimits, upload_request_limit
from ui.chat_files import ChatFiles, check_named_files, example_files
from ui.config import DEV_BROWSER_SECRET
from ui.fair_event_slots import share_event_slots_fairly
from ui.cluster_metrics import ClusterCollector
from ui.gradio_costs import (calm_idle_queue, drop_queue_analytics, forget_replaced_components, share_component_schemas,
                             skip_missing_matplotlib)
from ui.handlers import ChatHandlers
from ui.held_connections import HeldConnections
from ui.identity import ClientAddresses
from ui.log_budget import budget_library_warnings
from ui.malformed_inputs import explain_malformed_inputs, usage_by_endpoint
from ui.metrics import UIMetrics
from ui.ops import LoginAttempts, LoginRequired, ops_routes
from ui.page_launch import launch_page
from ui.public_routes import PublicRoutes
from ui.request_errors import RequestErrors
from ui.session_budget import NewSessionBudget, SessionLedger
from ui.session_guard import SessionGuard
from ui.session_queues import keep_sessions_with_answers
from ui.session_states import open_tabs_of
from ui.upload_budget import UploadBudget, UploadLedger
from ui.upload_owners import UploadedPaths, UploadOwners
from ui.upload_cache import limit_files_per_upload, start_upload_dir_sweeper
from ui.upload_room import UploadRoom

NO_SHARE_LINK = ("No public share link: Gradio's share server could not be reached (no internet access here?). "
                 "The page is still served locally at {url}")


def make_client(config):
    """The worker client for this config (imported here so importing ``ui`` never touches Redis)."""
    from worker.client import OwletClient
    from worker.config import Settings

    overrides = {"redis_url": config.redis_url}
    if config.key_prefix:
        overrides["key_prefix"] = config.key_prefix
    return OwletClient(settings=Settings.from_env(**overrides))


def upload_ledger(config) -> UploadLedger:
    """Upload budgets per address and for the page; a cached file lives up to twice the cache TTL."""
    return UploadLedger(config.address_upload_bytes, config.address_upload_window_s,
                        config.upload_cache_max_bytes, 2 * config.upload_cache_ttl_s)


def build(config, client=None):
    """Return ``(page, launch_kwargs, client, metrics)`` without starting anything."""
    skip_missing_matplotlib()
    share_component_schemas()
    limit_files_per_upload()
    client = client or make_client(config)
    metrics = UIMetrics()
    metrics.registry.register(ClusterCollector(client))
    uploads = UploadedPaths()  # who uploaded each path: served files, the files a call names, reopened pictures
    ledger = upload_ledger(config)
    room = UploadRoom(ledger, uploads, get_upload_folder())  # which uploads give way when the budget is full
    handlers = ChatHandlers(client, config, metrics, uploads, room)
    page = build_page(handlers, config)
    explain_malformed_inputs(page, usage_by_endpoint(config.max_new_tokens_cap))
    page.queue(default_concurrency_limit=None, max_size=config.queue_max_size)
    addresses = ClientAddresses.from_config(config)  # what every per-address limit counts
    share_event_slots_fairly(page, addresses, config.address_max_waiting_events, handlers.answer_time)
    calm_idle_queue(page)
    keep_sessions_with_answers(page)
    drop_queue_analytics(page)
    forget_replaced_components(page)
    check_named_files(page, ChatFiles(uploads, addresses, example_files(page)))
    launch_kwargs = dict(
        server_name=config.host,
        server_port=config.port,
        share=config.share,
        auth=list(config.auth) or None,
        auth_message="Sign in to Owlet." if config.auth else None,
        max_threads=config.max_threads,
        # Gradio's limit is the real one: a bigger file is refused before it is written to disk.
        max_file_size=config.max_upload_bytes,
        app_kwargs={"routes": ops_routes(client, metrics, config.metrics_token),
                    # Outermost first: routes the page does not use, oversized bodies, too many held connections
                    # from one address, then (with --auth) too many sign-in attempts and strangers without a
                    # login, then upload budgets (so nobody unauthenticated can spend the page's upload budget),
                    # then new-session budgets (whose body reading is bounded by the body limits), then the
                    # routes that act on a whole tab by its session hash.
                    "middleware": [Middleware(PublicRoutes),
                                   Middleware(PageBodyLimits, max_body_bytes=config.max_request_bytes,
                                              max_upload_bytes=config.max_upload_bytes),
                                   Middleware(HeldConnections, per_address=config.address_max_connections,
                                              upload_timeout_s=config.upload_timeout_s,
                                              addresses=addresses,
                                              per_address_downloads=config.address_max_downloads),
                                   *([Middleware(LoginAttempts,
                                                 ledger=SessionLedger(config.address_logins,
                                                                      config.address_logins_window_s),
                                                 addresses=addresses),
                                      Middleware(LoginRequired)] if config.auth else []),
                                   Middleware(UploadBudget, ledger=ledger,
                                              max_upload_request_bytes=upload_request_limit(config.max_upload_bytes),
                                              addresses=addresses, make_room=room.make_room,
                                              max_arriving=config.address_max_uploads,
                                              arrival_timeout_s=config.upload_timeout_s),
                                   # An uploaded file is served back only to the address that uploaded it.
                                   Middleware(UploadOwners, addresses=addresses, ledger=uploads,
                                              on_stored=room.claim),
                                   Middleware(NewSessionBudget,
                                              ledger=SessionLedger(config.address_new_sessions,
                                                                   config.address_new_sessions_window_s),
                                              addresses=addresses),
                                   # A session hash is bound to the network that first named it (ui.session_guard).
                                   Middleware(SessionGuard, queue=page._queue, addresses=addresses,
                                              heartbeats=open_tabs_of(page)),
                                   # Innermost: what a request's content makes Gradio raise is a 400, not a 500.
                                   Middleware(RequestErrors)]},
        show_error=False,
        # Gradio's /monitoring endpoints are public by default (traffic per endpoint); Owlet's metrics are
        # /metrics, behind a token.
        enable_monitoring=False,
        quiet=True,
        footer_links=[],
        css=CSS,
        ssr_mode=False,
    )
    return page, launch_kwargs, client, metrics


def raise_open_files_limit(wanted: int = 65536) -> int:
    """Every open connection is a file descriptor, and many systems give a process 1,024: raise the soft limit
    toward the hard one, so the per-address caps (ui.held_connections), not the descriptor table, are what a
    crowd meets first. Returns the soft limit now in force."""
    try:
        import resource
    except ImportError:  # not on this platform
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def serve(config, block: bool = True, client=None):
    """Launch the page; prints the local URL (and the share link, or why there is none)."""
    if config.secret == DEV_BROWSER_SECRET and (config.share or config.host not in ("127.0.0.1", "localhost")):
        print("Owlet UI: warning: OWLET_UI_SECRET is the built-in development value; set your own. (Identities "
              "are signed with OWLET_UI_IDENTITY_KEY or a key kept in Redis, not with this.)", flush=True)
    if config.share and not config.trusted_proxies:
        print("Owlet UI: note: behind the share link every visitor arrives from 127.0.0.1 (Gradio's tunnel), so "
              "they all count as one client address for fairness and per-address limits. See README "
              '"Running it in public" (OWLET_UI_TRUSTED_PROXIES).', flush=True)
    page, launch_kwargs, client, _metrics = build(config, client)
    raise_open_files_limit()
    launch_page(page, launch_kwargs)
    budget_library_warnings()  # after launch: uvicorn has configured its loggers by then
    start_upload_dir_sweeper(config.upload_cache_ttl_s)
    # Everything built so far lives as long as the page: keep it out of the garbage collector's full passes, which
    # a request allocating many objects would otherwise set off over the whole heap (tens of ms each).
    gc.freeze()
    print(f"Owlet UI: {page.local_url}", flush=True)
    if config.share:
        if page.share_url:
            print(f"Owlet public link: {page.share_url}", flush=True)
        else:
            print(NO_SHARE_LINK.format(url=page.local_url), flush=True)
    if block:
        try:
            page.block_thread()
        finally:
            client.close()
    return page
