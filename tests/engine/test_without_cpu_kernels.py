"""The engine core reads and runs without engine/models/cpu/: with ``cpu_kernels=off`` nothing imports it, and an engine in a
process where the package cannot be imported at all loads, batches and answers exactly as generate() does."""
import os
import subprocess
import sys
from pathlib import Path

from engine import EngineConfig
from engine.models.model_runner import ModelRunner
from training.tiny_checkpoint import ensure_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter, where any import of engine.models.cpu fails as it would with the package deleted.
WITHOUT_THE_PACKAGE = r'''
import importlib.abc, sys

class NoCpuKernels(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "engine.models.cpu" or name.startswith("engine.models.cpu."):
            raise ImportError(f"{name} cannot be imported in this test")
        return None

sys.meta_path.insert(0, NoCpuKernels())
from engine import EngineConfig, LLMEngine, greedy
from tests.engine.helpers import chat, image, reference_tokens, run_until_done

model = sys.argv[1]
engine = LLMEngine(EngineConfig(model=model, dtype="float32", device="cpu", cpu_kernels="off", max_running=2))
requests = [(chat("What colour is the circle?", image(1)), 7), (chat("hi"), 4), (chat("Where?", image(2)), 5)]
handles = [engine.add_request(messages, greedy(n)) for messages, n in requests]
run_until_done(engine)
assert engine.stats()["mean_batch_occupancy"] > 1.5, "requests were not batched together"
for (messages, n), handle in zip(requests, handles):
    assert handle.result(0).token_ids == reference_tokens(engine.runner, messages, n)
assert not [name for name in sys.modules if name.startswith("engine.models.cpu")]
try:
    LLMEngine(EngineConfig(model=model, dtype="float32", device="cpu"))
except ImportError as e:
    print("auto needs the package:", e)
print("served without engine/models/cpu")
'''


def test_an_engine_loads_and_answers_exactly_where_the_cpu_kernels_cannot_be_imported():
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run([sys.executable, "-c", WITHOUT_THE_PACKAGE, str(ensure_tiny_checkpoint("lfm2vl"))],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "served without engine/models/cpu" in result.stdout
    assert "auto needs the package: engine.models.cpu cannot be imported" in result.stdout, "auto must fail loudly"


def test_off_leaves_every_module_on_the_models_own_code():
    runner = ModelRunner(EngineConfig(model=str(ensure_tiny_checkpoint("llava")), dtype="float32", cpu_kernels="off"))
    assert runner.weight_copy_bytes == 0
    assert not any(hasattr(m, "_owlet_kernels") for m in runner.model.modules())
