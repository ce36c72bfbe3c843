"""The text stack's fp32 CPU kernels (engine/models/cpu/linear.py): the same products through MKL's packed GEMM, oneDNN
and Owlet's panel GEMM, each only where the plan puts it, only the text stack routed, and engines on each
kernel exact (the panel kernel's own tests: test_panel_gemm.py)."""
import pytest
import torch

from engine import EngineConfig
from engine.models.cpu import linear as cpu_linear
from engine.models.cpu import panel_gemm
from engine.models.model_runner import ModelRunner
from engine.models.reference_run import reference_run
from training.tiny_checkpoint import ensure_tiny_checkpoint

pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch built without MKL")


def _row_counts_of(monkeypatch, product: str) -> list[int]:
    """Spy on ``cpu_linear.<product>``: the list it returns grows by each call's row count."""
    calls = []
    real = getattr(cpu_linear, product)

    def spy(x, *args):
        calls.append(x.shape[0])
        return real(x, *args)
    monkeypatch.setattr(cpu_linear, product, spy)
    return calls


@pytest.fixture
def packed_calls(monkeypatch):
    return _row_counts_of(monkeypatch, "_packed_product")


@pytest.fixture
def onednn_calls(monkeypatch):
    return _row_counts_of(monkeypatch, "_onednn_product")


@pytest.fixture
def panel_calls(monkeypatch):
    return _row_counts_of(monkeypatch, "_panel_product")


needs_panel = pytest.mark.skipif(not panel_gemm.available(), reason="no panel GEMM here (no AVX2 or no C compiler)")


def _packed_plan(rows):
    return cpu_linear.sgemm_plan(rows).forced(rows, packed=True, onednn=False)


def _linear(seed=0, bias=True):
    torch.manual_seed(seed)
    return torch.nn.Linear(96, 160, bias=bias).eval()


def _linear_and_its_twin(bias: bool):
    """A layer to route and an untouched copy of it (the reference)."""
    layer = _linear(bias=bias)
    plain = torch.nn.Linear(96, 160, bias=bias)
    plain.load_state_dict(layer.state_dict())
    return layer, plain


@pytest.mark.parametrize("bias", [True, False])
def test_products_match_nn_linear(bias, packed_calls):
    layer, plain = _linear_and_its_twin(bias)
    assert [m for m, _ in cpu_linear.use_kernels(layer, 8, lambda _: _packed_plan(8))] == [layer]
    x = torch.randn(2, 4, 96)  # 8 rows, the packed count: bit for bit what nn.Linear gives
    with torch.inference_mode():
        assert torch.equal(layer(x), plain(x))
        assert packed_calls == [8]
        few = torch.randn(5, 96)  # padded to 8: the same values up to the last bit, each row on its own
        got = layer(few)
        torch.testing.assert_close(got, plain(few), rtol=1e-6, atol=1e-6)
        assert torch.equal(layer(few[:3]), got[:3])
        assert packed_calls == [8, 8, 8]
        for rows in (1, 2, 9, 40):  # too few to gain, or more than packed for: nn.Linear's own product
            x = torch.randn(rows, 96)
            assert torch.equal(layer(x), plain(x))
        assert packed_calls == [8, 8, 8]


def test_training_and_reference_runs_take_the_plain_path(packed_calls):
    layer = _linear()
    cpu_linear.use_kernels(layer, 8, lambda _: _packed_plan(8))
    x = torch.randn(6, 96)
    layer(x).sum().backward()  # grad mode: autograd needs nn.Linear's own op
    assert layer.weight.grad is not None
    with torch.inference_mode(), reference_run():
        layer(x)
    assert packed_calls == []
    with torch.inference_mode():
        layer(x)
    assert packed_calls == [8]


