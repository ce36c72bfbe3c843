"""The preallocated slot cache: same tokens as generate() and as the DynamicCache path, written in place."""
import pytest
import torch

from engine import greedy
from engine.models import families
from engine.batch.decode_batch import DecodeBatch
from engine.batch.dynamic_batch import DynamicBatch
from engine.batch.slot_batch import SlotBatch
from engine.kv.slot_cache import SlotPool

from .helpers import chat, image, reference_tokens, run_until_done, serve_staggered
from .test_exactness import workload
from .test_sessions import converse


@pytest.mark.parametrize("mode", ["slots", "dynamic"])
def test_both_decode_caches_match_generate(family, make_engine, runners, mode):
    """Rows of very different lengths finish at different steps (slot refills) while others arrive."""
    engine = make_engine(family, max_running=3, decode_cache=mode)
    assert isinstance(engine.batch, SlotBatch if mode == "slots" else DynamicBatch)
    assert isinstance(engine.batch, DecodeBatch), "both batches offer the declared interface"
    reqs = workload()
    handles = []
    for i, (messages, n) in enumerate(reqs):
        handles.append(engine.add_request(messages, greedy(n)))
        engine.step()
    run_until_done(engine)
    for (messages, n), h in zip(reqs, handles):
        assert h.result(timeout=0).token_ids == reference_tokens(runners(family), messages, n)


def test_slots_are_written_in_place(family, make_engine):
    """No step reallocates the pool: every buffer keeps its storage, and the batch view is a view of it."""
    engine = make_engine(family, max_running=4, decode_cache="slots")
    pool = engine.batch.pool
    pointers = {i: t.data_ptr() for d in (pool.keys, pool.values, pool.conv) for i, t in d.items()}
    before = [t.clone() for t in pool.keys.values()]
    handles = [engine.add_request(m, greedy(n)) for m, n in workload()[:4]]
    for _ in range(6):
        engine.step()
        assert {i: t.data_ptr() for d in (pool.keys, pool.values, pool.conv) for i, t in d.items()} == pointers
    assert any(not torch.equal(b, a) for b, a in zip(before, pool.keys.values())), "nothing was written"
    inputs = engine.batch.step_inputs()
    layer = next(i for i, t in enumerate(pool.types) if t != "conv")
    view, _ = inputs["cache"].layers[layer].buf_keys, None
    assert view.data_ptr() == pool.keys[layer].data_ptr()
    assert inputs["attention_mask"].shape == (len(engine.batch), 1, 1, int(engine.batch.seq_lens.max()) + 1)
    run_until_done(engine)
    assert all(h.result(0).error is None for h in handles)


def test_sessions_save_and_restore_through_slots(family, make_engine, runners):
    slots = make_engine(family, decode_cache="slots")
    prompts, results = converse(slots, "conv-slots")
    assert all(r.stats.cache_source == "session" for r in results[1:])
    for p, r in zip(prompts, results):
        assert r.token_ids == reference_tokens(runners(family), p, 8)


def test_rows_longer_than_the_pool_stop_at_its_length(make_engine):
    """A small pool caps the context: the request ends with LENGTH at the slot length, it never overflows."""
    engine = make_engine("llava", decode_cache="slots", kv_pool_mb=0.1, max_running=2)
    assert engine.max_model_len == engine.batch.pool.slot_len < 2048
    h = engine.add_request(chat("hi"), greedy(engine.max_model_len))
    run_until_done(engine)
    r = h.result(0)
    assert r.error is None and r.stats.prompt_tokens + len(r.token_ids) <= engine.batch.pool.slot_len


def test_too_small_pool_is_a_clear_error(make_engine):
    with pytest.raises(ValueError, match="kv_pool_mb"):
        make_engine("llava", decode_cache="slots", kv_pool_mb=0.001)


