"""The grid of a persistent launch: one CTA per SM, in whole clusters, and no more clusters than
the GPU runs at once (``runtime.persistent_grid``, ``device.max_active_clusters``).

CPU tier: the rule, with the device's answers stood in for. GPU tier (``gpu``): the driver's
answers on the GPU at hand. Nothing here launches a kernel (the driver's occupancy query only
loads an empty one), so the GPU tests run in the test process.
"""

import warnings

import pytest

from gemm_ladder.core import device
from gemm_ladder.core.manifest import ManifestError
from gemm_ladder.serve import runtime
from gemm_ladder.serve.runtime import GemmModule, ModuleInputError, persistent_grid

V9_2X2 = {"persistent": True, "cluster": 4, "threads": 384, "smem_bytes": 230400}


def stand_in(monkeypatch, sms, fit):
    """A GPU of ``sms`` SMs that runs ``fit(cluster)`` clusters at once (an exception: the driver
    cannot be asked)."""
    asked = []

    def max_active_clusters(index, cluster, threads, smem_bytes):
        asked.append((index, cluster, threads, smem_bytes))
        if isinstance(fit, Exception):
            raise fit
        return fit(cluster)

    monkeypatch.setattr(device, "sm_count", lambda index: sms)
    monkeypatch.setattr(device, "max_active_clusters", max_active_clusters)
    return asked


@pytest.mark.parametrize("sms, cluster, fit, ctas", [
    (132, 4, 30, 120),   # an H100 SXM: 30 clusters of 4 fit, not 132 // 4 = 33
    (132, 2, 66, 132),   # pairs: every SM
    (148, 4, 37, 148),   # all of them fit: the SM count in whole clusters
    (150, 4, 40, 148),   # more fit than the SMs hold: the SMs decide
    (114, 2, 50, 100),
])
def test_grid_is_the_clusters_that_fit_at_once(monkeypatch, sms, cluster, fit, ctas):
    asked = stand_in(monkeypatch, sms, lambda c: fit)
    launch = {**V9_2X2, "cluster": cluster}
    assert persistent_grid(0, launch) == ctas
    assert asked == [(0, cluster, 384, 230400)]  # asked with the module's threads and shared memory


def test_grid_without_clusters_is_the_sm_count_and_asks_nothing(monkeypatch):
    asked = stand_in(monkeypatch, 132, lambda c: 1)
    assert persistent_grid(0, {"persistent": True, "threads": 384, "smem_bytes": 1000}) == 132
    assert asked == []


def test_grid_falls_back_to_whole_clusters_with_a_warning(monkeypatch):
    stand_in(monkeypatch, 130, RuntimeError("cuOccupancyMaxActiveClusters failed: invalid value"))
    with pytest.warns(RuntimeWarning, match=r"v9\.so: the driver could not say .* clusters of 4 .* 128 CTAs"):
        assert persistent_grid(0, V9_2X2, "v9.so") == 128


def test_grid_refuses_a_cluster_that_never_fits(monkeypatch):
    stand_in(monkeypatch, 132, lambda c: 0)
    with pytest.raises(ModuleInputError, match="cannot run a cluster of 4 CTAs with 230400 bytes.*cluster_m=1, cluster_n=1"):
        persistent_grid(0, V9_2X2, "v9.so")


def test_grid_needs_the_launch_the_manifest_records(monkeypatch):
    stand_in(monkeypatch, 132, lambda c: 30)
    with pytest.raises(ManifestError, match="v9.so: .*no threads or smem_bytes.*re-export"):
        persistent_grid(0, {"persistent": True, "cluster": 4}, "v9.so")


def test_module_asks_once_per_gpu(monkeypatch):
    """The driver's answer is kept per GPU index: a launch does not load a probe kernel again."""
    import torch

    asked = stand_in(monkeypatch, 132, lambda c: 30)
    man = {"rung": "v9", "shape": [4096] * 3, "dtype": "float16", "arch": "sm_90a", "knobs": {},
           "tvm_version": "0.27.0.post1", "launch": V9_2X2}
    mod = GemmModule("v9.so", man, None)
    for _ in range(3):
        assert mod.launch_args(torch.device("cuda", 0)) == [120]
    assert mod.launch_args(torch.device("cuda", 1)) == [120]
    assert [a[0] for a in asked] == [0, 1]


