"""Owlet's panel GEMM (engine/models/cpu/panel_gemm.c via engine/models/cpu/panel_gemm.py): the product nn.Linear computes, to fp32
rounding, for every row count and matrix shape (ragged panels and k blocks included); a row's values independent
of the rows beside it; bad arguments refused before they reach C; the build cached per user and refused from a
folder others can write to; a clear reason where it cannot run."""
import os

import pytest
import torch

from engine import EngineConfig
from engine.models.cpu import panel_gemm
from engine.models.model_runner import ModelRunner
from training.tiny_checkpoint import ensure_tiny_checkpoint

needs_panel = pytest.mark.skipif(not panel_gemm.available(), reason="no panel GEMM here (no AVX2 or no C compiler)")


@needs_panel
@pytest.mark.parametrize("out_features,in_features", [(160, 96), (24, 256), (25, 257), (1000, 700), (7, 1),
                                                      (2048, 768), (96, 2100)])
@pytest.mark.parametrize("bias", [True, False])
def test_products_match_nn_linear_and_each_row_is_the_same_alone(out_features, in_features, bias):
    torch.manual_seed(out_features + in_features)
    layer = torch.nn.Linear(in_features, out_features, bias=bias)
    packed = panel_gemm.pack(layer.weight)
    x = torch.randn(70, in_features)
    exact = x.double() @ layer.weight.double().T + (layer.bias.double() if bias else 0)
    plain_error = (torch.nn.functional.linear(x, layer.weight, layer.bias).double() - exact).abs().max()
    with torch.no_grad():
        for m in (1, 2, 3, 4, 5, 7, 8, 13, 16, 33, 70):  # tiles of 4 rows and every remainder; with and without
            got = panel_gemm.product(x[:m], packed, layer.bias)  # the prefetch (up to 32 rows)
            assert got.shape == (m, out_features) and got.dtype == torch.float32
            error = (got.double() - exact[:m]).abs().max()
            assert error <= 4 * plain_error + 1e-7, f"{m} rows: error {error:.2e}, nn.Linear's {plain_error:.2e}"
            alone = [panel_gemm.product(x[r:r + 1], packed, layer.bias) for r in (0, m - 1)]
            assert torch.equal(alone[0][0], got[0]) and torch.equal(alone[1][0], got[m - 1])


@needs_panel
def test_strided_rows_an_empty_sum_and_no_rows():
    torch.manual_seed(0)
    w, b = torch.randn(30, 40), torch.randn(30)
    packed = panel_gemm.pack(w)
    x = torch.randn(40, 6).T  # 6 rows of 40, not contiguous
    torch.testing.assert_close(panel_gemm.product(x, packed, b), torch.nn.functional.linear(x, w, b))
    assert panel_gemm.product(torch.randn(0, 40), packed, b).shape == (0, 30)
    empty = panel_gemm.pack(torch.randn(5, 0))
    assert torch.equal(panel_gemm.product(torch.randn(3, 0), empty, None), torch.zeros(3, 5))
    bias = torch.randn(5)
    assert torch.equal(panel_gemm.product(torch.randn(3, 0), empty, bias), bias.expand(3, 5))


@needs_panel
def test_arguments_the_c_code_would_misread_are_refused():
    packed = panel_gemm.pack(torch.randn(30, 40))
    for x in (torch.randn(4, 41), torch.randn(4, 40, dtype=torch.float64), torch.randn(2, 4, 40)):
        with pytest.raises(ValueError, match="expected fp32 CPU rows of 40"):
            panel_gemm.product(x, packed, None)
    with pytest.raises(ValueError, match=r"bias must be fp32 of shape \(30,\)"):
        panel_gemm.product(torch.randn(4, 40), packed, torch.randn(31))


