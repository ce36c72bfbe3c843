"""The project is installed into its own environment: importable from any folder, commands on PATH, and no
other installed distribution claims its top-level package names."""
from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import tomllib
import zipfile

from tests.deploy.services import ROOT, VENV_BIN, clean_env

PACKAGES = ("engine", "worker", "ui", "training", "owlet")


def test_the_project_is_installed_and_owns_its_top_level_names():
    owners = importlib.metadata.packages_distributions()
    for name in PACKAGES:
        assert owners.get(name) == ["owlet"], f"{name!r} is provided by {owners.get(name)}: a name clash"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert set(PACKAGES) <= set(include), "every top-level package of the checkout is installed"


def test_packages_import_from_another_folder_without_pythonpath(tmp_path):
    probe = "import engine.config, worker.main, ui.config, owlet.settings, training; print(engine.config.__file__)"
    result = subprocess.run([str(VENV_BIN / "python"), "-c", probe], cwd=tmp_path, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == str(ROOT / "engine" / "config.py"), "the checkout's code is the installed code"


def test_console_scripts_are_installed_and_answer_help(tmp_path):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"owlet-worker", "owlet-page", "owlet-demo"}
    for command in ("owlet-page", "owlet-demo"):
        result = subprocess.run([command, "--help"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0 and "usage:" in result.stdout, (command, result.stderr[-2000:])
    worker = subprocess.run(["owlet-worker", "--help"], cwd=tmp_path, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert worker.returncode == 0 and "--concurrency" in worker.stdout, worker.stderr[-2000:]


def test_a_built_wheel_carries_its_package_data(tmp_path):
    """The queue's Lua scripts and the panel GEMM's C source are package data (pyproject.toml): an install from a
    wheel, not only from a checkout, can build ``worker.queue.scripts.Scripts`` and compile the CPU kernel."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("worker", "engine"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([str(VENV_BIN / "python"), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                             "--no-index", "--wheel-dir", str(tmp_path / "dist"), str(source)],
                            env=clean_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("owlet-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packed = {name for name in archive.namelist() if name.endswith((".lua", ".c"))}
    data = {path.relative_to(ROOT).as_posix() for path in (*(ROOT / "worker" / "queue" / "lua").glob("*.lua"),
                                                           *(ROOT / "engine").rglob("*.c"))}
    assert any(p.endswith(".c") for p in data) and any(p.endswith(".lua") for p in data)
    assert packed == data, f"missing from the wheel: {sorted(data - packed)}"
