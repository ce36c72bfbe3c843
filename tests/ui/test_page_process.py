"""The page process stays small: a started page has imported neither torch nor transformers.

The page only validates sampling parameters and reads results, so it needs the engine's torch-free contract
modules, never the model code. This starts the page the way ``python -m ui`` does (argument parsing, a real
worker client on a real Redis, Gradio serving), fetches the page once, and reads ``sys.modules`` in that process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import ROOT, free_port

PAGE_SCRIPT = """
import json, sys, urllib.request
from ui.__main__ import config_from_args, parse_args
from ui.server import serve
config = config_from_args(parse_args(["--port", sys.argv[1], "--redis-url", sys.argv[2]]))
page = serve(config, block=False)
status = urllib.request.urlopen(page.local_url, timeout=30).status
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
engine_modules = sorted(m for m in sys.modules if m == "engine" or m.startswith("engine."))
page.close()
print("RESULT " + json.dumps({"status": status, "heavy": loaded, "engine": engine_modules}))
"""


def test_started_page_imports_neither_torch_nor_transformers():
    with running_redis() as redis_url:
        env = dict(os.environ, OWLET_KEY_PREFIX=unique_prefix("page"), PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-c", PAGE_SCRIPT, str(free_port()), redis_url], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=240)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"page did not start:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["status"] == 200
    assert result["heavy"] == [], f"the page process imported {result['heavy']}"
    # The contract modules it does use are there, so the check above is about a page that really needs engine/.
    assert "engine.sampling_params" in result["engine"], result["engine"]
    assert "engine.llm_engine" not in result["engine"]


def test_engine_package_still_exports_the_engine_lazily():
    code = ("import sys, engine; assert 'torch' not in sys.modules; "
            "from engine import LLMEngine, EngineConfig, greedy; assert 'torch' in sys.modules; "
            "print(LLMEngine.__module__, EngineConfig.__module__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["engine.llm_engine", "engine.config"]
