"""Why a worker cannot serve, found before Celery reports "ready": checked settings, then a clear exit.

A worker without an engine is worse than no worker: Celery would call it healthy while it never serves a
job. So the start-up handler (``worker.celery_app``) runs :func:`check_engine_environment` and then builds
the engine; any failure is logged with its reason and the process exits with :data:`EXIT_CANNOT_SERVE`.

The checks here only make the common mistakes read well (no model set, a folder that does not exist or is
not a checkpoint, an architecture missing from the verified families (``engine/models/families.py``), CUDA asked for
on a machine without it). Anything else the engine raises while loading also stops the worker.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
from pathlib import Path

from engine.models.checkpoint_folder import checkpoint_folder, not_found_advice
from owlet.settings import parse_bool

log = logging.getLogger("owlet.worker.startup")

EXIT_CANNOT_SERVE = 3  # distinct from Celery's own usage errors (1, 2), so supervisors and tests can tell


# What a folder must hold to be served, said wherever a folder is refused.
MODEL_FOLDER = ("A model folder holds a checkpoint in Hugging Face layout: config.json, the weights (*.safetensors), "
                "and the tokenizer and processor files (tokenizer.json or tokenizer_config.json, processor_config.json "
                "or preprocessor_config.json, the chat template): every file of a downloaded model repository.")


class CannotServe(RuntimeError):
    """The worker cannot load its engine; the message says why and what to change."""


def check_engine_environment(env=None) -> None:
    """Raise :class:`CannotServe` naming the problem with ``OWLET_MODEL`` / ``OWLET_DEVICE``, if any.

    The folder checks import nothing heavy, so the commonest mistakes are reported in about a second; only
    a CUDA request imports torch.
    """
    env = os.environ if env is None else env
    model = (env.get("OWLET_MODEL") or "").strip()
    if not model:
        raise CannotServe(f"OWLET_MODEL is not set: point it at a local model folder. {MODEL_FOLDER}")
    folder = checkpoint_folder(model)  # a folder, or a Hugging Face repository id already in this machine's cache
    if not folder.exists():
        raise CannotServe(f"OWLET_MODEL={model!r}: no such folder.{not_found_advice(model)} {MODEL_FOLDER}")
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise CannotServe(f"OWLET_MODEL={model!r} is not a model folder: it has no config.json. {MODEL_FOLDER}")
    _read_config(folder)
    device = (env.get("OWLET_DEVICE") or "auto").strip().lower()
    allow = parse_bool("OWLET_ALLOW_UNVERIFIED", env.get("OWLET_ALLOW_UNVERIFIED") or "false")
    _check_family(folder, allow)
    _check_metrics_port(env.get("OWLET_WORKER_METRICS_PORT") or "")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise CannotServe(f"OWLET_DEVICE={device!r} but CUDA is not available on this machine "
                              "(no GPU visible, or torch built without CUDA). Use OWLET_DEVICE=cpu or auto.")


def _read_config(folder: Path) -> None:
    try:
        json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise CannotServe(f"{folder / 'config.json'} cannot be read: {exc}") from None


def metrics_port_taken(port: int, exc: OSError) -> str:
    return (f"OWLET_WORKER_METRICS_PORT={port}: this worker cannot serve its metrics there ({exc.strerror or exc}): "
            "another process listens on it (another worker on this host?). Give each worker a port of its own, or 0 "
            "for none.")


def _check_metrics_port(raw: str) -> None:
    """The metrics port, tried before the model loads (minutes on a GPU) rather than after; a bad value is left to
    the settings' own check."""
    if not raw.strip().isdigit() or not 0 < int(raw) < 65536:
        return
    port = int(raw)
    try:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("", port))
    except OSError as exc:
        raise CannotServe(metrics_port_taken(port, exc)) from None


def _check_family(folder: Path, allow_unverified: bool) -> None:
    """The registry of verified families decides (engine/models/families.py: config.json only, no torch)."""
    from engine.models.families import resolve

    try:
        resolve(str(folder), allow_unverified)
    except ValueError as exc:
        raise CannotServe(str(exc)) from None


def fail(reason: str) -> None:
    """Say why on stderr (also when logging is not set up) and leave with :data:`EXIT_CANNOT_SERVE`."""
    log.critical("owlet worker cannot start: %s", reason)
    for handler in logging.getLogger().handlers:
        handler.flush()
    print(f"owlet-worker: cannot start: {reason}", file=sys.stderr, flush=True)
    # SystemExit passes through Celery's signal dispatch (it only catches Exception) and ends the CLI.
    raise SystemExit(EXIT_CANNOT_SERVE)


def configure_logging(level: int = logging.INFO) -> None:
    """Root logging to stderr unless something configured it already.

    Celery sends ``worker_init`` before it sets up its own logging, and it only logs (never raises) what a
    signal handler throws; with no handler configured that log line would go nowhere. Celery later sees the
    root handler and keeps it rather than adding a second one.
    """
    root = logging.getLogger()
    if not any(not isinstance(h, logging.NullHandler) for h in root.handlers):
        logging.basicConfig(level=level, stream=sys.stderr,
                            format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s")
