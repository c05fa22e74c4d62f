"""v9's tile widths in whole 16 columns (issue 32: cuBLASLt's 128x96, 128x112 and 128x144 tiles): which
rungs take which blk_n, how an epilogue chunk of any whole 16 columns leaves (``epilogue.chunk_swizzle``: the
widest swizzle that divides its row, one TMA box a swizzle row), and that the kernels TVM builds at those
widths issue the wgmma and the D stores that says. CPU only; the GPU checks are
``benchmarks/results/2026-11-28_h100_fp8_widths/`` (16-bit ``verify`` and fp8 sweeps, every module right)."""

from __future__ import annotations

import pytest

from gemm_ladder.core.config import BLK_N_16, ConfigError
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.rungs import make_config
from gemm_ladder.sm90a import epilogue
from tests.lowered import tma_specs

SWIZZLE_CODE = {"32B": 1, "64B": 2, "128B": 3}  # CUtensorMapSwizzle, as TVM's TensorMap spec records it


def test_v9_takes_every_whole_16_columns_and_the_other_rungs_whole_64s():
    for blk_n in (80, 96, 112, 144, 160, 208, 240):
        assert make_config("v9", 1024, 2112, 512, blk_n=blk_n, epi_n=16).blk_n == blk_n
    assert BLK_N_16 == tuple(range(32, 257, 16))
    with pytest.raises(ConfigError, match=r"blk_n=100 is not supported by v9.*a multiple of 16 from 32 to 256"):
        make_config("v9", 1024, 2112, 512, blk_n=100)
    with pytest.raises(ConfigError, match=r"blk_n=96 is not supported by v8.*use 64, 128, 192 or 256"):
        make_config("v8", 1024, 2112, 512, blk_n=96)
    with pytest.raises(ConfigError, match=r"blk_n=272"):
        make_config("v9", 1024, 2112, 512, blk_n=272)


def test_epi_n_is_any_whole_16_that_divides_the_tile():
    assert dict(make_config("v9", 1024, 2112, 512, blk_n=96, epi_n=32).extra)["epi_n"] == 32
    with pytest.raises(ConfigError, match=r"epi_n=64 must be a multiple of 16 that divides blk_n=96; use one of "
                                          r"\[16, 32, 48, 96\]"):
        make_config("v9", 1024, 2112, 512, blk_n=96, epi_n=64)  # v9's default chunk does not divide 96
    with pytest.raises(ConfigError, match=r"epi_n=24 must be a multiple of 16"):
        make_config("v9", 1024, 2112, 512, blk_n=96, epi_n=24)


@pytest.mark.parametrize("cols, elem_bytes, mode, box", [
    (64, 2, "128B", 64), (128, 2, "128B", 64), (96, 2, "64B", 32), (32, 2, "64B", 32), (112, 2, "32B", 16),
    (48, 2, "32B", 16), (16, 2, "32B", 16),
    (32, 4, "128B", 32), (48, 4, "64B", 16), (8, 4, "32B", 8),  # a float32 D: epi_n / 2 columns a chunk
])
def test_a_chunk_takes_the_widest_swizzle_that_divides_its_row_and_one_box_a_swizzle_row(cols, elem_bytes, mode, box):
    assert epilogue.chunk_swizzle(cols, elem_bytes) == (mode, box)


def test_a_chunk_of_no_whole_32_bytes_is_refused():
    with pytest.raises(ConfigError, match="no whole 32-byte swizzle row"):
        epilogue.chunk_swizzle(24, 2)


def _d_stores(cfg):
    """TVM's TensorMap specs of the D stores of ``cfg``'s kernel (recorded while it builds), and its source."""
    specs, mod = tma_specs(cfg)
    return [s for s in specs if s.descriptor_name == "D" and s.direction == "s2g"], mod.cuda_source()


@pytest.mark.parametrize("spec, knobs, wgmma, mode, box", [
    # 16-bit: 128x96 in 32-column chunks (three 64-byte-swizzled boxes a tile row band)
    (None, {"blk_n": 96, "epi_n": 32}, "m64n96k16", "64B", 32),
    # plan's narrow-n: 64x32 and 128x48 tiles, a chunk the whole tile width
    (None, {"blk_m": 64, "blk_n": 32, "epi_n": 32, "num_warpgroups": 1, "cluster_m": 1}, "m64n32k16", "64B", 32),
    (None, {"blk_n": 48, "epi_n": 48, "cluster_m": 1}, "m64n48k16", "32B", 16),
    # fp8, the width rule's 128x112 (FP8_WIDTH_KNOBS[112]): 16-column chunks through a 32-byte swizzle
    (GemmSpec.fp8(), {"blk_n": 112, "epi_n": 16, "overlap": 4, "pipe_depth": 7}, "m64n112k32", "32B", 16),
    # fp8 128x224 in halves: each half a m64n112k32 group, its chunks stored under the next tile
    (GemmSpec.fp8(), {"blk_n": 224, "halves": True, "promote": 2, "epi_under": True, "epi_n": 16}, "m64n112k32",
     "32B", 16),
])
def test_the_kernel_issues_the_widths_wgmma_and_stores_its_chunks_in_swizzle_row_boxes(spec, knobs, wgmma, mode,
                                                                                        box):
    cfg = make_config("v9", 1024, 2112 if knobs["blk_n"] != 224 else 7168, 4096,
                      **({"spec": spec} if spec is not None else {}), **knobs)
    stores, source = _d_stores(cfg)
    assert f"wgmma.mma_async.sync.aligned.{wgmma}" in source
    assert stores and {s.swizzle for s in stores} == {SWIZZLE_CODE[mode]}
    # each box: one swizzle row of columns by the consumer's 64 rows, the chunk's columns in whole boxes
    assert {tuple(s.box_dims) for s in stores} == {(box, 64)}
    assert dict(cfg.extra)["epi_n"] % box == 0


def test_the_barrier_checker_passes_the_narrow_tiles():
    """plan's narrow-n tiles (one row of them, 32 and 48 wide: B's ring stages a quarter of a 128-wide tile's)."""
    from gemm_ladder.protocol.check import check_config

    for knobs in ({"blk_m": 64, "blk_n": 48, "num_warpgroups": 1}, {"blk_m": 128, "blk_n": 32, "num_warpgroups": 2}):
        cfg = make_config("v9", 64, 768, 1024, **knobs, epi_n=knobs["blk_n"], cluster_m=1, stream_b=True, pdl=True,
                          pipe_depth=8)
        assert check_config(cfg).findings == [], knobs
