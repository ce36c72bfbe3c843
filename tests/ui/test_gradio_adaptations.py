"""Owlet's adaptations of Gradio's internals go through one registry, and a Gradio they do not fit is refused.

On a Gradio other than the verified one an adaptation whose attribute was renamed would quietly do nothing, and the
page would serve without the defence it carries. These tests take a Gradio internal away (or claim another
version) and see the page refuse to start, with a message naming what failed and what it defends, and a non-zero
exit from the real ``python -m ui``; see it start with ``OWLET_UI_ALLOW_UNVERIFIED_GRADIO`` and log which defences
are off; and see the pinned Gradio report every adaptation applied.
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import ROOT, free_port, read_until_served
from ui.gradio_adapters.registry import (ADAPTATIONS, ALLOW_SETTING, FAIR_EVENT_SLOTS, LOGIN_COOKIES,
                                         OPEN_TABS_KEEP_STATE, TAB_GUARD, VERIFIED_GRADIO, GradioAdaptations,
                                         GradioNotVerified, adaptations_of)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def redis_url():
    with running_redis() as url:
        yield url


def config_for(redis_url, **fields):
    from ui.config import UIConfig

    return UIConfig(redis_url=redis_url, key_prefix=unique_prefix("adapt"), port=free_port(), **fields)


def built(redis_url, **fields):
    """Build a page (nothing served); returns (page, launch kwargs, client)."""
    from ui.server import build

    page, launch_kwargs, client, _metrics = build(config_for(redis_url, **fields))
    return page, launch_kwargs, client


def middleware_names(launch_kwargs) -> list[str]:
    return [m.cls.__name__ for m in launch_kwargs["app_kwargs"]["middleware"]]


def test_the_pinned_gradio_is_the_verified_one():
    pinned = re.search(r"^gradio==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    import gradio

    assert pinned == VERIFIED_GRADIO == gradio.__version__


def test_the_pinned_gradio_gets_every_adaptation_and_the_page_says_so(redis_url, caplog):
    from ui.ops.launch import launch_page

    page, launch_kwargs, client = built(redis_url, auth=(("ann", "pw"),))
    with caplog.at_level(logging.DEBUG, logger="owlet.ui"):
        launch_page(page, launch_kwargs)
    try:
        adaptations = adaptations_of(page)
        assert adaptations.failed == {}
        assert [a for a in ADAPTATIONS if not adaptations.applied(a)] == [], "with --auth the page needs them all"
        assert all(patch.in_place() for patches in adaptations.patches.values() for patch in patches)
        assert sum(len(patches) for patches in adaptations.patches.values()) >= 12, "the replacements are recorded"
        report = [r.getMessage() for r in caplog.records if "every adaptation applied" in r.getMessage()]
        assert report and f"Gradio {VERIFIED_GRADIO} (verified): every adaptation applied ({len(ADAPTATIONS)})" \
            in report[0], report
        assert len(report[0]) < 80, "one short line at start-up"
        listed = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "adaptations applied" in
                  r.getMessage()]
        assert listed and all(a.name in listed[0] for a in ADAPTATIONS), "each one named at debug level"
        assert {"TabGuard", "LoginRequired"} <= set(middleware_names(launch_kwargs))
    finally:
        page.close()
        client.close(purge=True)


def test_without_auth_the_login_cookies_are_not_needed(redis_url):
    page, launch_kwargs, client = built(redis_url)
    try:
        adaptations = adaptations_of(page)
        assert not adaptations.failed and LOGIN_COOKIES not in adaptations.patches
        assert "LoginRequired" not in middleware_names(launch_kwargs)
    finally:
        client.close(purge=True)


def _no_get_events(monkeypatch):
    from gradio.queueing import Queue

    monkeypatch.delattr(Queue, "get_events")


def _tasks_named_otherwise(monkeypatch):
    from gradio import queueing

    monkeypatch.setattr(queueing, "set_task_name", lambda task, session_hash, fn_index, event_id, batch:
                        task.set_name(f"{session_hash}/{fn_index}/{event_id}"))


def _no_multipart_parser(monkeypatch):
    from gradio import route_utils

    monkeypatch.delattr(route_utils, "GradioMultiPartParser")


def _no_preprocess_data(monkeypatch):
    from gradio.blocks import Blocks

    monkeypatch.delattr(Blocks, "preprocess_data")


def _no_event_payload(monkeypatch):
    import gradio as gr

    monkeypatch.setattr(gr.EventData, "__init__", lambda self, target, _data: setattr(self, "payload", _data))


@pytest.mark.parametrize("take_away, adaptation, internal", [
    (_no_get_events, "fair event slots", "Queue.get_events is missing"),
    (_tasks_named_otherwise, "tab guard", "names an event's task 'tab/3/event'"),
    (_no_multipart_parser, "one file per upload", "route_utils.GradioMultiPartParser is missing"),
    (_no_preprocess_data, "readable input refusals", "Blocks.preprocess_data is missing"),
    (_no_event_payload, "chat event data", "keeps its payload elsewhere"),
], ids=["queue-pick", "task-names", "upload-parser", "input-conversion", "event-data"])
def test_a_missing_internal_refuses_the_page_naming_it_and_its_defence(redis_url, monkeypatch, take_away, adaptation,
                                                                       internal):
    take_away(monkeypatch)
    with pytest.raises(GradioNotVerified) as refused:
        built(redis_url)
    message = str(refused.value)
    registered = next(a for a in ADAPTATIONS if a.name == adaptation)
    assert f"  - {adaptation}: " in message and internal in message, message
    assert f"      defence: {registered.defence}" in message, "the refusal says what the page would lose"
    assert ALLOW_SETTING in message and f"gradio=={VERIFIED_GRADIO}" in message
    assert sum(line.startswith("  - ") for line in message.splitlines()) == 1, "only what failed is named"


def test_another_gradio_version_is_refused_and_the_override_serves_it_unverified(redis_url, monkeypatch):
    import gradio

    monkeypatch.setattr(gradio, "__version__", "6.99.0")
    with pytest.raises(GradioNotVerified, match=r"Gradio 6\.99\.0 is installed; .* verified with Gradio 6\.31\.0"):
        built(redis_url)
    page, launch_kwargs, client = built(redis_url, allow_unverified_gradio=True)
    try:
        adaptations = adaptations_of(page)
        assert not adaptations.failed and not adaptations.verified_version
        assert "TabGuard" in middleware_names(launch_kwargs), "everything fitted, so every defence is on"
    finally:
        client.close(purge=True)


def test_with_the_override_a_missing_internal_turns_its_defence_off_and_leaves_the_rest(redis_url, monkeypatch):
    _tasks_named_otherwise(monkeypatch)
    page, launch_kwargs, client = built(redis_url, allow_unverified_gradio=True)
    try:
        adaptations = adaptations_of(page)
        assert list(adaptations.failed) == [TAB_GUARD]
        assert adaptations.applied(FAIR_EVENT_SLOTS)
        assert "TabGuard" not in middleware_names(launch_kwargs), "a guard reading what is not there is left out"
    finally:
        client.close(purge=True)


def test_an_adaptation_made_at_launch_that_does_not_fit_closes_the_page_again(redis_url, monkeypatch):
    from gradio.state_holder import StateHolder

    from ui.ops.launch import launch_page

    page, launch_kwargs, client = built(redis_url)
    monkeypatch.setattr(StateHolder, "update", lambda self, key: None)  # another signature than (session_id)
    try:
        with pytest.raises(GradioNotVerified, match="open tabs keep their state: StateHolder.update takes no "
                                                    "session_id"):
            launch_page(page, launch_kwargs)
        assert OPEN_TABS_KEEP_STATE in adaptations_of(page).failed
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{launch_kwargs['server_port']}/", timeout=5)
    finally:
        client.close(purge=True)


def test_a_replacement_undone_after_it_was_made_is_a_failure():
    from types import SimpleNamespace

    from ui.gradio_adapters.internals import replace

    queue = SimpleNamespace(get_events=lambda: None, push=lambda: None)
    adaptations = GradioAdaptations(version=VERIFIED_GRADIO)
    adaptations.apply(FAIR_EVENT_SLOTS, lambda: [replace(queue, "get_events", lambda: "fair")])
    adaptations.settle()
    queue.get_events = lambda: "someone else's"
    with pytest.raises(GradioNotVerified, match="fair event slots: SimpleNamespace.get_events was replaced again"):
        adaptations.settle()


# Gradio's private names: only ui/gradio_adapters/ may spell them (internals.py reads them, the adapters replace).
GRADIO_INTERNALS = re.compile(
    r"\._queue\b|pending_event_ids_session|event_ids_to_events|pending_messages_per_session|"
    r"event_queue_per_concurrency_id|active_jobs|enqueue_time|gradio-sep|_frontend|state_holder|process_api|"
    r"preprocess_data|postprocess_data|GradioMultiPartParser|\._data\b|cookie_id|api_info|sleep_when_free|"
    r"ANAYLTICS|blocks_config|config_values|session_data|set_task_name")


def test_no_module_outside_the_gradio_adapters_names_a_gradio_internal():
    outside = [path for path in (ROOT / "ui").rglob("*.py") if "gradio_adapters" not in path.parts]
    assert len(outside) > 20
    named = {str(path.relative_to(ROOT)): sorted(set(GRADIO_INTERNALS.findall(path.read_text())))
             for path in outside}
    assert {path: names for path, names in named.items() if names} == {}


# ---- the real `python -m ui` process -------------------------------------------------------------------------

def page_process(prelude: str, port: int, redis_url: str, **env: str) -> subprocess.Popen:
    """``python -m ui`` after ``prelude`` changed Gradio in that process (as another Gradio version would)."""
    code = f"{prelude}\nimport runpy\nrunpy.run_module('ui', run_name='__main__', alter_sys=True)"
    environ = {key: value for key, value in os.environ.items() if not key.startswith("OWLET_")}
    environ.update(OWLET_KEY_PREFIX=unique_prefix("adapt-proc"), PYTHONPATH=str(ROOT), **env)
    return subprocess.Popen([sys.executable, "-c", code, "--port", str(port), "--redis-url", redis_url], cwd=ROOT,
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_python_m_ui_on_a_gradio_missing_an_internal_exits_1_naming_it(redis_url):
    proc = page_process("import gradio.queueing\ndel gradio.queueing.Queue.get_events", free_port(), redis_url)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 1, output
    assert "owlet-page: the page will not start" in output, output
    assert "fair event slots: Queue.get_events is missing" in output, output
    assert FAIR_EVENT_SLOTS.defence in output and ALLOW_SETTING in output, output
    assert "Traceback" not in output and "Owlet UI: http" not in output, output


def test_python_m_ui_with_the_override_serves_and_logs_which_defences_are_off(redis_url):
    prelude = ("import gradio, gradio.queueing as queueing\n"
               "gradio.__version__ = '6.99.0'\n"
               "queueing.set_task_name = lambda task, session, fn, event, batch: task.set_name(f'{session}|{event}')")
    port = free_port()
    proc = page_process(prelude, port, redis_url, **{ALLOW_SETTING: "true"})
    try:
        seen = read_until_served(proc, timeout_s=120)
        output = "".join(seen)
        assert any(line.startswith("Owlet UI: http") for line in seen), output
        assert f"ERROR {ALLOW_SETTING} is set: serving on Gradio 6.99.0, not the verified {VERIFIED_GRADIO}" \
            in output, output
        assert "  - OFF: tab guard: gradio.queueing.set_task_name names an event's task" in output, output
        assert f"      defence: {TAB_GUARD.defence}" in output, output
        assert "applied, but unverified on this version: one file per upload" in output, output
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_front_end_check_names_what_gradio_no_longer_draws():
    """The page's style and script name parts of Gradio's compiled front end (its counters, the chat's trash and
    Share button, the upload request): the pinned Gradio's bundle has each, and one that lost a part is named."""
    from ui.gradio_adapters.front_end import NAMES, check_front_end
    from ui.gradio_adapters.internals import NotAdaptable
    from ui.page_style import SHARE_ICON

    check_front_end()
    without_share = ["".join(name for _what, name in NAMES if name != SHARE_ICON)]
    with pytest.raises(NotAdaptable, match="no longer has the Share button's icon$"):
        check_front_end(without_share)
