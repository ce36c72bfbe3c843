"""One parser, one set of rules: the engine, the worker and the page read the same value the same way."""
from __future__ import annotations

import pytest

from engine.config import EngineConfig
from owlet.settings import SettingError, parse_bool, parse_value
from ui.config import UIConfig
from worker.config import Settings

# A boolean field of each settings object, and the variable it is read from.
BOOLEANS = [
    (lambda env: EngineConfig.from_env({"OWLET_MODEL": "m", **env}).session_cache, "OWLET_SESSION_CACHE"),
    (lambda env: Settings.from_env(env).fifo, "OWLET_FIFO"),
    (lambda env: UIConfig.from_env(env).share, "OWLET_UI_SHARE"),
]


@pytest.mark.parametrize("read, name", BOOLEANS)
@pytest.mark.parametrize("raw, value", [("on", True), ("ON", True), ("yes", True), ("1", True), ("true", True),
                                        ("off", False), ("No", False), ("0", False), ("false", False)])
def test_every_layer_reads_booleans_alike(read, name, raw, value):
    assert read({name: raw}) is value


@pytest.mark.parametrize("read, name", BOOLEANS)
@pytest.mark.parametrize("raw", ["maybe", "2", "enabled"])
def test_a_bad_boolean_is_an_error_everywhere(read, name, raw):
    with pytest.raises(SettingError, match=name):
        read({name: raw})


@pytest.mark.parametrize("read, name", [
    (lambda env: EngineConfig.from_env({"OWLET_MODEL": "m", **env}), "OWLET_MAX_RUNNING"),
    (lambda env: Settings.from_env(env), "OWLET_USER_QUEUE_CAP"),
    (lambda env: UIConfig.from_env(env), "OWLET_UI_MAX_THREADS"),
])
def test_a_bad_number_names_the_variable_everywhere(read, name):
    with pytest.raises(SettingError, match=f"{name}='lots' is not an integer"):
        read({name: "lots"})


@pytest.mark.parametrize("raw", ["nan", "inf", "-Infinity"])
@pytest.mark.parametrize("read, name", [
    (lambda env: EngineConfig.from_env({"OWLET_MODEL": "m", **env}), "OWLET_KV_POOL_MB"),
    (lambda env: Settings.from_env(env), "OWLET_JOB_DEADLINE_S"),
    (lambda env: UIConfig.from_env(env), "OWLET_UI_API_KEEPALIVE_S"),
])
def test_a_number_that_is_not_finite_names_the_variable_everywhere(read, name, raw):
    with pytest.raises(SettingError, match=f"{name}='{raw}' is not a finite number"):
        read({name: raw})


@pytest.mark.parametrize("name, raw", [("OWLET_SESSION_BUDGET_MB", "-1"), ("OWLET_KV_POOL_MB", "0"),
                                       ("OWLET_KV_POOL_MB", "-5")])
def test_a_budget_below_zero_is_refused_at_start(name, raw):
    with pytest.raises(ValueError, match=name.removeprefix("OWLET_").lower() + " must be"):
        EngineConfig.from_env({"OWLET_MODEL": "m", name: raw})


def test_empty_means_unset_and_none_clears_an_optional_number():
    assert Settings.from_env({"OWLET_USER_QUEUE_CAP": ""}).user_queue_cap == Settings.user_queue_cap
    config = EngineConfig.from_env({"OWLET_MODEL": "m", "OWLET_DEFAULT_DEADLINE_S": "none",
                                    "OWLET_MAX_MODEL_LEN": "2048", "OWLET_SESSION_BUDGET_MB": "12.5"})
    assert (config.default_deadline_s, config.max_model_len, config.session_budget_mb) == (None, 2048, 12.5)
    with pytest.raises(SettingError, match="OWLET_MAX_RUNNING"):
        EngineConfig.from_env({"OWLET_MODEL": "m", "OWLET_MAX_RUNNING": "none"})  # not optional


def test_parse_value_follows_the_annotation():
    assert parse_value("X", " 7 ", "int") == 7 and parse_value("X", "0.5", "float | None") == 0.5
    assert parse_value("X", "text", "str") == "text" and parse_bool("X", " Off ") is False


def test_the_worker_and_the_engine_agree_on_max_active_for_celery_threads(monkeypatch):
    """A thread per answer the engine holds (rows, and three times as many more for time slicing), plus two."""
    from worker.celery_app import create_app

    for name in ("OWLET_WORKER_CONCURRENCY", "OWLET_MAX_ACTIVE", "OWLET_TIME_SLICE_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OWLET_MAX_RUNNING", "6")
    assert create_app(Settings.from_env({}), with_runtime=True).conf.worker_concurrency == 26
    monkeypatch.setenv("OWLET_TIME_SLICE_TOKENS", "0")
    assert create_app(Settings.from_env({}), with_runtime=True).conf.worker_concurrency == 8
    monkeypatch.setenv("OWLET_MAX_ACTIVE", "3")
    with pytest.raises(ValueError, match="max_active"):
        create_app(Settings.from_env({}), with_runtime=True)
    monkeypatch.setenv("OWLET_MAX_RUNNING", "six")
    with pytest.raises(SettingError, match="OWLET_MAX_RUNNING"):
        create_app(Settings.from_env({}), with_runtime=True)


@pytest.mark.parametrize("name, raw", [("OWLET_JOB_DEADLINE_S", "0"), ("OWLET_QUEUE_TIMEOUT_S", "-5"),
                                       ("OWLET_STREAM_TTL_S", "0"), ("OWLET_HOLDER_TTL_S", "0"),
                                       ("OWLET_HEARTBEAT_INTERVAL_S", "0"), ("OWLET_TURN_MAX_CHARS", "0"),
                                       ("OWLET_WORKER_METRICS_PORT", "70000")])
def test_a_time_or_size_every_turn_rests_on_must_be_above_zero(name, raw):
    """At 0 every answer was cut off at once (the engine refuses a deadline of 0), every question timed out in line,
    or a finished answer's stream expired as it was written; the worker and the page now refuse to start on it,
    whether or not Python runs with -O."""
    with pytest.raises(ValueError, match=name.removeprefix("OWLET_").lower()):
        Settings.from_env({name: raw})