@needs_panel
def test_the_build_is_cached_per_user_and_refused_from_a_folder_others_can_write(tmp_path, monkeypatch, caplog):
    import shutil

    compiler = shutil.which("cc") or shutil.which("gcc")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = panel_gemm._build(compiler)
    assert first.parent == tmp_path / "cache" / "owlet" / "kernels" and first.exists()
    assert (first.parent.stat().st_mode & 0o777) == 0o700
    built_at = first.stat().st_mtime_ns
    assert panel_gemm._build(compiler) == first and first.stat().st_mtime_ns == built_at, "loaded, not rebuilt"
    os.chmod(first, 0o777)  # someone else could have rewritten it: built again, not loaded
    assert panel_gemm._build(compiler) == first and (first.stat().st_mode & 0o777) == 0o755
    shared = tmp_path / "shared"
    (shared / "owlet" / "kernels").mkdir(parents=True)
    os.chmod(shared / "owlet" / "kernels", 0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    with caplog.at_level("INFO", logger="owlet.engine"):
        private = panel_gemm._build(compiler)
    assert "owned by another user or writable by others" in caplog.text
    assert private.parent != shared / "owlet" / "kernels" and (private.parent.stat().st_mode & 0o077) == 0
    assert not list((shared / "owlet" / "kernels").iterdir()), "nothing written where others can write"
    shutil.rmtree(private.parent)


def test_without_a_compiler_it_is_unavailable_and_on_is_refused_with_the_reason(monkeypatch, caplog):
    monkeypatch.setattr(panel_gemm.shutil, "which", lambda name: None)
    panel_gemm._load.cache_clear()
    try:
        assert not panel_gemm.available()
        reason = panel_gemm.unavailable_reason()
        assert "no C compiler" in reason or "the CPU lacks" in reason or "x86-64" in reason
        with pytest.raises(ValueError, match="cpu_kernels=panel: panel needs float32 on a CPU with AVX2, FMA and a "
                                             r"C compiler; this engine runs torch.float32 \(" + reason[:12]):
            ModelRunner(EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="float32",
                                     cpu_kernels="panel"))
        with caplog.at_level("INFO", logger="owlet.engine"):
            auto = ModelRunner(EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), dtype="float32"))
        assert f"panel GEMM not considered: {reason}" in caplog.text
        assert not any(getattr(m, "_owlet_kernels", None) and m._owlet_kernels.uses("panel")
                       for m in auto.model.modules())
    finally:
        panel_gemm._load.cache_clear()  # the next caller builds (or loads from the cache) again


@needs_panel
@pytest.mark.parametrize("threads", [2, 3])
def test_a_product_split_over_threads_by_panels_equals_the_one_thread_product(threads, monkeypatch):
    torch.manual_seed(1)
    layer = torch.nn.Linear(768, 2048)  # 86 panels of 24 columns
    packed = panel_gemm.pack(layer.weight)
    narrow = torch.nn.Linear(768, 150)  # 7 panels
    narrow_packed = panel_gemm.pack(narrow.weight)
    x = torch.randn(16, 768)
    handed_off = []
    real_helpers = panel_gemm._helpers
    monkeypatch.setattr(panel_gemm, "_helpers", lambda count: handed_off.append(count) or real_helpers(count))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = panel_gemm.product(x, packed, layer.bias)
        narrow_alone = panel_gemm.product(x, narrow_packed, narrow.bias)
        assert handed_off == []
        torch.set_num_threads(threads)
        split = panel_gemm.product(x, packed, layer.bias)
        assert handed_off == [threads - 1]
        narrow_split = panel_gemm.product(x, narrow_packed, narrow.bias)
        assert handed_off == [threads - 1], "7 panels: fewer than 4 for each of two threads, done in one piece"
    finally:
        torch.set_num_threads(before)
    assert torch.equal(split, alone) and torch.equal(narrow_split, narrow_alone)


@needs_panel
def test_a_forked_child_splits_products_on_threads_of_its_own():
    """A pool inherited through fork has no threads behind it; the child must make its own, not wait forever.
    (The operands reach the child through fork and the result comes back as a list: torch's own OpenMP ops can
    hang in a forked child, which is not what is tested here.)"""
    import multiprocessing

    torch.manual_seed(2)
    layer = torch.nn.Linear(768, 2048)
    _forked["operands"] = (torch.randn(16, 768), panel_gemm.pack(layer.weight), layer.bias.detach())
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        expected = panel_gemm.product(*_forked["operands"])  # the parent's pool now exists
        with multiprocessing.get_context("fork").Pool(1) as pool:
            got = pool.apply_async(_product_in_child).get(timeout=60)
    finally:
        torch.set_num_threads(before)
        _forked.clear()
    assert got == expected.tolist()


_forked = {}


def _product_in_child():
    torch.set_num_threads(2)
    return panel_gemm.product(*_forked["operands"]).tolist()
