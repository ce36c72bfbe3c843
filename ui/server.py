"""Wire config, worker client, metrics, handlers and page together, and serve them (``serve``).

Gradio's concurrency is configured explicitly here: answer streams have no per-event limit
(``concurrency_limit=None`` in ``ui.app`` and ``default_concurrency_limit=None`` below), so users are never
serialised behind each other; ``max_threads`` bounds how many run at once and ``max_size`` how many more
may wait in Gradio's queue before new ones are told the page is busy.

Public-facing defaults (docs/security.md): the upload route refuses a file over Owlet's limit as it streams in
(``ui.gradio_adapters.upload_parser``), Gradio's upload cache is cleaned on a schedule (``ui.app``), every other
request body is capped (``ui.edge.body_limits``),
uploads have byte budgets per address and in total (``ui.uploads.budget``), requests that stay open are limited
per address and uploads must arrive in time (``ui.edge.held_connections``), only the routes the page uses answer
(``ui.edge.public_routes``), ``/metrics`` needs a bearer token (``ui.ops.endpoints``), and the client address is
the socket peer unless the page sits behind a front it believes: trusted proxies the operator names, or, with
``--share``, Gradio's share tunnel (``ui.identity.ClientAddresses``). Gradio's own traffic monitoring (``/monitoring``,
public by default) is off. Every adaptation of Gradio's internals goes through the registry
(``ui.gradio_adapters.registry``), which refuses to serve when one does not apply.
"""
from __future__ import annotations

import gc

from gradio.utils import get_upload_folder
from starlette.middleware import Middleware

from owlet.allocator import start_trimming
from ui.api.routes import api_routes
from ui.app import build_page
from ui.chat.handlers import ChatHandlers
from ui.edge.api_refusals import ApiErrors
from ui.edge.body_limits import PageBodyLimits, upload_request_limit
from ui.edge.held_connections import HeldConnections
from ui.edge.logins import LoginAttempts, LoginRequired
from ui.edge.public_routes import PublicRoutes
from ui.edge.refusal_brake import RefusalBrake
from ui.edge.request_errors import RequestErrors
from ui.edge.tab_budget import NewTabBudget, NewTabLedger
from ui.edge.tab_guard import TabGuard
from ui.gradio_adapters.event_costs import (calm_idle_queue, drop_queue_analytics, share_component_schemas,
                                            skip_missing_matplotlib)
from ui.gradio_adapters.fair_event_slots import share_event_slots_fairly
from ui.gradio_adapters.front_end import check_front_end
from ui.gradio_adapters.internals import check_event_data, check_login_cookies, check_queue_reads, queue_of
from ui.gradio_adapters.malformed_inputs import explain_malformed_inputs, usage_by_endpoint
from ui.gradio_adapters.named_files import NamedFiles, check_named_files, example_files
from ui.gradio_adapters.registry import (CALM_IDLE_QUEUE, CHAT_EVENT_DATA, FAIR_EVENT_SLOTS, FORGOTTEN_COMPONENTS,
                                         FRONT_END, LOGIN_COOKIES, NAMED_FILES, ONE_FILE_PER_UPLOAD,
                                         QUEUE_ANALYTICS_OFF, READABLE_INPUT_REFUSALS, SHARED_SCHEMAS, TAB_GUARD,
                                         TABS_WITH_ANSWERS, GradioAdaptations, keep_with)
