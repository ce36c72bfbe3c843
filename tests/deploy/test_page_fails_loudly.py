"""The page refuses bad start-up input at once: a clear message on stderr and a non-zero exit, no traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ui.stack import free_port

BIN = Path(sys.executable).parent


def run_page(args: list[str], tmp_path: Path, **env_overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("OWLET_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", **env_overrides)
    return subprocess.run(["owlet-page", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, env, code, phrase", [
    (["--redis-url", "http://not-redis"], {}, 2, "the Redis URL 'http://not-redis' is malformed"),
    (["--redis-url", f"redis://127.0.0.1:{free_port()}/0"], {}, 1, "no Redis answers at redis://127.0.0.1:"),
    (["--port", "eighty"], {}, 2, "argument --port: invalid int value: 'eighty'"),
    (["--no-such-flag"], {}, 2, "unrecognized arguments: --no-such-flag"),
    (["--auth", "nopassword"], {}, 2, "--auth expects user:password"),
    ([], {"OWLET_UI_SHARE": "perhaps"}, 2, "OWLET_UI_SHARE='perhaps' is not a boolean"),
    ([], {"OWLET_UI_MAX_THREADS": "0"}, 2, "max_threads must be at least 1"),
], ids=["malformed-redis-url", "redis-not-answering", "bad-port", "unknown-flag", "bad-auth", "bad-boolean",
        "bad-limit"])
def test_bad_start_up_input_exits_non_zero_with_a_clear_message(tmp_path, args, env, code, phrase):
    result = run_page(args, tmp_path, **env)
    assert result.returncode == code, (result.returncode, result.stderr[-2000:])
    assert phrase in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
