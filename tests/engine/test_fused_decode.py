"""The fused decode step (``EngineConfig.decode_compile``: the static-shape step's forward through torch.compile)
gives the same fp32 greedy tokens as the uncompiled static step and as per-request generate(), on CPU. On CUDA the
compiled forward is what the graph captures; that is measured by bench/gpu_decode.py on a device."""
import pytest

from engine import EngineConfig, LLMEngine, greedy
from training.tiny_checkpoint import ensure_tiny_checkpoint

from .helpers import chat, image, reference_tokens, run_until_done

REQUESTS = [(chat("What colour is the circle?", image(91, (64, 48))), 6), (chat("hi"), 8)]


def _serve(runner, compile: bool) -> tuple[list[list[int]], LLMEngine]:
    config = EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="float32", max_running=4,
                          decode_graphs="static", decode_compile=compile,
                          default_deadline_s=None)  # a first compilation takes minutes on a busy CPU
    engine = LLMEngine(config, runner=runner)
    handles = [engine.add_request(m, greedy(n)) for m, n in REQUESTS]
    run_until_done(engine)
    results = [h.result(0) for h in handles]
    assert all(r.error is None for r in results), [r.error for r in results]
    engine.stop()
    return [r.token_ids for r in results], engine


def test_compiled_step_gives_the_uncompiled_steps_tokens(runners):
    import torch._dynamo.utils

    runner = runners("lfm2vl", cpu_kernels="off")  # the model's own products: what inductor compiles
    plain, _ = _serve(runner, compile=False)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    fused, engine = _serve(runner, compile=True)
    assert engine.batch.static_step.compiled
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > frames, "torch.compile compiled nothing"
    assert fused == plain
    for (messages, n), tokens in zip(REQUESTS, fused):
        assert tokens == reference_tokens(runner, messages, n)


def test_decode_compile_needs_the_static_step(runners):
    runner = runners("lfm2vl", cpu_kernels="off")
    with pytest.raises(ValueError, match="decode_compile"):
        LLMEngine(EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="float32", decode_graphs="off",
                               decode_compile=True), runner=runner)