def test_onednn_products_match_nn_linear_and_do_not_depend_on_the_row_count(onednn_calls, packed_calls):
    layer = _linear(bias=True)
    plain = torch.nn.Linear(96, 160)
    plain.load_state_dict(layer.state_dict())
    plan = cpu_linear.sgemm_plan(8).forced(8, packed=False, onednn=True)
    assert cpu_linear.use_kernels(layer, 8, lambda _: plan) == [(layer, plan)]
    assert layer._owlet_packed_rows is None, "no packed copy where the plan never packs"
    x = torch.randn(40, 96)
    with torch.inference_mode():
        got = layer(x.reshape(2, 20, 96))
        torch.testing.assert_close(got.reshape(40, 160), plain(x), rtol=1e-5, atol=1e-6)
        assert torch.equal(layer(x[:5]), got.reshape(40, 160)[:5]), "a row is the same in a 5- or 40-row product"
        assert onednn_calls == [40, 5] and packed_calls == []
        for rows in (1, 2):  # a matrix-vector product: nn.Linear's own
            assert torch.equal(layer(x[:rows]), plain(x[:rows]))
        assert onednn_calls == [40, 5]


def _assert_routed_like_nn_linear(layer, plain, calls: list, untouched: list, rows_alone_equal: bool = False):
    """``layer``, routed to a copying kernel, against ``plain`` (its weights through nn.Linear): the same values to
    fp32 rounding for a 40-row and a 5-row product, which reach the kernel (``calls``; ``untouched``, another
    kernel's calls, stays empty), and nn.Linear's own op for 1-2 rows, in a reference run and under autograd.
    ``rows_alone_equal``: the 5 rows alone equal, bit for bit, the same rows within the 40."""
    x = torch.randn(2, 20, 96)
    with torch.inference_mode():
        got = layer(x)
        assert got.shape == (2, 20, 160)
        torch.testing.assert_close(got, plain(x), rtol=1e-5, atol=1e-5)
        few = layer(x[0, :5])
        torch.testing.assert_close(few, plain(x[0, :5]), rtol=1e-5, atol=1e-5)
        assert not rows_alone_equal or torch.equal(few, got[0, :5]), "a row's values depend on the rows beside it"
        assert calls == [40, 5] and untouched == []
        for rows in (1, 2):  # a matrix-vector product: nn.Linear's own
            assert torch.equal(layer(x[0, :rows]), plain(x[0, :rows]))
        with reference_run():  # a reference run: nn.Linear's own
            assert torch.equal(layer(x), plain(x))
    assert calls == [40, 5]
    layer(x).sum().backward()  # grad mode: autograd needs nn.Linear's own op
    assert layer.weight.grad is not None and calls == [40, 5]


@needs_panel
@pytest.mark.parametrize("bias", [True, False])
def test_panel_products_match_nn_linear_on_a_packed_copy(bias, panel_calls, packed_calls):
    layer, plain = _linear_and_its_twin(bias)
    plan = cpu_linear.sgemm_plan(8).forced(8, packed=True, onednn=True, panel=True)
    assert plan.describe() == "3-8 packed, 9+ panel", "the panel GEMM takes what the packed product does not"
    plan = cpu_linear.sgemm_plan(8).forced(8, packed=False, onednn=False, panel=True)
    assert cpu_linear.use_kernels(layer, 8, lambda _: plan) == [(layer, plan)]
    assert layer._owlet_packed_rows is None and layer._owlet_copy_bytes == 96 * 160 * 4, "one packed copy"
    _assert_routed_like_nn_linear(layer, plain, panel_calls, packed_calls, rows_alone_equal=True)


def test_plan_takes_the_choice_of_the_smallest_probed_count_at_or_above():
    plan = cpu_linear.KernelPlan(((3, "sgemm"), (8, "packed"), (16, "onednn"), (128, "sgemm")))
    assert [plan.kernel_for(n) for n in (1, 2, 3, 4, 8, 9, 16, 17, 128, 4000)] == \
        ["sgemm", "sgemm", "sgemm", "packed", "packed", "onednn", "onednn", "sgemm", "sgemm", "sgemm"]
    assert plan.describe() == "4-8 packed, 9-16 onednn"
    forced = plan.forced(16, packed=True, onednn=False)
    assert [k for _, k in forced.choices] == ["packed", "packed", "packed", "sgemm"]
    assert plan.forced(16, packed=False, onednn=True).describe() == "3+ onednn"


