"""The README's API examples, read from the README itself, work against a real stack: the Python one with the
official ``openai`` package, the curl one with curl. Only the address and the model's name are replaced."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess

import pytest

from tests.api.conftest import new_key
from tests.ui.stack import ROOT, tiny_model

pytestmark = pytest.mark.timeout(240)
SECTION = "## The OpenAI-compatible API"
README_URL = "http://127.0.0.1:7860/"
README_MODEL = "owlet-shapes-vl"


def example(language: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    (block,) = re.findall(rf"```{language}\n(.*?)```", section, re.S)
    return block


def for_stack(code: str, stack) -> str:
    return code.replace(README_URL, stack.url).replace(README_MODEL, tiny_model().name)


def test_the_python_example_answers_and_streams_a_follow_up(stack, monkeypatch):
    monkeypatch.chdir(ROOT)  # the example opens one of the page's example pictures by its path
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(for_stack(example("python"), stack), {"KEY": new_key(stack.url)})
    assert printed.getvalue().strip(), "the streamed follow-up printed an answer"


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_curl_example_answers(stack):
    done = subprocess.run(["bash", "-c", for_stack(example("bash"), stack)], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["role"] == "assistant"
