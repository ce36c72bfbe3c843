"""Settings from the environment and the command line; flags win; bad values fail with clear messages."""
from __future__ import annotations

import os

import pytest

from ui.__main__ import config_from_args, parse_args
from ui.config import DEV_BROWSER_SECRET, UIConfig, parse_auth


def test_defaults_are_local_and_explicit_about_concurrency():
    config = UIConfig.from_env({})
    assert (config.host, config.port, config.share, config.auth) == ("127.0.0.1", 7860, False, ())
    assert config.secret == DEV_BROWSER_SECRET
    assert config.max_threads >= 8 and config.queue_max_size >= config.max_threads


def test_environment_is_read_and_typed():
    env = {"REDIS_URL": "redis://r:6379/1", "OWLET_KEY_PREFIX": "p:", "OWLET_UI_PORT": "9000",
           "OWLET_UI_SHARE": "true", "OWLET_UI_AUTH": "a:b,c:d", "OWLET_UI_MAX_IMAGE_PIXELS": "1000000",
           "OWLET_UI_ALLOWED_FORMATS": "png, jpeg", "OWLET_UI_STALL_TIMEOUT_S": "2.5", "OWLET_UI_SECRET": "s3"}
    config = UIConfig.from_env(env)
    assert config.redis_url == "redis://r:6379/1" and config.key_prefix == "p:" and config.port == 9000
    assert config.share is True and config.auth == (("a", "b"), ("c", "d"))
    assert config.max_image_pixels == 1_000_000 and config.allowed_formats == ("PNG", "JPEG")
    assert config.stall_timeout_s == 2.5 and config.secret == "s3"


def test_flags_override_the_environment():
    args = parse_args(["--host", "0.0.0.0", "--port", "8001", "--share", "--auth", "u:p", "--auth", "v:q",
                       "--redis-url", "redis://x:1/0"])
    config = config_from_args(args, {"OWLET_UI_PORT": "9000", "REDIS_URL": "redis://env:6379/0"})
    assert (config.host, config.port, config.share) == ("0.0.0.0", 8001, True)
    assert config.auth == (("u", "p"), ("v", "q")) and config.redis_url == "redis://x:1/0"


def test_absent_flags_keep_the_environment():
    config = config_from_args(parse_args([]), {"OWLET_UI_PORT": "9000", "OWLET_UI_SHARE": "1"})
    assert config.port == 9000 and config.share is True


@pytest.mark.parametrize("bad", ["nopassword", ":p", "u:"])
def test_bad_auth_is_refused(bad):
    with pytest.raises(ValueError, match="user:password"):
        parse_auth([bad])
    with pytest.raises(SystemExit, match="user:password"):
        config_from_args(parse_args(["--auth", bad]), {})


def test_bad_numbers_name_the_variable():
    with pytest.raises(ValueError, match="OWLET_UI_PORT"):
        UIConfig.from_env({"OWLET_UI_PORT": "eighty"})
    with pytest.raises(ValueError, match="max_new_tokens"):
        UIConfig(max_new_tokens=5000, max_new_tokens_cap=100)


def test_password_with_a_colon_is_kept_whole():
    assert parse_auth(["alice:pa:ss"]) == (("alice", "pa:ss"),)


def test_settings_are_checked_also_under_python_optimised():
    """``python -O`` (or PYTHONOPTIMIZE, which some images set) drops asserts: the page's checks are not asserts."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-O", "-m", "ui"], env={**os.environ, "OWLET_UI_PORT": "0"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "bad setting: port must be 1..65535, got 0" in run.stderr, (run.returncode,
                                                                                            run.stderr[-500:])
