"""Every ``OWLET_*`` variable Owlet reads, and a warning at start-up for any that is set but read by nothing.

A misspelt variable (``OWLET_MAX_RUNING``) or one a newer Owlet renamed would otherwise leave the process on the
default while its operator believes the setting applied. Each process (worker, page, demo) calls
:func:`warn_unread` once at start-up; the message names the variable, the setting it most likely meant, and where
the full list is (docs/configuration.md). ``tests/deploy/test_settings_names.py`` keeps :data:`READ_DIRECTLY` and
:data:`COMPOSE_ONLY` equal to what the code and docker-compose.yml really read.
"""
from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping

# Read with os.environ by name, outside the three settings objects (launchers, test and benchmark knobs).
READ_DIRECTLY = frozenset({"OWLET_BENCH_TREE", "OWLET_CACHE_DIR", "OWLET_CHROMIUM", "OWLET_DEMO_MODEL",
                           "OWLET_KEY_PREFIX", "OWLET_MAX_RUNNING", "OWLET_MODEL", "OWLET_SOAK_PROBE_DIR",
                           "OWLET_SOAK_PROBE_S", "OWLET_SOAK_TRACEMALLOC", "OWLET_STUB_TOKENS_PER_S", "OWLET_UI_HOST",
                           "OWLET_UI_PORT", "OWLET_WORKER_CONCURRENCY"})
# docker-compose.yml's own interpolation variables: they configure compose, and may sit in the host's environment.
COMPOSE_ONLY = frozenset({"OWLET_FLOWER_AUTH", "OWLET_FLOWER_IMAGE", "OWLET_FLOWER_PORT", "OWLET_IMAGE",
                          "OWLET_MODELS_DIR", "OWLET_REDIS_MAXMEMORY", "OWLET_WORKERS", "OWLET_UI_BIND",
                          "OWLET_TLS_DIR", "OWLET_HTTPS_PORT", "OWLET_HTTP_PORT", "OWLET_PROMETHEUS_PORT",
                          "OWLET_GRAFANA_PORT", "OWLET_GRAFANA_PASSWORD"})
# Settings that were renamed or folded into another: named in the warning, so an old environment file is noticed.
REPLACED = {
    "OWLET_SESSION_OWNER_SHARE": "OWLET_SESSION_GROUP_SHARE",
    "OWLET_CPU_PACKED_WEIGHTS": "OWLET_CPU_KERNELS",
    "OWLET_CPU_ONEDNN_LINEAR": "OWLET_CPU_KERNELS",
    "OWLET_CPU_OPENBLAS_LINEAR": "OWLET_CPU_KERNELS",
    "OWLET_CPU_PANEL_LINEAR": "OWLET_CPU_KERNELS",
}


def names_read() -> frozenset[str]:
    """Every ``OWLET_*`` variable some Owlet process reads (the three settings objects and the direct reads)."""
    from engine.config import ENV_PREFIX as ENGINE_PREFIX, EngineConfig  # light: no torch at import
    from owlet.settings import env_names
    from ui import config as ui_config
    from worker import config as worker_config

    return frozenset({*env_names(EngineConfig, ENGINE_PREFIX),
                      *env_names(worker_config.Settings, worker_config.ENV_PREFIX, skip=worker_config.ENV_SKIP),
                      *env_names(ui_config.UIConfig, ui_config.ENV_PREFIX, skip=ui_config.ENV_SKIP),
                      *READ_DIRECTLY})


def unread(env: Mapping[str, str]) -> list[str]:
    """A sentence for each ``OWLET_*`` variable in ``env`` that nothing reads, naming what it probably meant."""
    known = names_read()
    found = []
    for name in sorted(n for n in env if n.startswith("OWLET_") and n not in known and n not in COMPOSE_ONLY):
        meant = REPLACED.get(name) or next(iter(difflib.get_close_matches(name, known, n=1, cutoff=0.8)), None)
        hint = f" (did you mean {meant}?)" if meant else ""
        found.append(f"{name} is set but no Owlet setting has that name{hint}; it has no effect. Every setting: "
                     "docs/configuration.md")
    return found


def warn_unread(log: logging.Logger, env: Mapping[str, str] | None = None) -> list[str]:
    """Log a warning for each unread ``OWLET_*`` variable; returns the sentences."""
    sentences = unread(os.environ if env is None else env)
    for sentence in sentences:
        log.warning("%s", sentence)
    return sentences