def test_runner_routes_the_text_stack_only(runners):
    runner = runners("lfm2vl")  # fp32 on CPU, the test settings: packed for decode rows, oneDNN for the rest
    model = runner.model
    text = [m for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)]
    vision = [m for m in model.model.vision_tower.modules() if isinstance(m, torch.nn.Linear)]
    assert text and vision
    assert all(getattr(m, "_owlet_packed_rows", None) == 16 for m in text)
    assert {m._owlet_kernels.kernel_for(n) for m in text for n in (3, 16)} == {"packed"}
    assert {m._owlet_kernels.kernel_for(n) for m in text for n in (17, 500)} == {"onednn"}
    assert not any(hasattr(m, "_owlet_kernels") for m in vision)
    assert runner.weight_copy_bytes == sum(m.weight.numel() * 4 for m in text) + (
        model.get_output_embeddings().weight.numel() * 4)
    wide = runners("lfm2vl", max_running=64)  # larger batches keep 16-row packs (see MAX_PACKED_ROWS)
    assert {getattr(m, "_owlet_packed_rows", None) for m in wide.model.get_decoder().modules()
            if isinstance(m, torch.nn.Linear)} == {cpu_linear.MAX_PACKED_ROWS}
    narrow = runners("lfm2vl", max_running=4)
    assert {getattr(m, "_owlet_packed_rows", None) for m in narrow.model.get_decoder().modules()
            if isinstance(m, torch.nn.Linear)} == {4}
    off = runners("lfm2vl", cpu_kernels="off")
    assert off.weight_copy_bytes == 0
    assert not any(hasattr(m, "_owlet_kernels") for m in off.model.modules())


@pytest.mark.parametrize("kernel", ["onednn", pytest.param("panel", marks=needs_panel)])
@pytest.mark.parametrize("fam", ["lfm2vl", "llava"])
def test_an_engine_on_one_kernel_alone_matches_generate(fam, kernel, runners):
    """Every product of 3 rows or more through oneDNN or through the panel GEMM (prefill chunks
    and decode steps alike), staggered arrivals batched together: the same greedy tokens as per-request generate()
    on the model's own nn.Linear."""
    from engine import LLMEngine

    from .helpers import reference_tokens, serve_staggered
    from .test_exactness import workload

    runner = runners(fam, cpu_kernels=kernel)
    text = [m for m in runner.model.get_decoder().modules() if isinstance(m, torch.nn.Linear)]
    assert {m._owlet_kernels.kernel_for(n) for m in text for n in (3, 16, 200)} == {kernel}
    engine = LLMEngine(EngineConfig(model=str(ensure_tiny_checkpoint(fam)), dtype="float32", max_running=4),
                       runner=runner)
    try:
        reqs = workload()
        handles = serve_staggered(engine, reqs)
        assert engine.stats()["mean_batch_occupancy"] > 1.5, "requests were not batched together"
        for (messages, n), h in zip(reqs, handles):
            assert h.result(timeout=0).token_ids == reference_tokens(runner, messages, n)
    finally:
        engine.stop()


def test_kernels_asked_for_where_they_cannot_apply_are_refused_clearly():
    model = str(ensure_tiny_checkpoint("lfm2vl"))
    with pytest.raises(ValueError, match="cpu_kernels=packed: packed needs float32 on a CPU with MKL"):
        ModelRunner(EngineConfig(model=model, dtype="bfloat16", cpu_kernels="packed"))
    with pytest.raises(ValueError, match="cpu_kernels=onednn: onednn needs float32 on a CPU with oneDNN"):
        ModelRunner(EngineConfig(model=model, dtype="bfloat16", cpu_kernels="onednn"))
    with pytest.raises(ValueError, match="cpu_kernels=panel: panel needs float32 on a CPU with AVX2, FMA and a C"):
        ModelRunner(EngineConfig(model=model, dtype="bfloat16", cpu_kernels="panel"))
    for bad in ("yes", "on", "onednn,fast", ""):
        with pytest.raises(ValueError, match="cpu_kernels must be auto, off or a comma list of packed, onednn, panel"):
            EngineConfig(model="x", cpu_kernels=bad)


