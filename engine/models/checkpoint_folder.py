"""Where a checkpoint named by ``OWLET_MODEL`` lies, and the name it is served under.

``OWLET_MODEL`` is a local folder, or a Hugging Face repository id (``LiquidAI/LFM2-VL-1.6B``) whose files are
already in this machine's Hugging Face cache (``HF_HUB_CACHE``, by default ``~/.cache/huggingface/hub``, as
``hf download`` and ``from_pretrained`` leave them), or that cache's folder of the repository
(``.../models--LiquidAI--LFM2-VL-1.6B``, whose checkpoint is the snapshot its ``refs/main`` names). Owlet never
downloads: a repository id not in the cache is refused with the command that fetches it.

A model's served name (``/v1/models``, the check that a queue's workers serve one checkpoint) is its folder's name,
or the repository's name for a folder inside the cache (``models--LiquidAI--LFM2-VL-1.6B/snapshots/<revision>``
serves as ``LFM2-VL-1.6B``, not as its revision's hash).
"""
from __future__ import annotations

import re
from pathlib import Path

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the Hub spells repository ids


def looks_like_repo_id(model: str) -> bool:
    return bool(REPO_ID.match(model)) and ".." not in model and not model.endswith(".git")


def cached_repo_folder(model: str) -> Path | None:
    """The cached snapshot of repository ``model`` (its ``main`` revision), or None when ``model`` is no repository
    id or the cache has no complete snapshot of it. Reads the local cache only."""
    if not looks_like_repo_id(model):
        return None
    from huggingface_hub import snapshot_download  # installed with transformers; only imported for a repository id

    try:
        folder = Path(snapshot_download(repo_id=model, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, a revision missing, a broken cache: the caller says how to fetch it
        return None
    return folder if (folder / "config.json").is_file() else None


def checkpoint_folder(model: str) -> Path:
    """The folder ``model`` names: itself when it exists (``~`` expanded), or the snapshot of ``main`` when it is a
    repository's folder in the cache; else its cached snapshot when it is a repository id in the cache; else the path
    as given (which the caller then reports as missing)."""
    path = Path(model).expanduser()
    if path.exists():
        return _main_snapshot(path) or path
    return cached_repo_folder(model) or path


def _main_snapshot(folder: Path) -> Path | None:
    """For a repository's folder in the cache (``models--owner--name``, no config.json of its own), the snapshot its
    ``refs/main`` names, when that holds a checkpoint."""
    ref = folder / "refs" / "main"
    if (folder / "config.json").exists() or not folder.name.startswith("models--") or not ref.is_file():
        return None
    snapshot = folder / "snapshots" / ref.read_text().strip()
    return snapshot if (snapshot / "config.json").is_file() else None


def not_found_advice(model: str) -> str:
    """What to do about a ``model`` that is neither a folder nor a cached repository."""
    if not looks_like_repo_id(model):
        return ""
    from huggingface_hub.constants import HF_HUB_CACHE

    name = model.split("/")[-1]
    return (f" It is not in this machine's Hugging Face cache ({HF_HUB_CACHE}) either, and Owlet does not download: "
            f"fetch it with `hf download {model}` (then OWLET_MODEL={model} works) or "
            f"`hf download {model} --local-dir /models/{name}` (then OWLET_MODEL=/models/{name}).")


def served_name(model: str) -> str:
    """The name a checkpoint is served under: its folder's, or its repository's for a snapshot in the cache."""
    path = Path(model)
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.split("--")[-1]
    return path.name