def test_driver_query_without_a_driver_raises(monkeypatch):
    """No libcuda (a build box): a RuntimeError that says so, which the runtime turns into the
    fallback above."""
    import ctypes

    def no_lib(name, *a, **k):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_lib)
    with pytest.raises(RuntimeError, match="CUDA driver library cannot be loaded.*libcuda"):
        device.max_active_clusters(0, 4, 384, 230400)


def test_driver_structures_have_the_c_layout():
    """CUlaunchAttribute is an id and a 64-byte union at offset 8; CUlaunchConfig's stream, attrs
    and count sit where the C compiler puts them (a wrong offset reads garbage in the driver)."""
    import ctypes

    attr, cfg = device.driver_types()
    assert (ctypes.sizeof(attr), attr.value.offset) == (72, 8)
    assert (ctypes.sizeof(cfg), cfg.stream.offset, cfg.attrs.offset, cfg.num_attrs.offset) == (56, 32, 40, 48)


# -- the GPU at hand (an export run for a GPU box has nothing to export here) --------------------
on_gpu = pytest.mark.skipif(device.probe(0) is None, reason="no CUDA GPU here: the gpu tier runs on an H100/H200")


@pytest.mark.gpu
@on_gpu
def test_driver_answers_on_this_gpu():
    """One CTA per SM: as many single-CTA clusters as SMs; pairs fill the SMs up to one; clusters
    of 4 and 8 no more than the SMs allow and, on an H100 SXM, fewer (whole GPCs)."""
    sms = device.sm_count(0)
    fit = {c: device.max_active_clusters(0, c, 384, 230400) for c in (1, 2, 4, 8)}
    assert fit[1] == sms
    assert sms // 2 - 1 <= fit[2] <= sms // 2
    assert 0 < fit[4] <= sms // 4 and 0 < fit[8] <= sms // 8
    assert fit[8] <= fit[4] // 2 + 1
    if "H100" in device.name_of(0) and sms == 132:
        assert fit[4] < 33  # the case this exists for: 132 // 4 clusters do not run at once


@pytest.mark.gpu
@on_gpu
def test_grid_of_a_2x2_module_on_this_gpu():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the driver must answer here: no fallback
        ctas = runtime.persistent_grid(0, V9_2X2)
    assert ctas % 4 == 0 and ctas == 4 * device.max_active_clusters(0, 4, 384, 230400)


def test_v9_takes_four_row_tiles_a_cluster_and_the_other_rungs_do_not():
    # the compiler's side, imported here: this file's GPU tier runs on the runtime-only box
    from gemm_ladder.core.config import ConfigError  # pylint: disable=import-outside-toplevel
    from gemm_ladder.core.spec import GemmSpec  # pylint: disable=import-outside-toplevel
    from gemm_ladder.protocol.check import check_config  # pylint: disable=import-outside-toplevel
    from gemm_ladder.rungs import make_config  # pylint: disable=import-outside-toplevel
    from gemm_ladder.sm90a import hgemm_v9  # pylint: disable=import-outside-toplevel

    # v9's cluster_m=4 (common.CLUSTER_M_WIDE: four row tiles share B's tile, as cuBLASLt's 1x4 fp8 kernels;
    # measured slower, benchmarks/results/2026-11-28_h100_fp8_clusters4/): B's tile in four parts of whole atoms
    cfg = make_config("v9", 1024, 1024, 1024, spec=GemmSpec.fp8(), blk_n=128, overlap=4, promote=1, cluster_m=4,
                      pipe_depth=4)
    assert hgemm_v9.launch(cfg)["cluster"] == 4
    assert check_config(cfg).ok
    with pytest.raises(ConfigError, match="cluster_m=4 is not supported on v10; use cluster_m=1 or 2"):
        make_config("v10", 1024, 1024, 1024, cluster_m=4)
    with pytest.raises(ConfigError, match="multiple of 32"):
        make_config("v9", 1024, 1024, 1024, spec=GemmSpec.fp8(), blk_n=112, cluster_m=4, epi_n=16)
