"""The README's production commands, read from the README itself, start a working service from any folder.

The worker and page lines are taken verbatim from README.md and run from a temporary folder (not the
checkout) with no PYTHONPATH, so only the installed project can make the imports work. Only what a reader
must fill in is replaced: the placeholders' values (REDIS_URL, OWLET_MODEL) and the address to bind
(--host, --port: a free local port on this shared machine). Then one question is answered through the page.
"""
from __future__ import annotations

import re
import shlex

import pytest
from gradio_client import Client

from tests.deploy.services import ROOT, Service, clean_env, wait_for_workers
from tests.redis_server import redis_url_fixture, unique_prefix
from tests.ui.page_client import ask, bubble_text
from tests.ui.stack import free_port, make_image, tiny_model

redis_url = redis_url_fixture()
pytestmark = pytest.mark.timeout(420)


def readme_command(program: str) -> str:
    """The first README line that runs ``program``, optionally after VAR=value assignments."""
    pattern = re.compile(rf"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*{re.escape(program)}(?:\s|$)")
    for line in (ROOT / "README.md").read_text().splitlines():
        if pattern.match(line.strip()):
            return line.strip()
    raise AssertionError(f"README.md shows no `{program} …` command")


def split_command(line: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(line, comments=True)
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def fill_in(argv: list[str], flags: dict[str, str]) -> list[str]:
    """Replace the values of the given flags (``--port 7860`` → ``--port <free>``)."""
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word in flags:
            out[i + 1] = flags[word]
    return out


def test_readme_worker_and_page_commands_answer_a_question_from_another_folder(redis_url, tmp_path):
    worker_env, worker_argv = split_command(readme_command("owlet-worker"))
    page_env, page_argv = split_command(readme_command("owlet-page"))
    assert worker_argv[0] == "owlet-worker" and page_argv[0] == "owlet-page"
    assert {"REDIS_URL", "OWLET_MODEL"} <= worker_env.keys(), worker_env
    port = free_port()
    page_argv = fill_in(page_argv, {"--host": "127.0.0.1", "--port": str(port)})
    assert f"--port {port}" in " ".join(page_argv), "the README's page command should say which port it binds"
    prefix = unique_prefix("readme")  # the shared Redis: this test's own namespace
    worker_env.update(REDIS_URL=redis_url, OWLET_MODEL=str(tiny_model()))
    page_env.update(REDIS_URL=redis_url)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    worker = Service("worker", worker_argv, clean_env(**worker_env, OWLET_KEY_PREFIX=prefix), elsewhere, tmp_path)
    page = Service("page", page_argv, clean_env(**page_env, OWLET_KEY_PREFIX=prefix), elsewhere, tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_for_workers(url, 1, [worker, page])
        client = Client(url, verbose=False)
        _outputs, (_box, chat, status) = ask(client, "What colour is the shape?", make_image(tmp_path / "red.png"),
                                             max_new_tokens=8)
        assert [m["role"] for m in chat] == ["user", "assistant"], chat
        assert bubble_text(chat[-1]).strip(), "an answer was streamed"
        assert "Answered in" in status, status
        client.close()
    finally:
        page.stop()
        worker.stop()
        import redis

        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


VENV_PYTHON = ".venv/bin/python"
RUNS_PYTHON = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:\S*/)?python3?(?:\s|$)")


def readme_python_commands() -> list[str]:
    """Every command in the README that starts Python: the lines of its code blocks and its inline code spans (a
    span may wrap onto the next line)."""
    text = (ROOT / "README.md").read_text()
    lines = [line.strip() for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S) for line in block.splitlines()]
    spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))]
    return [command for command in lines + spans if RUNS_PYTHON.match(command)]


def test_readme_python_commands_work_as_typed_outside_the_venv():
    """`python scripts/sample_conversation.py` gave "No module named 'PIL'" to anyone who had not activated the venv.
    Every Python command in the README names the project's interpreter, and the scripts it runs start (their imports
    and arguments: `--help`) from the checkout with no venv on PATH."""
    import subprocess

    commands = readme_python_commands()
    assert len(commands) >= 10, commands
    bare = [command for command in commands if split_command(command)[1][0] != VENV_PYTHON]
    assert not bare, f"run Python as {VENV_PYTHON}: {bare}"
    scripts = sorted({words[1] for words in (split_command(c)[1] for c in commands) if words[1].endswith(".py")})
    assert len(scripts) >= 2 and all((ROOT / script).is_file() for script in scripts), scripts
    plain = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    runs = {script: subprocess.Popen([VENV_PYTHON, script, "--help"], cwd=ROOT, env=plain, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for script in scripts}
    for script, run in runs.items():
        output = run.communicate(timeout=180)[0]
        assert run.returncode == 0 and "usage:" in output, (script, output[-2000:])
