"""Engine test fixtures: tiny random-init checkpoints of both families, loaded once per session in fp32."""
import pytest
import torch

from engine import EngineConfig
from engine.models.model_runner import ModelRunner, resolve_device
from training.tiny_checkpoint import ensure_tiny_checkpoint

FAMILIES = ["lfm2vl", "llava"]


@pytest.fixture(scope="session", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="session")
def runners():
    """One fp32 ModelRunner per family, shared: loading is the slow part and runners hold no request state."""
    torch.manual_seed(0)
    cache = {}

    def get(fam: str, **overrides) -> ModelRunner:
        key = (fam, tuple(sorted(overrides.items())))
        if key not in cache:
            # On CPU the fast kernels always (not as calibrated on this machine), so every run tests them: MKL's
            # packed product for decode rows, oneDNN for prefill chunks (test_cpu_linear.py runs oneDNN alone and
            # the panel GEMM alone).
            on_cpu = resolve_device(overrides.get("device", "auto")).type == "cpu"
            settings = {"cpu_kernels": "packed,onednn" if on_cpu else "auto", **overrides}
            cfg = EngineConfig(model=str(ensure_tiny_checkpoint(fam)), dtype="float32", **settings)
            cache[key] = ModelRunner(cfg)
        return cache[key]
    return get


@pytest.fixture
def make_engine(runners):
    """Build an LLMEngine over a shared runner; config overrides apply to the engine (not the runner)."""
    from engine import LLMEngine

    engines = []

    def make(fam: str, **overrides):
        runner = runners(fam)
        runner.image_features.__init__(runner.image_features.budget)  # each test starts with a cold image cache
        cfg = EngineConfig(model=str(ensure_tiny_checkpoint(fam)), dtype="float32", **overrides)
        eng = LLMEngine(cfg, runner=runner)
        engines.append(eng)
        return eng
    yield make
    for eng in engines:
        eng.stop()