def test_auto_does_not_pack_what_would_not_fit(monkeypatch, caplog):
    from engine.models import cpu

    monkeypatch.setattr(cpu, "_available_memory_bytes", lambda: 4 * 2**20)  # a quarter: 1 MiB
    cfg = EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="float32")
    with caplog.at_level("INFO", logger="owlet.engine"):
        runner = ModelRunner(cfg)
    assert runner.weight_copy_bytes == 0
    assert not any(getattr(m, "_owlet_packed_rows", None) for m in runner.model.modules())
    assert "not packing" in caplog.text and "quarter of the available memory" in caplog.text
    assert not panel_gemm.available() or "not packing panels of" in caplog.text
    named = ModelRunner(EngineConfig(model=cfg.model, dtype="float32", cpu_kernels="packed"))
    assert named.weight_copy_bytes > 0  # a named kernel is the operator's call


def test_calibration_picks_the_fastest_kernel_per_row_count_with_a_margin_over_sgemm(packed_calls, onednn_calls):
    """A made-up clock. On the 96x160 matrices (out 160, in 96): the packed product costs 10 whatever its rows,
    sgemm 1 a row, oneDNN 0.97 a row below 16 rows (inside sgemm's 5 % margin: not used) and 0.5 a row from 16 up.
    So 16 rows -> oneDNN (8 < 10), 12 -> packed (10 < 11.4), 8 and fewer -> sgemm, 128 -> oneDNN. On the 160x96
    matrix every kernel costs 1: sgemm everywhere, so that module is not routed at all."""
    clock = []

    def fake(kernel, weights, packed, bias, rows, n):
        shape = tuple(weights[0].shape)
        assert kernel != "packed" or (packed is not None and len(packed) == len(weights) and n <= rows)
        if len(weights) > 1:  # a timed pass streams through copies (an untimed first call uses one)
            clock.append((shape, kernel, n))
        if shape != (160, 96):
            return 1.0
        return {"packed": 10.0, "sgemm": float(n), "onednn": (0.5 if n >= 16 else 0.97) * n}[kernel]
    model = torch.nn.Sequential(_linear(0), _linear(1), torch.nn.Linear(160, 96)).eval()
    calibration = cpu_linear.Calibration(16, time_product=fake)
    routed = cpu_linear.use_kernels(model, 16, calibration)
    assert [m for m, _ in routed] == [model[0], model[1]]
    plan = calibration.by_shape[(160, 96, True)]
    assert plan.choices == ((3, "sgemm"), (4, "sgemm"), (6, "sgemm"), (8, "sgemm"), (12, "packed"),
                            (16, "onednn"), (128, "onednn"))
    assert plan.describe() == "9-12 packed, 13+ onednn"
    assert calibration.by_shape[(96, 160, True)].describe() == "sgemm"
    assert sum(1 for shape, _, _ in clock if shape == (160, 96)) == (6 * 3 + 2) * 4, \
        "each shape measured once: three kernels at 6 decode counts, sgemm and oneDNN at 128, in 4 rounds"
    with torch.inference_mode():
        model[0](torch.randn(8, 96))
        assert packed_calls == [] and onednn_calls == []
        model[0](torch.randn(10, 96))
        assert packed_calls == [16] and onednn_calls == []
        model[0](torch.randn(2, 50, 96))
        assert onednn_calls == [100]
    without = cpu_linear.Calibration(16, packed=False, onednn=False, time_product=fake)
    assert without(model[0]).describe() == "sgemm"
    if panel_gemm.available():  # the panel GEMM at 0.3 a row from 4 rows up, timed on its packed copies

        def with_panel(kernel, weights, copies, bias, rows, n):
            if kernel != "panel":
                return fake(kernel, weights, copies, bias, rows, n)
            assert [(c.out_features, c.in_features) for c in copies] == [tuple(w.shape) for w in weights]
            return (0.3 if n >= 4 else 2.0) * n
        assert cpu_linear.Calibration(16, panel=True, time_product=with_panel)(model[0]).describe() == "4+ panel"
    head = torch.nn.Linear(96, 160).eval()  # same shape as model[0], but an LM head: never more than 16 rows
    clock.clear()
    with_head = cpu_linear.Calibration(16, time_product=fake, decode_only=(head,))
    assert with_head(head).choices[-1] == (16, "onednn") and with_head(model[0]).choices[-1] == (128, "onednn")
    assert (160, 96, True, "decode only") in with_head.by_shape and (160, 96, True) in with_head.by_shape
    assert sum(1 for _, _, n in clock if n == 128) == 2 * 4, "128 rows timed for model[0] only (two kernels)"


