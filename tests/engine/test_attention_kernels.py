"""On CUDA the engine's eager forward passes keep cuDNN attention out of SDPA's choice (it builds a plan for every
new shape: 38.5 ms a call on an H200, bench/gpu_sdpa_shapes.py)."""
import torch

from engine.models.model_runner import ModelRunner, shape_free_attention
from engine.models.mplug_owl3.runner import OwlRunner


def _backends() -> dict[str, bool]:
    cuda = torch.backends.cuda
    return {"cudnn": cuda.cudnn_sdp_enabled(), "flash": cuda.flash_sdp_enabled(),
            "efficient": cuda.mem_efficient_sdp_enabled(), "math": cuda.math_sdp_enabled()}


class _Runner:
    def __init__(self, device: str):
        self.device = torch.device(device)

    @shape_free_attention
    def forward(self):
        return _backends()


def test_eager_passes_leave_cudnn_out_on_cuda_only_and_restore_the_choice():
    before = _backends()
    assert before["cudnn"], "torch's default lets SDPA pick cuDNN attention"
    inside = _Runner("cuda").forward()
    assert inside == {"cudnn": False, "flash": True, "efficient": True, "math": True}
    assert _backends() == before
    assert _Runner("cpu").forward() == before  # CPU: torch's own choice, untouched


def test_every_forward_pass_of_both_runners_is_wrapped():
    for method in (ModelRunner.prefill, ModelRunner.prefill_together, ModelRunner.decode, ModelRunner.encode_image_full,
                   OwlRunner.prefill, OwlRunner.decode):
        assert getattr(method, "shape_free_attention", False), method.__qualname__
