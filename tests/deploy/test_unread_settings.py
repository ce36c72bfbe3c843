"""A variable that looks like an Owlet setting but is read by nothing is named at start-up, with what it meant."""
from __future__ import annotations

import logging

from owlet.setting_names import unread, warn_unread
from tests.deploy.test_page_fails_loudly import run_page
from tests.ui.stack import free_port


def test_a_misspelt_or_replaced_setting_is_named_with_what_it_probably_meant(caplog):
    env = {"OWLET_MAX_RUNING": "64", "OWLET_CPU_PANEL_LINEAR": "on", "OWLET_NOT_A_THING": "1",
           "OWLET_MAX_RUNNING": "8", "OWLET_WORKERS": "2", "PATH": "/bin"}
    sentences = unread(env)
    assert len(sentences) == 3, sentences
    assert any("OWLET_MAX_RUNING" in s and "did you mean OWLET_MAX_RUNNING?" in s for s in sentences)
    assert any("OWLET_CPU_PANEL_LINEAR" in s and "did you mean OWLET_CPU_KERNELS?" in s for s in sentences)
    assert any("OWLET_NOT_A_THING" in s and "did you mean" not in s for s in sentences)
    with caplog.at_level(logging.WARNING):
        warn_unread(logging.getLogger("test"), {"OWLET_MODEL": "x", "OWLET_UI_PORT": "1", "OWLET_IMAGE": "y"})
    assert not caplog.records, "settings the code or compose reads are not warned about"


def test_the_page_names_an_unread_setting_before_anything_else(tmp_path):
    result = run_page(["--redis-url", f"redis://127.0.0.1:{free_port()}/0"], tmp_path, OWLET_UI_MAX_THREDS="8")
    assert "OWLET_UI_MAX_THREDS is set but no Owlet setting has that name (did you mean OWLET_UI_MAX_THREADS?)" \
        in result.stderr, result.stderr[-2000:]