def test_sliding_window_and_mrope_families_run_on_the_dynamic_batch(runners, make_engine):
    """Sliding-window or M-RoPE families keep the DynamicCache path: their registry rows say so, a row cannot say
    otherwise, ``decode_cache='slots'`` cannot force it, and the slot pool refuses layers it cannot hold."""
    dynamic = {f.name for f in families.FAMILIES if f.decode_batch == "dynamic"}
    assert dynamic == {"Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "Gemma 3", "Mistral 3", "mPLUG-Owl3"}
    assert families.UNVERIFIED.decode_batch == "dynamic"
    for row in (dict(positions="mrope"), dict(cache_layers=("full", "sliding"))):
        with pytest.raises(ValueError, match="decode_batch='dynamic'"):
            families.Family("x", "X", **row)
    assert isinstance(make_engine("qwen2vl").batch, DynamicBatch)
    with pytest.raises(ValueError, match="Qwen2-VL is verified on the dynamic decode batch only"):
        make_engine("qwen2vl", decode_cache="slots")
    config = runners("llava").text_config
    sliding = type(config)(**{**config.to_dict(), "layer_types": ["sliding_attention"] * config.num_hidden_layers,
                              "sliding_window": 16})
    with pytest.raises(ValueError, match="sliding_attention"):
        SlotPool(sliding, 2, 64, "cpu", torch.float32)


def test_image_rows_mixed_with_text_rows(family, make_engine, runners):
    engine = make_engine(family, max_running=2, decode_cache="slots")
    reqs = [(chat("Describe it.", image(5, (96, 64))), 9), (chat("hi"), 3), (chat("and this?", image(6)), 5)]
    handles = [engine.add_request(m, greedy(n)) for m, n in reqs]
    run_until_done(engine)
    for (m, n), h in zip(reqs, handles):
        assert h.result(0).token_ids == reference_tokens(runners(family), m, n)


def test_static_shape_decode_matches_generate(family, make_engine, runners):
    """The capturable step (padded row buckets, bucketed positions) run eagerly on CPU: same tokens."""
    engine = make_engine(family, max_running=5, decode_graphs="static")
    step = engine.batch.static_step
    step.kv_block = 32  # small blocks so the attended span changes bucket during the test
    reqs = workload()
    handles = serve_staggered(engine, reqs, steps_after=lambda i: 1)
    for (messages, n), h in zip(reqs, handles):
        assert h.result(timeout=0).token_ids == reference_tokens(runners(family), messages, n)
    assert step.shape_for(3, 40) == (4, 64) and step.shape_for(5, 10) == (5, 32)
    assert len(step._static) >= 3, "several (rows, positions) shapes should have been used"


def test_static_step_drops_least_recent_shapes_beyond_its_cap_and_stays_exact(family, make_engine, runners):
    engine = make_engine(family, max_running=5, decode_graphs="static")
    step = engine.batch.static_step
    step.kv_block, step.max_graphs = 32, 2
    reqs = workload()
    handles = serve_staggered(engine, reqs, steps_after=lambda i: 1)
    assert step.evictions > 0 and len(step._static) <= 2
    for (messages, n), h in zip(reqs, handles):
        assert h.result(timeout=0).token_ids == reference_tokens(runners(family), messages, n)


def test_decode_graphs_auto_is_off_on_cpu(make_engine):
    engine = make_engine("lfm2vl")
    assert engine.config.decode_graphs == "auto" and engine.batch.static_step is None
    assert engine.batch.segment_call_cost is not None, "the eager step keeps varlen attention"


def test_graph_capture_needs_cuda(make_engine):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="CUDA"):
        make_engine("llava", decode_graphs="cuda")
    with pytest.raises(ValueError, match="slot cache"):
        make_engine("llava", decode_graphs="static", decode_cache="dynamic")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_decode_replays_the_eager_tokens_on_cuda(family, runners):
    """On a GPU (fp32): the CUDA-graph step gives the tokens of the same static-shape step run eagerly, and of
    per-request generate(); rows arrive and leave, so several (rows, positions) graphs are captured and replayed."""
    from engine import EngineConfig, LLMEngine
    from training.tiny_checkpoint import ensure_tiny_checkpoint

    runner = runners(family, device="cuda")
    tokens, steps = {}, {}
    for graphs in ("static", "auto", "cuda"):  # auto: captures on CUDA; "cuda" here holds at most 2 graphs
        config = EngineConfig(model=str(ensure_tiny_checkpoint(family)), dtype="float32", device="cuda",
                              max_running=5, decode_graphs=graphs)
        engine = LLMEngine(config, runner=runner)
        steps[graphs] = engine.batch.static_step
        steps[graphs].kv_block = 32  # the attended span crosses buckets during the run
        if graphs == "cuda":
            steps[graphs].max_graphs = 2
        handles = serve_staggered(engine, workload(), steps_after=lambda i: 1)
        tokens[graphs] = [h.result(0).token_ids for h in handles]
        engine.stop()
    assert steps["auto"].capture and steps["auto"].captures >= 3
    assert steps["auto"].replays > steps["auto"].captures
    assert steps["cuda"].evictions > 0 and len(steps["cuda"]._graphs) <= 2
    assert tokens["auto"] == tokens["static"] == tokens["cuda"]
    assert tokens["auto"] == [reference_tokens(runner, m, n) for m, n in workload()]


@pytest.mark.parametrize("longest_first", [True, False])
def test_admission_order_within_one_intake(make_engine, longest_first):
    """Requests that arrive together start longest budget first (if enabled); a later arrival never overtakes."""
    engine = make_engine("llava", max_running=1, admit_longest_first=longest_first)
    started = []
    restore = engine.sessions.restore
    engine.sessions.restore = lambda req: (started.append(req.params.max_new_tokens), restore(req))[1]
    hs = [engine.add_request(chat(f"question {i}"), greedy(n)) for i, n in enumerate((2, 6, 4))]
    engine.step()
    hs.append(engine.add_request(chat("late and long"), greedy(9)))
    run_until_done(engine)
    assert all(h.result(0).error is None for h in hs)
    assert started == ([6, 4, 2, 9] if longest_first else [2, 6, 4, 9])
