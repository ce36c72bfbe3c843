"""Prepacked fp32 text weights (engine/cpu_linear.py): the same products, the packed kernel only where it
applies, and only the text stack packed."""
import pytest
import torch

from engine import EngineConfig, cpu_linear
from engine.model_runner import ModelRunner
from training.tiny_checkpoint import ensure_tiny_checkpoint

pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch built without MKL")


@pytest.fixture
def packed_calls(monkeypatch):
    calls = []
    real = cpu_linear._packed_product

    def spy(x, *args):
        calls.append(x.shape[0])
        return real(x, *args)
    monkeypatch.setattr(cpu_linear, "_packed_product", spy)
    return calls


def _linear(seed=0, bias=True):
    torch.manual_seed(seed)
    return torch.nn.Linear(96, 160, bias=bias).eval()


@pytest.mark.parametrize("bias", [True, False])
def test_products_match_nn_linear(bias, packed_calls):
    layer = _linear(bias=bias)
    plain = torch.nn.Linear(96, 160, bias=bias)
    plain.load_state_dict(layer.state_dict())
    assert cpu_linear.pack_linears(layer, rows=8) == [layer]
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
    cpu_linear.pack_linears(layer, rows=8)
    x = torch.randn(6, 96)
    layer(x).sum().backward()  # grad mode: autograd needs nn.Linear's own op
    assert layer.weight.grad is not None
    with torch.inference_mode(), cpu_linear.unpacked():
        layer(x)
    assert packed_calls == []
    with torch.inference_mode():
        layer(x)
    assert packed_calls == [8]


def test_runner_packs_the_text_stack_only(runners):
    runner = runners("lfm2vl")  # fp32 on CPU, default settings: packed for max_running rows
    model = runner.model
    text = [m for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)]
    vision = [m for m in model.model.vision_tower.modules() if isinstance(m, torch.nn.Linear)]
    assert text and vision
    assert all(getattr(m, "_owlet_packed_rows", None) == 16 for m in text)
    assert not any(hasattr(m, "_owlet_packed_rows") for m in vision)
    assert runner.packed_weight_bytes == sum(m.weight.numel() * 4 for m in text) + (
        model.get_output_embeddings().weight.numel() * 4)
    wide = runners("lfm2vl", max_running=64)  # larger batches keep 16-row packs (see MAX_PACKED_ROWS)
    assert {getattr(m, "_owlet_packed_rows", None) for m in wide.model.get_decoder().modules()
            if isinstance(m, torch.nn.Linear)} == {cpu_linear.MAX_PACKED_ROWS}
    narrow = runners("lfm2vl", max_running=4)
    assert {getattr(m, "_owlet_packed_rows", None) for m in narrow.model.get_decoder().modules()
            if isinstance(m, torch.nn.Linear)} == {4}
    off = runners("lfm2vl", cpu_packed_weights="off")
    assert off.packed_weight_bytes == 0
    assert not any(hasattr(m, "_owlet_packed_rows") for m in off.model.modules())


def test_packing_asked_for_where_it_cannot_apply_is_refused_clearly():
    cfg = EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="bfloat16", cpu_packed_weights="on")
    with pytest.raises(ValueError, match="cpu_packed_weights=on needs float32"):
        ModelRunner(cfg)
    with pytest.raises(ValueError, match="cpu_packed_weights must be auto, on or off"):
        EngineConfig(model="x", cpu_packed_weights="yes")


def test_auto_does_not_pack_what_would_not_fit(monkeypatch, caplog):
    from engine import model_runner

    monkeypatch.setattr(model_runner, "_available_memory_bytes", lambda: 4 * 2**20)  # a quarter: 1 MiB
    cfg = EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="float32")
    with caplog.at_level("INFO", logger="owlet.engine"):
        runner = ModelRunner(cfg)
    assert runner.packed_weight_bytes == 0
    assert not any(hasattr(m, "_owlet_packed_rows") for m in runner.model.modules())
    assert "not packing" in caplog.text and "quarter of the available memory" in caplog.text
    forced = ModelRunner(EngineConfig(model=cfg.model, dtype="float32", cpu_packed_weights="on"))
    assert forced.packed_weight_bytes > 0  # "on" is the operator's call


def test_calibration_packs_from_the_measured_crossover_and_not_where_packing_never_wins(packed_calls):
    """A made-up clock: the packed product costs 10 whatever its real rows; sgemm costs 1 per row on the 96x160
    matrices (so packing wins from 11 rows: measured at 16 and 12, lost at 8) and 1 in all on the 160x96 one."""
    clock = []

    def fake(packed, weights, bias, rows, n):
        shape = tuple(weights[0].shape)
        clock.append(shape)
        assert len(weights) > 1 and (packed is None or len(packed) == len(weights)), "streamed through copies"
        if packed is not None:
            return 10.0
        return float(n) if shape == (160, 96) else 1.0
    model = torch.nn.Sequential(_linear(0), _linear(1), torch.nn.Linear(160, 96)).eval()
    calibration = cpu_linear.Calibration(16, fake)
    packed = cpu_linear.pack_linears(model, 16, calibration)
    assert packed == [model[0], model[1]]
    assert calibration.by_shape == {(160, 96, True): 12, (96, 160, True): None}
    assert clock.count((160, 96)) == 6, "each shape is measured once (16, 12, 8 rows; packed and sgemm)"
    with torch.inference_mode():
        model[0](torch.randn(11, 96))
        assert packed_calls == []
        model[0](torch.randn(12, 96))
        assert packed_calls == [16]


def test_calibration_on_this_machine_gives_a_row_count_it_tried_or_none():
    layer = torch.nn.Linear(512, 1024).eval()
    found = cpu_linear.Calibration(16)(layer)
    assert found is None or found in (16, 12, 8, 6, 4, 3)


def test_auto_packs_nothing_where_the_packed_product_never_wins(monkeypatch, caplog):
    monkeypatch.setattr(cpu_linear, "_time_product", lambda packed, *a: 2.0 if packed is not None else 1.0)
    with caplog.at_level("INFO", logger="owlet.engine"):
        runner = ModelRunner(EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="float32"))
    assert runner.packed_weight_bytes == 0
    assert not any(hasattr(m, "_owlet_packed_rows") for m in runner.model.modules())
    assert "packed-GEMM calibration" in caplog.text and "None" in caplog.text
