"""mPLUG-Owl3 (hyper attention) served by the engine: batched = unbatched reference, session reuse = recompute,
and a follow-up turn reuses the image's K/V instead of encoding and projecting it again. fp32, a tiny checkpoint
per supported layout (engine/models/mplug_owl3/layout.py): every test that loads one runs once per layout."""
import gc
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import EngineConfig, LLMEngine, greedy
from engine.models.mplug_owl3 import is_mplug_owl3
from engine.models.mplug_owl3.config import OwlConfig
from engine.models.mplug_owl3.layout import DYNAMIC_GATE, LAYOUTS, STATIC_GATE
from engine.models.mplug_owl3.reference import greedy_generate
from engine.batch.dynamic_batch import DynamicBatch
from engine.models.mplug_owl3.runner import OwlRunner, image_starts
from engine.models.runner_interface import Runner
from training.tiny_mplug_owl3 import TINY_CONFIG, ensure_tiny_mplug_owl3

from .helpers import image, run_until_done


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request):
    return LAYOUTS[request.param]


@pytest.fixture(scope="module")
def folder(layout):
    return ensure_tiny_mplug_owl3(layout.name)


@pytest.fixture(scope="module")
def runner(folder):
    return OwlRunner(EngineConfig(model=str(folder), dtype="float32"))


@pytest.fixture
def make_engine(runner, folder):
    engines = []

    def make(**overrides):
        runner.image_features.__init__(runner.image_features.budget)  # cold image cache per engine
        eng = LLMEngine(EngineConfig(model=str(folder), dtype="float32", **overrides), runner=runner)
        engines.append(eng)
        return eng
    yield make
    for eng in engines:
        eng.stop()


def user(*items):
    return {"role": "user", "content": [{"type": "image", "image": i} if not isinstance(i, str) else
                                        {"type": "text", "text": i} for i in items]}


def reference(engine, messages, n):
    """Greedy tokens from the plain unbatched, uncached forward (engine/models/mplug_owl3/reference.py)."""
    r = engine.runner
    prompt = engine.prompts.build(messages)
    pixels = torch.cat([im.pixel_inputs["pixel_values"] for im in prompt.images]) if prompt.images else None
    starts = image_starts(prompt.token_ids, r.image_token_id, sum(im.num_image_tokens for im in prompt.images))
    return greedy_generate(r.model, prompt.token_ids, pixels, starts, n, r.eos_ids)


def test_engine_picks_the_owl_runner_from_the_folder(folder):
    assert is_mplug_owl3(folder)
    eng = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    assert isinstance(eng.runner, OwlRunner) and eng.runner.hyper_layers == [0, 2]
    assert isinstance(eng.runner, Runner), "it offers the engine's runner interface"
    assert isinstance(eng.batch, DynamicBatch), "its registry row keeps the dynamic decode batch"


