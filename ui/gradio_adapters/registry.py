"""Every adaptation of Gradio's internals, what each defends, and the start-up check that they all applied.

Owlet reads or replaces parts of Gradio that are not its public API (``ui.gradio_adapters.internals`` names them).
They were verified with one Gradio version, ``VERIFIED_GRADIO`` (requirements.txt pins it). On another, an
adaptation whose attribute was renamed would do nothing, and the page would run without the defence it carries.
So the page applies each adaptation through ``GradioAdaptations.apply``, which records whether it fitted (the
internal is there, with the shape it was written for) and what it replaced; ``settle`` then checks every
replacement is still in place and refuses to start, with ``GradioNotVerified`` naming the version and each
adaptation that did not apply and the defence it carries, unless ``OWLET_UI_ALLOW_UNVERIFIED_GRADIO`` is set: then
the page starts and logs, as an error, which defences are off. On the verified Gradio with everything applied, it
logs one short line that says so (and, at debug level, which adaptations those are).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ui.gradio_adapters.internals import NotAdaptable, Patch

log = logging.getLogger("owlet.ui")

VERIFIED_GRADIO = "6.31.0"
ALLOW_SETTING = "OWLET_UI_ALLOW_UNVERIFIED_GRADIO"


@dataclass(frozen=True)
class Adaptation:
    """One way Owlet adapts Gradio: ``name``, what of Gradio it reads or replaces, and what the page loses
    without it."""
    name: str
    gradio: str
    defence: str


ONE_FILE_PER_UPLOAD = Adaptation(
    "one file per upload", "gradio.route_utils.GradioMultiPartParser (max_files, max_fields, max_file_size), as "
    "upload_fn uses it",
    "an upload request carries one file, so one address cannot use up the disk's inodes with cache directories, and "
    "a file over OWLET_UI_MAX_UPLOAD_BYTES is refused before it is written to disk (Gradio's own limit is off: its "
    "front end dropped such a picture and sent the question without it), and what an upload ended early (its client "
    "gone, a full disk) had written is deleted")
SHARED_SCHEMAS = Adaptation(
    "shared component schemas", "Component.api_info and its per-instance _api_info_cache",
    "(a cost, not a defence) a component update does not regenerate the component's API schema (about 4 ms, twice "
    "a turn)")
READABLE_INPUT_REFUSALS = Adaptation(
    "readable input refusals", "Blocks.preprocess_data",
    "an API call whose inputs Gradio cannot read gets a sentence and one budgeted log line, not an empty error and "
    "a traceback per request")
NAMED_FILES = Adaptation(
    "named files", "Blocks.process_api",
    "a call may name only files its own address uploaded (or the examples): no URL is fetched into the page's "
    "memory, and no one else's upload is read")
FORGOTTEN_COMPONENTS = Adaptation(
    "replaced components forgotten", "Blocks.postprocess_data; SessionState.blocks_config.blocks, .config_values",
    "a tab's Gradio config does not grow with every event it runs")
FAIR_EVENT_SLOTS = Adaptation(
    "fair event slots",
    "Blocks._queue; Queue.get_events, .push, .event_queue_per_concurrency_id, .active_jobs; Event.enqueue_time, "
    ".request",
    "a free event slot goes to the address running the fewest events, and one address may have only "
    "OWLET_UI_ADDRESS_MAX_WAITING_EVENTS events waiting")
CALM_IDLE_QUEUE = Adaptation(
    "calm idle queue", "Queue.sleep_when_free, .progress_update_sleep_when_free",
    "(a cost, not a defence) an idle page does not poll its queue every millisecond (about 0.05 of a core)")
QUEUE_ANALYTICS_OFF = Adaptation(
    "queue analytics off", "Queue.ANAYLTICS_CACHE_FREQUENCY, .ANALYTICS_MAX_EVENTS",
    "(a cost, not a defence) no pandas summary of up to 10,000 event records after every event (4 to 14 ms each)")
TABS_WITH_ANSWERS = Adaptation(
    "tabs with answers kept", "Queue.pending_messages_per_session (replaced), .pending_event_ids_session, "
    ".event_ids_to_events",
    "new tabs cannot push out the messages of a tab whose answer is streaming, and idle tabs' unread answers are "
    "bounded")
TAB_GUARD = Adaptation(
    "tab guard", "Queue.pending_event_ids_session, .event_ids_to_events, .pending_messages_per_session; the task "
    "names of gradio.queueing.set_task_name",
    "a tab is bound to the network that opened it, a cancel ends only the event it names, a tab's unread events "
    "are capped, and streams of unknown tabs are a plain 404 (without it, the ui.edge.tab_guard middleware is left "
    "out)")
CHAT_EVENT_DATA = Adaptation(
    "chat event data", "EventData._data",
    "retry and edit read the chat's message index themselves, so a call without one gets a sentence")
LOGIN_COOKIES = Adaptation(
    "login cookies", "App.tokens, App.cookie_id, the access-token-<cookie id> cookies",
    "with --auth, nothing but the login page answers without a login (without it, the LoginRequired middleware is "
    "left out)")
LAUNCH_WITHOUT_URL_CHECK = Adaptation(
    "launch without URL check", "Blocks.launch(_frontend=False)",
    "a page whose front page answers slowly at launch is not killed by Gradio's 3 s check (Owlet waits with its own)")
FRONT_END = Adaptation(
    "the page's style and script", "Gradio's compiled front end: the status tracker, the chat's top panel, message "
    "buttons and Share icon, its placeholder, scrolling box and rows, example cards, the upload request",
    "a visitor sees no Gradio counter, trash or Share button, the latest turn is not cut off, and a picture over the "
    "upload limit stops its turn with Owlet's sentence instead of being dropped (ui.page_style, ui.page_script)")
OPEN_TABS_KEEP_STATE = Adaptation(
    "open tabs keep their state", "Blocks.state_holder; StateHolder.update, .session_data, .time_last_used, .lock, "
    ".capacity",
    "a flood of new tabs cannot push an open tab's conversation out of Gradio's state memory")

ADAPTATIONS = (ONE_FILE_PER_UPLOAD, SHARED_SCHEMAS, READABLE_INPUT_REFUSALS, NAMED_FILES, FORGOTTEN_COMPONENTS,
               FAIR_EVENT_SLOTS, CALM_IDLE_QUEUE, QUEUE_ANALYTICS_OFF, TABS_WITH_ANSWERS, TAB_GUARD, CHAT_EVENT_DATA,
               LOGIN_COOKIES, LAUNCH_WITHOUT_URL_CHECK, OPEN_TABS_KEEP_STATE, FRONT_END)


class GradioNotVerified(RuntimeError):
    """Gradio is not the verified version, or an adaptation did not apply, and the override is not set: the page
    must not be served."""


def installed_gradio() -> str:
    import gradio

    return getattr(gradio, "__version__", "unknown")


class GradioAdaptations:
    """One page's adaptations: each applied through ``apply``, then checked and reported by ``settle``."""

    def __init__(self, allow_unverified: bool = False, version: str | None = None):
        self.allow_unverified = allow_unverified
        self.version = version or installed_gradio()
        self.patches: dict[Adaptation, list[Patch]] = {}
        self.failed: dict[Adaptation, str] = {}

    def apply(self, adaptation: Adaptation, adapt: Callable, *args) -> bool:
        """Run ``adapt(*args)``: it makes ``adaptation`` and returns the patches it made (a check of what it reads
        returns None). What it raises on meeting a Gradio it does not fit (``NotAdaptable``, or the AttributeError or
        TypeError of a probe that found another shape) is recorded as the adaptation failing; True if it applied."""
        assert adaptation in ADAPTATIONS, f"{adaptation.name} is not in the registry"
        try:
            patches = adapt(*args)
        except NotAdaptable as exc:
            self.failed[adaptation] = str(exc)
            return False
        except (AttributeError, TypeError) as exc:
            self.failed[adaptation] = f"{type(exc).__name__}: {exc}"
            return False
        self.patches[adaptation] = list(patches or [])
        return True

    def applied(self, adaptation: Adaptation) -> bool:
        return adaptation in self.patches and adaptation not in self.failed

    @property
    def verified_version(self) -> bool:
        return self.version == VERIFIED_GRADIO

    def settle(self, final: bool = False) -> None:
        """Check that every patch made so far is still in place. Raise ``GradioNotVerified`` if the version is not
        the verified one or an adaptation failed, unless unverified Gradio is allowed. ``final`` (the page is
        launched, every adaptation made): log what was applied, and, when allowed to run unverified, which
        defences are off."""
        for adaptation, patches in self.patches.items():
            moved = next((patch for patch in patches if not patch.in_place()), None)
            if moved is not None and adaptation not in self.failed:
                self.failed[adaptation] = f"{moved} was replaced again after Owlet's adaptation"
        failed = [a for a in ADAPTATIONS if a in self.failed]
        if (failed or not self.verified_version) and not self.allow_unverified:
            raise GradioNotVerified(self.refusal(failed))
        if not final:
            return
        applied = [a.name for a in ADAPTATIONS if self.applied(a)]
        if failed or not self.verified_version:
            log.error("%s", self.warning(failed, applied))
            return
        unused = [a.name for a in ADAPTATIONS if a not in self.patches]
        # One short line at start-up; which ones, for whoever looks closer.
        log.info("Gradio %s (verified): every adaptation applied (%d)", self.version, len(applied))
        log.debug("Gradio adaptations applied: %s%s", ", ".join(applied),
                  f"; not needed by this page: {', '.join(unused)}" if unused else "")

    def refusal(self, failed: list[Adaptation]) -> str:
        lines = ["the page will not start: Owlet's defences that adapt Gradio's internals could not be verified."]
        if not self.verified_version:
            lines.append(f"  - Gradio {self.version} is installed; Owlet's adaptations were verified with Gradio "
                         f"{VERIFIED_GRADIO} (requirements.txt pins it).")
        for a in failed:
            lines += [f"  - {a.name}: {self.failed[a]}.", f"      adapts: {a.gradio}", f"      defence: {a.defence}"]
        lines.append(f"Install gradio=={VERIFIED_GRADIO}, or set {ALLOW_SETTING}=true to start without the defences "
                     "named above.")
        return "\n".join(lines)

    def warning(self, failed: list[Adaptation], applied: list[str]) -> str:
        lines = [f"{ALLOW_SETTING} is set: serving on Gradio {self.version}"
                 + ("" if self.verified_version else f", not the verified {VERIFIED_GRADIO}")
                 + f", with {len(failed)} of Owlet's adaptations of it off."]
        for a in failed:
            lines += [f"  - OFF: {a.name}: {self.failed[a]}.", f"      defence: {a.defence}"]
        if applied:
            lines.append(f"  - applied{'' if self.verified_version else ', but unverified on this version'}: "
                         f"{', '.join(applied)}.")
        return "\n".join(lines)


ATTRIBUTE = "owlet_adaptations"  # where a built page keeps its GradioAdaptations until it is launched


def keep_with(page, adaptations: GradioAdaptations) -> None:
    setattr(page, ATTRIBUTE, adaptations)


def adaptations_of(page) -> GradioAdaptations:
    """The page's adaptations (a page built without ``ui.server.build`` gets a fresh, strict record)."""
    adaptations = getattr(page, ATTRIBUTE, None)
    if adaptations is None:
        adaptations = GradioAdaptations()
        keep_with(page, adaptations)
    return adaptations
