"""Why a worker cannot serve, found before Celery reports "ready": checked settings, then a clear exit.

A worker without an engine is worse than no worker: Celery would call it healthy while it never serves a
job. So the start-up handler (``worker.celery_app``) runs :func:`check_engine_environment` and then builds
the engine; any failure is logged with its reason and the process exits with :data:`EXIT_CANNOT_SERVE`.

The checks here only make the common mistakes read well (no model set, a folder that does not exist or is
not a checkpoint, an architecture transformers cannot load as an image-text-to-text model, CUDA asked for
on a machine without it). Anything else the engine raises while loading also stops the worker.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from owlet.settings import parse_bool

log = logging.getLogger("owlet.worker.startup")

EXIT_CANNOT_SERVE = 3  # distinct from Celery's own usage errors (1, 2), so supervisors and tests can tell


class CannotServe(RuntimeError):
    """The worker cannot load its engine; the message says why and what to change."""


def check_engine_environment(env=None) -> None:
    """Raise :class:`CannotServe` naming the problem with ``OWLET_MODEL`` / ``OWLET_DEVICE``, if any.

    The folder checks import nothing heavy, so the commonest mistakes are reported in about a second; only
    the architecture check (transformers) and a CUDA request (torch) import more.
    """
    env = os.environ if env is None else env
    model = (env.get("OWLET_MODEL") or "").strip()
    if not model:
        raise CannotServe("OWLET_MODEL is not set: point it at a local checkpoint folder "
                          "(Hugging Face layout: config.json, weights, processor files).")
    folder = Path(model).expanduser()
    if not folder.exists():
        raise CannotServe(f"OWLET_MODEL={model!r}: no such folder. Point it at a local checkpoint "
                          "folder (Hugging Face layout: config.json, weights, processor files).")
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise CannotServe(f"OWLET_MODEL={model!r} is not a checkpoint folder: it has no config.json.")
    model_type = _model_type(folder)
    device = (env.get("OWLET_DEVICE") or "auto").strip().lower()
    remote_code = parse_bool("OWLET_TRUST_REMOTE_CODE", env.get("OWLET_TRUST_REMOTE_CODE") or "false")
    if not remote_code:  # remote-code checkpoints bring their own architecture
        _check_architecture(folder, model_type)
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise CannotServe(f"OWLET_DEVICE={device!r} but CUDA is not available on this machine "
                              "(no GPU visible, or torch built without CUDA). Use OWLET_DEVICE=cpu or auto.")


def _model_type(folder: Path) -> str | None:
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise CannotServe(f"{folder / 'config.json'} cannot be read: {exc}") from None


def _check_architecture(folder: Path, model_type: str | None) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as known

    if model_type not in known:
        raise CannotServe(f"{folder}: model_type {model_type!r} is not an image-text-to-text architecture this "
                          f"transformers can load (supported include lfm2_vl, llava, qwen2_vl, ...).")


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