def test_the_layout_is_read_from_the_weight_names(runner, layout):
    assert runner.cfg.layout is layout
    hyper = runner.model.language_model.model.layers[0].self_attn
    if layout.gate == "dynamic":  # 7B-240728: per token and head, from each head's self-attention output
        assert not hasattr(hyper, "gate") and hyper.gate_proj[0].weight.shape == (runner.cfg.head_dim,) * 2
        assert isinstance(runner.model.vision2text_model, torch.nn.Linear)
    else:
        assert not hasattr(hyper, "gate_proj") and hyper.gate.shape == (runner.cfg.hidden_size,)
        assert isinstance(runner.model.vision2text_model, torch.nn.Sequential)
    # The tiny model's gates are neither shut nor saturated, so the exactness tests exercise the mixing.
    self_out = torch.randn(1, 3, runner.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        g = hyper.gate_values(self_out).expand_as(self_out)
    assert 0.2 < float(g.mean()) < 0.8 and float(g.std()) > 0.1
    assert torch.equal(g[0, 0], g[0, 1]) == (layout.gate == "static"), "dynamic gates differ from token to token"


def test_the_crop_size_is_the_configs_else_the_layouts():
    raw = dict(json.loads(json.dumps(TINY_CONFIG)), vocab_size=512)
    assert OwlConfig.from_dict(raw, DYNAMIC_GATE).vision.image_size == 56
    del raw["vision_config"]["image_size"]
    assert OwlConfig.from_dict(raw, DYNAMIC_GATE).vision.image_size == 384  # the 240728 code's init_processor
    assert OwlConfig.from_dict(raw, STATIC_GATE).vision.image_size == 378


def test_the_rope_base_is_read_where_transformers_5_saves_it():
    raw = dict(json.loads(json.dumps(TINY_CONFIG)), vocab_size=512)
    del raw["rope_theta"]
    raw["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
    assert OwlConfig.from_dict(raw, DYNAMIC_GATE).rope_theta == 10000.0
    raw["rope_parameters"]["rope_type"] = "yarn"
    with pytest.raises(ValueError, match="rope scaling"):
        OwlConfig.from_dict(raw, DYNAMIC_GATE)


def test_images_are_cut_into_crops_plus_a_global_view(runner):
    from engine.models.mplug_owl3.processor import choose_grid, cut_prompt

    assert choose_grid(400, 400, 378) == (2, 2)
    assert choose_grid(1200, 300, 378) == (1, 4) and choose_grid(300, 1200, 378) == (4, 1)
    assert choose_grid(900, 600, 378) == (2, 3)  # rows, columns
    assert cut_prompt(1, 2) == ("Cut to 1 rows 2 columns with a global view\nsubimg(0,0)<|image|> "
                                "subimg(0,1)<|image|>\nglobal_view<|image|>")
    out = runner.processor(images=[image(1, (120, 40))], text="<|image|>")
    ids = out["input_ids"][0].tolist()
    size = runner.cfg.vision.image_size
    assert out["pixel_values"].shape == (4, 3, size, size)  # a 1 x 3 grid and the global view
    assert ids.count(runner.image_token_id) == 4


def test_missing_and_unknown_weights_are_named(folder, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    weights = load_file(str(bad / "model.safetensors"))
    weights.pop("language_model.model.layers.2.self_attn.v_kv_proj.weight")
    weights["language_model.model.layers.0.self_attn.surprise"] = torch.zeros(2)
    save_file(weights, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unknown keys.*surprise.*missing keys.*layers\.2\.self_attn\.v_kv_proj"):
        OwlRunner(EngineConfig(model=str(bad), dtype="float32"))
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["hyper_layers"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hyper_layers"):
        OwlRunner(EngineConfig(model=str(bad), dtype="float32"))


def _rewrite(src, dst, edit):
    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    save_file(edit(weights), str(dst / "model.safetensors"))
    return EngineConfig(model=str(dst), dtype="float32")


def test_weights_that_fit_no_supported_layout_are_refused_with_their_names(tmp_path):
    dynamic = ensure_tiny_mplug_owl3(DYNAMIC_GATE.name)

    def no_gate_two_layer_projector(w):  # what a public port of 7B-241101 describes: no gate at all
        w = {k: v for k, v in w.items() if ".gate_proj.0." not in k}
        linear = w.pop("vision2text_model.weight"), w.pop("vision2text_model.bias")
        w["vision2text_model.0.weight"], w["vision2text_model.0.bias"] = linear
        w["vision2text_model.2.weight"] = torch.zeros(linear[0].shape[0], linear[0].shape[0])
        w["vision2text_model.2.bias"] = torch.zeros(linear[0].shape[0])
        return w
    # the projector says static-gate; the strict key check then names the gates the layers lack
    with pytest.raises(ValueError, match=r"layout static-gate .*missing keys.*layers\.0\.self_attn\.gate'"):
        OwlRunner(_rewrite(dynamic, tmp_path / "no-gate", no_gate_two_layer_projector))

    def no_marker(w):
        w = {k: v for k, v in w.items() if ".gate_proj.0." not in k}
        w["vision2text_model.proj.weight"] = w.pop("vision2text_model.weight")
        return w
    with pytest.raises(ValueError, match=r"fits no supported mPLUG-Owl3 layout.*self_attn\.v_kv_proj\.weight"
                                         r".*vision2text_model\.proj\.weight"):
        OwlRunner(_rewrite(dynamic, tmp_path / "unknown", no_marker))

    def mixed(w):  # the 240728 gate with the other layout's projector
        w = no_gate_two_layer_projector(dict(w))
        w.update({k: v for k, v in load_file(str(dynamic / "model.safetensors")).items() if ".gate_proj.0." in k})
        return w
    with pytest.raises(ValueError, match=r"mixes mPLUG-Owl3 layouts: dynamic-gate .*static-gate"):
        OwlRunner(_rewrite(dynamic, tmp_path / "mixed", mixed))


def test_the_image_changes_the_answer(make_engine):
    """Guards the exactness tests below against a model that ignores its images."""
    eng = make_engine()
    hs = [eng.add_request([user(image(s), "What is in the picture?")], greedy(8)) for s in (1, 2)]
    run_until_done(eng)
    a, b = (h.result(0).token_ids for h in hs)
    assert a != b


def test_staggered_batch_with_different_images_matches_reference(make_engine):
    eng = make_engine(max_running=8)
    requests = [
        ([user(image(1), "What colour is the circle?")], 9),
        ([user("Describe the image.", image(2))], 5),  # image after the text: earlier tokens see no image
        ([user("hello there, no picture today")], 7),
        ([user(image(3), image(4), "Compare the two pictures, please.")], 8),
        ([user(image(5), "How many?")], 4),
        ([user("A longer question about nothing in particular, with no image at all?")], 10),
        ([user(image(6), "Where is the triangle? It is on the left, near the top.")], 6),
    ]
    handles = []
    for i, (messages, n) in enumerate(requests):
        handles.append(eng.add_request(messages, greedy(n)))
        if i % 2:  # stagger: later requests join a batch that is already decoding
            eng.step()
            eng.step()
    run_until_done(eng)
    assert eng.stats()["mean_batch_occupancy"] > 2
    for (messages, n), h in zip(requests, handles):
        r = h.result(0)
        assert r.error is None
        assert r.token_ids == reference(eng, messages, n)
    gc.collect()
    assert len(eng.runner._rows) == 0, "finished requests' image K/V must be freed"


def test_time_sliced_answers_match_reference(make_engine):
    """Five groups share two rows, two tokens a slice: each paused answer's image K/V leave and rejoin with it."""
    eng = make_engine(max_running=2, time_slice_tokens=2)
    requests = [([user(image(21), "What colour is the circle?")], 9), ([user("hello there, no picture")], 7),
                ([user(image(22), image(23), "Compare the two pictures, please.")], 8),
                ([user("Describe the image.", image(24))], 6), ([user(image(25), "How many?")], 10)]
    handles = [eng.add_request(m, greedy(n), group=f"addr:{i}") for i, (m, n) in enumerate(requests)]
    run_until_done(eng)
    results = [h.result(0) for h in handles]
    assert sum(r.stats.pauses for r in results) >= len(requests)
    for (messages, n), r in zip(requests, results):
        assert r.token_ids == reference(eng, messages, n)
    gc.collect()
    assert len(eng.runner._rows) == 0, "finished requests' image K/V must be freed"


TURNS = [(image(11, (96, 80)), "What colour is the circle?"), (None, "And where is it?"),
         (image(12), "Compare it with this one.")]


def converse(engine, session_id, n=8):
    messages, results, prompts = [], [], []
    for img, text in TURNS:
        messages.append(user(*([img] if img is not None else []), text))
        prompts.append(list(messages))
        h = engine.add_request(messages, greedy(n), session_id=session_id)
        run_until_done(engine)
        results.append(h.result(0))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": results[-1].text}]})
    return prompts, results


def test_session_follow_ups_match_recompute_and_reference(make_engine):
    cached = make_engine()
    prompts, with_cache = converse(cached, "c1")
    _, recomputed = converse(make_engine(session_cache=False), "c1")
    assert [r.token_ids for r in with_cache] == [r.token_ids for r in recomputed]
    for p, r in zip(prompts, with_cache):
        assert r.token_ids == reference(cached, p, 8)
    assert all(r.stats.cache_source == "session" and r.stats.cached_tokens > 20 for r in with_cache[1:])


def test_follow_up_neither_encodes_nor_projects_the_image_again(make_engine, runner):
    def follow_up(engine):
        messages = [user(image(21), "What colour is the circle?")]
        h = engine.add_request(messages, greedy(6), session_id="s")
        run_until_done(engine)
        messages += [{"role": "assistant", "content": [{"type": "text", "text": h.result(0).text}]},
                     user("And where is it?")]
        runner.image_features.__init__(runner.image_features.budget)  # not the feature cache: the session
        before = dict(runner.counters)
        h = engine.add_request(messages, greedy(6), session_id="s")
        run_until_done(engine)
        return {k: runner.counters[k] - before[k] for k in before}, h.result(0)

    reused, r = follow_up(make_engine())
    assert reused == dict(images_encoded=0, image_kv_computed=0, image_kv_reused=1)
    assert r.stats.cache_source == "session"
    # the counters do count: without the session cache the same follow-up encodes and projects the image
    recomputed, _ = follow_up(make_engine(session_cache=False))
    assert recomputed == dict(images_encoded=1, image_kv_computed=1, image_kv_reused=0)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_parked_sessions_hold_image_kv_in_their_bytes(make_engine, mode):
    engines = {m: make_engine(park_mode=m) for m in ("none", mode)}
    sizes = {}
    for m, eng in engines.items():
        _, results = converse(eng, "p")
        assert all(r.error is None for r in results)
        entry = eng.sessions.entries.get("p")
        # every crop of both images (a 2 x 2 grid plus the global view each), every hyper layer
        assert len({im.sha256.split("/")[0] for im in entry.images}) == 2 and len(entry.images) == 10
        image_bytes = sum(im.nbytes for im in entry.images)
        assert image_bytes > 0 and entry.nbytes == eng.stats()["session_bytes"] - _prefix_bytes(eng)
        sizes[m] = image_bytes
    assert sizes[mode] < 0.6 * sizes["none"]


def _prefix_bytes(eng):
    return sum(eng.sessions.entries.get(k).nbytes for k in eng.sessions.entries.keys() if k.startswith("prefix:"))


def test_chunked_prefill_matches_reference(make_engine):
    """16-token chunks: an image's token and the tokens that see it land in different chunks."""
    eng = make_engine(max_prefill_tokens=16)
    requests = [[user("Please look at this picture and then", image(31), "tell me what colour the circle is.")],
                [user(image(32), "Where is the triangle? It is on the left, near the top.", image(33), "And here?")]]
    handles = [eng.add_request(m, greedy(6)) for m in requests]
    run_until_done(eng)
    for m, h in zip(requests, handles):
        assert h.result(0).token_ids == reference(eng, m, 6)


def test_batch_image_kv_follow_filter_and_append(runner):
    """The merged image K/V kept across decode steps equal a fresh merge after rows leave and join."""
    from engine.models.mplug_owl3.runner import PlacedImage, RowImages

    class Row:  # stands in for a Request: the runner only needs a weak-referenceable key
        pass

    g = torch.Generator().manual_seed(0)
    kvh, d = runner.cfg.num_key_value_heads, runner.cfg.head_dim

    def placed(n_tokens):
        return PlacedImage("x", 0, {layer: (torch.randn(kvh, n_tokens, d, generator=g),
                                            torch.randn(kvh, n_tokens, d, generator=g)) for layer in runner.hyper_layers})
    rows = [Row() for _ in range(5)]
    for r, n_images in zip(rows, (1, 3, 0, 2, 1)):
        runner._rows[r] = RowImages([placed(16) for _ in range(n_images)])
    runner._merged = None
    for batch in ([rows[0], rows[1], rows[2]], [rows[0], rows[2]], [rows[0], rows[2], rows[3], rows[4]], [rows[3]]):
        merged, counts = runner._batch_image_state(batch)
        fresh = runner._batch_images([runner._rows[r] for r in batch])
        assert counts.flatten().tolist() == [len(runner._rows[r].images) for r in batch]
        for layer in runner.hyper_layers:
            a, b = merged[layer], fresh[layer]
            assert torch.equal(a.slot_image, b.slot_image)
            real = (a.slot_image != a.PAD_INDEX)[:, None, :, None]
            assert torch.equal(a.keys * real, b.keys * real) and torch.equal(a.values * real, b.values * real)
    runner._merged = None
