"""Model loading: offline local folders, dtype resolution, and remote code only on explicit opt-in."""
import json
import logging
import shutil

import pytest
import torch

from engine import EngineConfig
from engine.models.model_runner import ModelRunner, resolve_dtype
from training.tiny_checkpoint import ensure_tiny_checkpoint


def test_auto_dtype_policy():
    assert resolve_dtype("auto", torch.device("cuda")) is torch.float16
    assert resolve_dtype("auto", torch.device("cpu")) in (torch.bfloat16, torch.float32)
    assert resolve_dtype("float32", torch.device("cuda")) is torch.float32


def test_loads_in_requested_dtype_and_logs_weight_memory(caplog):
    caplog.set_level(logging.INFO, logger="owlet.engine")
    runner = ModelRunner(EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="bfloat16"))
    assert next(runner.model.parameters()).dtype is torch.bfloat16
    assert runner.weight_bytes == sum(p.numel() * 2 for p in runner.model.parameters())
    assert any("MB of weights" in r.getMessage() and "bfloat16" in r.getMessage() for r in caplog.records)


def test_remote_code_checkpoint_needs_opt_in(tmp_path):
    """A folder whose config points at its own modelling code must not run that code unless asked to."""
    folder = tmp_path / "custom"
    shutil.copytree(ensure_tiny_checkpoint("llava"), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_owl.OwlConfig",
                       "AutoModelForImageTextToText": "modeling_owl.OwlForConditionalGeneration"}
    cfg["model_type"] = "owl_custom"
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "configuration_owl.py").write_text("raise RuntimeError('remote code ran without opt-in')\n")
    with pytest.raises(ValueError, match="trust_remote_code"):
        ModelRunner(EngineConfig(model=str(folder)))


def test_config_from_env_maps_variables():
    cfg = EngineConfig.from_env({"OWLET_MODEL": "/m", "OWLET_MAX_RUNNING": "4", "OWLET_PARK_MODE": "int8",
                                 "OWLET_SESSION_CACHE": "false", "OWLET_SESSION_BUDGET_MB": "12.5"})
    assert (cfg.model, cfg.max_running, cfg.park_mode, cfg.session_cache, cfg.session_budget_mb) == (
        "/m", 4, "int8", False, 12.5)
    with pytest.raises(ValueError, match="OWLET_MAX_RUNNING"):
        EngineConfig.from_env({"OWLET_MODEL": "/m", "OWLET_MAX_RUNNING": "many"})
    with pytest.raises(ValueError, match="OWLET_MODEL"):
        EngineConfig.from_env({})
    with pytest.raises(ValueError, match="park_mode"):
        EngineConfig(model="/m", park_mode="int3")