from ui.gradio_adapters.tab_config import forget_replaced_components
from ui.gradio_adapters.tab_queues import keep_tabs_with_answers
from ui.gradio_adapters.tab_states import open_tabs_of
from ui.gradio_adapters.upload_parser import limit_files_per_upload
from ui.identity import ClientAddresses
from ui.ops.cluster_metrics import ClusterCollector
from ui.ops.endpoints import ops_routes
from ui.ops.launch import launch_page
from ui.ops.metrics import UIMetrics
from ui.page_script import page_head
from ui.page_style import CSS
from ui.shared.log_budget import budget_library_warnings
from ui.sign_in import SignInPage
from ui.uploads.budget import UploadBudget, UploadLedger
from ui.uploads.cache_dirs import start_upload_dir_sweeper
from ui.uploads.owners import UploadedPaths, UploadOwners
from ui.uploads.refusal_receipts import RefusalReceipts, UploadRefusalReceipts
from ui.uploads.room import UploadRoom

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
    """Return ``(page, launch_kwargs, client, metrics)`` without starting anything.

    Raises ``GradioNotVerified`` when the installed Gradio is not the one Owlet's adaptations of its internals were
    verified with, or one of them does not apply (``ui.gradio_adapters.registry``), unless the config allows
    unverified Gradio.
    """
    adaptations = GradioAdaptations(allow_unverified=config.allow_unverified_gradio)
    skip_missing_matplotlib()
    adaptations.apply(SHARED_SCHEMAS, share_component_schemas)
    adaptations.apply(ONE_FILE_PER_UPLOAD, limit_files_per_upload, config.max_upload_bytes)
    adaptations.apply(FRONT_END, check_front_end)
    client = client or make_client(config)
    metrics = UIMetrics()
    metrics.registry.register(ClusterCollector(client))
    uploads = UploadedPaths()  # who uploaded each path: served files, the files a call names, reopened pictures
    ledger = upload_ledger(config)
    room = UploadRoom(ledger, uploads, get_upload_folder())  # which uploads give way when the budget is full
    handlers = ChatHandlers(client, config, metrics, uploads, room)
    page = build_page(handlers, config)
    page.queue(default_concurrency_limit=None, max_size=config.queue_max_size)
    addresses = ClientAddresses.from_config(config)  # what every per-address limit counts
    receipts = RefusalReceipts()  # refused uploads, told to gradio_client (ui.uploads.refusal_receipts)
    adapt_page(adaptations, page, config, addresses, handlers, uploads, receipts)
    adaptations.settle()  # a refusal comes here, before anything is served
    keep_with(page, adaptations)  # launch_page makes the adaptations of a launched page, and reports them all
    launch_kwargs = dict(
        server_name=bracketed(config.host),
        server_port=config.port,
        share=config.share,
        auth=list(config.auth) or None,
        auth_message=None,  # the sign-in page is Owlet's own (ui.sign_in)
        # Behind a proxy serving the page under a path of its own; None leaves Gradio's own GRADIO_ROOT_PATH to it.
        root_path=config.root_path or None,
        max_threads=config.max_threads,
        state_session_capacity=config.tab_states_max,  # closed tabs' state; open ones stay (tab_states)
        # No limit of Gradio's: its front end dropped a bigger picture with a toast and sent the question without
        # it. The page's script sends a stand-in the turn refuses (ui.page_script), and the upload route refuses a
        # bigger file before it is written to disk (ONE_FILE_PER_UPLOAD).
        max_file_size=None,
        app_kwargs={"routes": ops_routes(client, metrics, config.metrics_token)
                    + api_routes(handlers, config, metrics, addresses),
                    "middleware": edge_middleware(config, page, adaptations, addresses, uploads, ledger, room,
                                                  receipts, handlers.refusals)},
        show_error=False,
        # Gradio's /monitoring endpoints are public by default (traffic per endpoint); Owlet's metrics are
        # /metrics, behind a token.
        enable_monitoring=False,
        quiet=True,
        footer_links=[],
        css=CSS,
        head=page_head(config.max_upload_bytes),
        ssr_mode=False,
    )
    return page, launch_kwargs, client, metrics


def adapt_page(adaptations: GradioAdaptations, page, config, addresses: ClientAddresses, handlers: ChatHandlers,
               uploads: UploadedPaths, receipts: RefusalReceipts | None = None) -> None:
    """Owlet's adaptations of the built, queued page's Gradio internals, each through the registry."""
    adaptations.apply(READABLE_INPUT_REFUSALS, explain_malformed_inputs, page,
                      usage_by_endpoint(config.max_new_tokens_cap))
    adaptations.apply(NAMED_FILES, check_named_files, page, NamedFiles(uploads, addresses, example_files(page),
                                                                       receipts))
    adaptations.apply(FORGOTTEN_COMPONENTS, forget_replaced_components, page)
    adaptations.apply(FAIR_EVENT_SLOTS, share_event_slots_fairly, page, addresses, config.address_max_waiting_events,
                      handlers.answer_time)
    adaptations.apply(CALM_IDLE_QUEUE, calm_idle_queue, page)
    adaptations.apply(QUEUE_ANALYTICS_OFF, drop_queue_analytics, page)
    adaptations.apply(TABS_WITH_ANSWERS, keep_tabs_with_answers, page)
    adaptations.apply(TAB_GUARD, check_queue_reads, page)
    adaptations.apply(CHAT_EVENT_DATA, check_event_data)
    if config.auth:
        adaptations.apply(LOGIN_COOKIES, check_login_cookies, page)


