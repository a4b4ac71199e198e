"""`warpolicy.bench.rig`: the set-up every GPU benchmark shares."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from warpolicy.bench.rig import device_name, open_rig, synthetic_config  # noqa: E402
from warpolicy.bench.timing import HostProbe  # noqa: E402
from warpolicy.errors import CudaUnavailableError, InputError  # noqa: E402
from warpolicy.registry.vocabulary import ForwardMode  # noqa: E402


def test_the_simulated_rig_is_tiny_host_timed_and_on_the_cpu():
    rig = open_rig("sim", "test bench")
    assert rig.simulated and rig.platform.name == "sim" and rig.probe is HostProbe
    assert rig.device == torch.device("cpu") and device_name(rig.platform) == "sim"
    assert rig.layer_rows(100.0, 16) == 8
    rig.bookkeeping("copy", 300.0, 16)()  # a tiny matmul stands in for any kind
    with pytest.raises(InputError, match="sched_kind must be one of"):
        rig.bookkeeping("warp", 300.0, 16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_without_cuda_the_rig_names_the_benchmark_and_the_simulated_way():
    with pytest.raises(CudaUnavailableError, match="test bench needs a CUDA device.*--device sim"):
        open_rig(None, "test bench")


def test_the_synthetic_config_is_one_bucket_per_mode_in_float32_on_the_cpu():
    modes = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY)
    cfg = synthetic_config(
        "cpu", batch=4, hidden=16, layers=2, layer_rows=8, modes=modes, shared_index=True
    )
    assert cfg.reqs == 8 and dict(cfg.buckets) == {m: (4,) for m in modes}
    assert cfg.dtype == torch.float32 and cfg.shared_index