def test_calibration_on_this_machine_gives_a_plan_over_the_probed_counts():
    layer = torch.nn.Linear(512, 1024).eval()
    plan = cpu_linear.Calibration(16)(layer)
    assert [n for n, _ in plan.choices] == [3, 4, 6, 8, 12, 16, 128]
    assert {k for _, k in plan.choices} <= {"sgemm", "packed", "onednn"}
    assert plan.kernel_for(128) != "packed"
    if panel_gemm.available():
        plan = cpu_linear.Calibration(16, panel=True)(layer)
        assert {k for _, k in plan.choices} <= {"sgemm", "packed", "onednn", "panel"}


def test_matrices_under_the_smallest_measured_size_get_sgemm_unmeasured(monkeypatch, caplog):
    """The test models' matrices are all under ``SMALLEST_MEASURED``: an engine on one measures nothing (measuring
    cost each engine start about 2 s) and routes nothing; a matrix at the size is measured."""
    def no_clock(*args):
        raise AssertionError(f"measured {args[0]} on a matrix under the smallest measured size")
    monkeypatch.setattr(cpu_linear, "_time_product", no_clock)
    with caplog.at_level("INFO", logger="owlet.engine"):
        runner = ModelRunner(EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="float32"))
    assert runner.weight_copy_bytes == 0
    assert not any(hasattr(m, "_owlet_kernels") for m in runner.model.modules())
    assert f"64x64: sgemm (unmeasured: under {cpu_linear.SMALLEST_MEASURED:,} weights)" in caplog.text

    timed = []

    def clock(kernel, weights, copies, bias, rows, n):
        timed.append(tuple(weights[0].shape))
        return 1.0 if kernel == "sgemm" else 0.5
    small = torch.nn.Linear(127, 256)  # 32,512 weights
    large = torch.nn.Linear(128, 256)  # 32,768
    calibration = cpu_linear.Calibration(16, time_product=clock, smallest_measured=cpu_linear.SMALLEST_MEASURED)
    assert calibration(small).describe() == "sgemm" and (256, 127, True) in calibration.unmeasured
    assert calibration(large).describe() != "sgemm" and (256, 128, True) not in calibration.unmeasured
    assert set(timed) == {(256, 128)}


def test_auto_routes_nothing_where_no_kernel_beats_sgemm(monkeypatch, caplog):
    monkeypatch.setattr(cpu_linear, "SMALLEST_MEASURED", 0)  # measure the test model's small matrices
    monkeypatch.setattr(cpu_linear, "_time_product", lambda kernel, *a: 1.0 if kernel == "sgemm" else 2.0)
    with caplog.at_level("INFO", logger="owlet.engine"):
        runner = ModelRunner(EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="float32"))
    assert runner.weight_copy_bytes == 0
    assert not any(hasattr(m, "_owlet_kernels") for m in runner.model.modules())
    assert "CPU linear calibration" in caplog.text and ": sgemm" in caplog.text and "unmeasured" not in caplog.text