def edge_middleware(config, page, adaptations: GradioAdaptations, addresses: ClientAddresses, uploads: UploadedPaths,
                    ledger: UploadLedger, room: UploadRoom, receipts: RefusalReceipts | None = None,
                    refusals=None) -> list[Middleware]:
    """The page's ASGI middlewares, outermost first: API refusals as OpenAI error objects (on ``/v1/`` paths only),
    gradio_client's refused uploads as receipts it reads (``ui.uploads.refusal_receipts``), the count of each
    address's refusals and the brake on an address past it (``ui.edge.refusal_brake``), routes the page does not
    use, oversized bodies, too many held connections from one address, then (with --auth) too many sign-in
    attempts, strangers without a login and Owlet's sign-in page in place of Gradio's, then
    upload budgets (so nobody unauthenticated can spend the page's upload budget), then new-tab budgets (whose body
    reading is bounded by the body limits), then the routes that act on a whole tab by its session hash. A
    middleware that reads Gradio's internals is left out when its adaptation did not apply (only when unverified
    Gradio is allowed: the start-up log says so)."""
    logins = [Middleware(LoginAttempts, ledger=NewTabLedger(config.address_logins, config.address_logins_window_s),
                         addresses=addresses)] if config.auth else []
    if config.auth and adaptations.applied(LOGIN_COOKIES):
        logins += [Middleware(LoginRequired), Middleware(SignInPage)]
    # A session hash is bound to the network that first named it (ui.edge.tab_guard).
    tab_guard = [Middleware(TabGuard, queue=queue_of(page), addresses=addresses, heartbeats=open_tabs_of(page))
                 ] if adaptations.applied(TAB_GUARD) else []
    told = [Middleware(UploadRefusalReceipts, receipts=receipts)] if receipts is not None else []
    brake = [Middleware(RefusalBrake, ledger=refusals, addresses=addresses)] if refusals is not None else []
    return [Middleware(ApiErrors, max_body_bytes=config.api_max_request_bytes),  # API clients read errors as JSON
            *told,
            *brake,
            Middleware(PublicRoutes),
            Middleware(PageBodyLimits, max_body_bytes=config.max_request_bytes,
                       max_upload_bytes=config.max_upload_bytes, max_api_bytes=config.api_max_request_bytes),
            Middleware(HeldConnections, per_address=config.address_max_connections,
                       upload_timeout_s=config.upload_timeout_s, addresses=addresses,
                       per_address_downloads=config.address_max_downloads),
            *logins,
            Middleware(UploadBudget, ledger=ledger, addresses=addresses, make_room=room.make_room,
                       max_upload_request_bytes=upload_request_limit(config.max_upload_bytes),
                       max_arriving=config.address_max_uploads, arrival_timeout_s=config.upload_timeout_s),
            # An uploaded file is served back only to the address that uploaded it.
            Middleware(UploadOwners, addresses=addresses, ledger=uploads, on_stored=room.claim),
            Middleware(NewTabBudget, ledger=NewTabLedger(config.address_new_sessions,
                                                         config.address_new_sessions_window_s),
                       addresses=addresses),
            *tab_guard,
            # Innermost: what a request's content makes Gradio raise is a 400, not a 500.
            Middleware(RequestErrors)]


def raise_open_files_limit(wanted: int = 65536) -> int:
    """Every open connection is a file descriptor, and many systems give a process 1,024: raise the soft limit
    toward the hard one, so the per-address caps (ui.edge.held_connections), not the descriptor table, are what a
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


def bracketed(host: str) -> str:
    """``host`` as a URL spells it: an IPv6 address in brackets (``::`` -> ``[::]``). Gradio builds its own address from
    the name, and ``http://:::7860/`` ended the page's start with httpx's "Invalid port: '::7860'"."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def serve(config, block: bool = True, client=None):
    """Launch the page; prints the local URL (and the share link, or why there is none)."""
    # Which front the page believes decides who is who for every per-address limit: say it, once, at start.
    print(f"Owlet UI: client addresses: {ClientAddresses.from_config(config).front()}.", flush=True)
    page, launch_kwargs, client, _metrics = build(config, client)
    raise_open_files_limit()
    launch_page(page, launch_kwargs)
    budget_library_warnings()  # after launch: uvicorn has configured its loggers by then
    start_upload_dir_sweeper(config.upload_cache_ttl_s)
    start_trimming(config.malloc_trim_s)  # freed heap back to the system (owlet.allocator)
    # Everything built so far lives as long as the page: keep it out of the garbage collector's full passes, which
    # a request allocating many objects would otherwise set off over the whole heap (tens of ms each).
    gc.freeze()
    print(f"Owlet UI: {page.local_url}", flush=True)
    if config.root_path:
        print(f"Owlet UI: its links point under {config.root_path} (OWLET_UI_ROOT_PATH): open it through the proxy "
              "that serves it there", flush=True)
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
