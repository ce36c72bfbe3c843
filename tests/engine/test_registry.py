"""The family registry: unverified architectures are refused with a clear message, opt-in works with a warning,
cache layer kinds a family was not verified with are refused, and a row can name its own runner."""
import json
import logging
import shutil

import pytest

from engine import EngineConfig, LLMEngine, greedy
from engine.models import families, runners
from engine.models.model_runner import ModelRunner
from engine.models.runner_interface import Runner
from training.tiny_checkpoint import ensure_tiny_checkpoint

from .helpers import chat, image, run_until_done


def _copy_with_config(tmp_path, family: str, **changes):
    folder = tmp_path / family
    shutil.copytree(ensure_tiny_checkpoint(family), folder)
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if key == "text_config":
            cfg["text_config"].update(value)
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_unverified_architecture_is_refused_with_the_supported_list(tmp_path):
    folder = _copy_with_config(tmp_path, "llava", architectures=["OwlishForConditionalGeneration"])
    with pytest.raises(ValueError) as err:
        LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    message = str(err.value)
    assert "'OwlishForConditionalGeneration' is not a model family Owlet has verified" in message
    assert "OWLET_ALLOW_UNVERIFIED=true" in message
    for fam in families.FAMILIES:
        assert f"{fam.name} ({fam.architecture})" in message


def test_opt_in_serves_an_unverified_architecture_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="owlet.engine")
    folder = _copy_with_config(tmp_path, "llava", architectures=["OwlishForConditionalGeneration"])
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32", allow_unverified=True))
    assert engine.runner.family is families.UNVERIFIED
    assert any("is not verified" in r.getMessage() for r in caplog.records)
    h = engine.add_request(chat("What colour?", image(1)), greedy(4))
    run_until_done(engine)
    assert len(h.result(0).token_ids) >= 1
    assert EngineConfig.from_env({"OWLET_MODEL": "/m", "OWLET_ALLOW_UNVERIFIED": "true"}).allow_unverified


def test_missing_architectures_entry_is_refused(tmp_path):
    folder = _copy_with_config(tmp_path, "llava", architectures=[])
    with pytest.raises(ValueError, match="no 'architectures' entry"):
        ModelRunner(EngineConfig(model=str(folder), dtype="float32"))


def test_a_cache_layer_kind_not_verified_for_the_family_is_refused(tmp_path):
    """Qwen2-VL was verified with full attention only; a sliding-window variant must not be served silently."""
    folder = _copy_with_config(tmp_path, "qwen2vl", text_config=dict(
        use_sliding_window=True, sliding_window=8, layer_types=["sliding_attention", "full_attention"]))
    with pytest.raises(ValueError, match=r"cache layers of kind \['sliding'\]"):
        ModelRunner(EngineConfig(model=str(folder), dtype="float32"))


class RecordingRunner(ModelRunner):
    """Stands in for a native implementation (e.g. engine/models/mplug_owl3) named by a registry row."""
    built = 0

    def __init__(self, config, family=None):
        RecordingRunner.built += 1
        super().__init__(config, family=family)


def test_a_registry_row_can_name_its_own_runner():
    row = families.Family("Custom LLaVA", "LlavaForConditionalGeneration",
                          runner="tests.engine.test_registry:RecordingRunner")
    cfg = EngineConfig(model=str(ensure_tiny_checkpoint("llava")), dtype="float32")
    runner = runners.make_runner(cfg, families=(row,))
    assert isinstance(runner, RecordingRunner) and RecordingRunner.built == 1 and runner.family is row
    assert isinstance(runner, Runner), "the generic runner offers the engine's runner interface"
    assert runners.runner_class(families.by_architecture()["LlavaForConditionalGeneration"]) is ModelRunner
