"""MN-major operands (issue 31) on the CPU: A stored [K, M] and B stored [K, N], loaded by TMA in
boxes of the other orientation into 128B-swizzled MN-major tiles and read by wgmma with its
transpose bits. Without a GPU the essential check is the address model: for every element a
wgmma reads (its descriptor, the K step, the 64-row atom, the ring slot, per the PTX ISA's
canonical layouts) the byte it reads is where the TMA box put that element (TVM's shared
layout, which the layouts model matches). Then: the spec accepts the majors on v9 only, the
four layouts build in both dtypes with the HGMMA's transposed operands, and the barrier
checker passes them."""

import pytest

from layouts import desc_read_offset, operand_desc_fields, swizzle_offset, tvm_bridge, wgmma_desc_fields_mn
from gemm_ladder.compile import builder, sass
from gemm_ladder.core.config import ConfigError
from gemm_ladder.core.spec import GemmSpec, check_built, not_built
from gemm_ladder.protocol.check import check_config
from gemm_ladder.rungs import kernel_of, make_config
from gemm_ladder.sm90a import gemm, producer
from gemm_ladder.sm90a.common import HopperPlan, slot_step16

LAYOUTS = [("K", "K"), ("K", "N"), ("M", "K"), ("M", "N")]  # (a_major, b_major)


def _spec(a_major, b_major, dtype="float16"):
    return GemmSpec(a=dtype, b=dtype, d=dtype, a_major=a_major, b_major=b_major)


# -- the address model -----------------------------------------------------------------------------
def _tile_of(plan, operand):
    """(shape of one ring slot's tile, its descriptor fields, its major) of wgmma's A or B."""
    major = plan.a_major if operand == "A" else plan.b_major
    rows = plan.cfg.blk_m if operand == "A" else plan.cfg.blk_n
    desc = plan.desc_a if operand == "A" else plan.desc_b
    return plan.tile_shape(rows, major), desc, major


def _where_tma_put(shape, major, dtype, mn, k):
    """The byte of element (mn, k) of the operand in its shared tile: the TMA box writes the
    global rows (M/N rows when K-major, K rows when MN-major) as the tile's rows."""
    row, col = (mn, k) if major == "K" else (k, mn)
    return swizzle_offset(dtype, shape, "128B", row, col)


@pytest.mark.parametrize("a_major, b_major", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_element_a_wgmma_reads_is_where_the_tma_box_put_it(a_major, b_major, dtype):
    """v9's default tile (128 x 256 x 64 over two consumers): for each consumer's 64-row atom of
    A, B's whole N, each k16 step of the slice, each element the wgmma reads: the descriptor's
    address (slot 0's encode, plus the adds the K loop makes) walked as the PTX ISA's canonical
    layout, swizzled, is the byte the TMA box wrote that element to."""
    cfg = make_config("v9", 512, 512, 512, spec=_spec(a_major, b_major, dtype))
    plan = HopperPlan(cfg)
    for operand, atoms in (("A", [(c * plan.rows_per_wg + mi * 64) for c in range(2) for mi in range(plan.m_atoms)]),
                           ("B", [0])):
        shape, desc, major = _tile_of(plan, operand)
        width = 64 if operand == "A" else cfg.blk_n  # wgmma's M, or its N
        assert desc.trans == (major == "MN")
        for row0 in atoms:
            # encode_slot0's pointer: the row of a K-major tile, the column of an MN-major one
            start0 = _where_tma_put(shape, major, dtype, row0, 0) if major == "K" else \
                swizzle_offset(dtype, shape, "128B", 0, row0)
            for kk in range(cfg.blk_k // 16):
                start = start0 + kk * desc.k_step * 16
                for mn in range(width):
                    for k in range(16):
                        got = desc_read_offset(desc, dtype, start, mn, k)
                        assert got == _where_tma_put(shape, major, dtype, row0 + mn, kk * 16 + k), \
                            (operand, major, row0, kk, mn, k)


@pytest.mark.parametrize("shape", [(4, 64, 128), (4, 64, 256)])
def test_tvms_layout_of_the_mn_major_ring_is_the_model(shape):
    """The ring's MN-major tiles as the kernel allocates them ([stages, blk_k, rows], TVM's
    mma_shared_layout, which the TMA boxes and the descriptor encodes are placed by) put every
    sampled element where the layouts model does."""
    layout = tvm_bridge.shared_layout("float16", shape, "128B")
    for stage, row, col in [(0, 0, 0), (1, 7, 63), (2, 8, 64), (3, 63, shape[2] - 1), (1, 17, 100), (0, 33, 70)]:
        assert tvm_bridge.layout_apply(layout, shape, (stage, row, col)) * 2 == \
            swizzle_offset("float16", shape, "128B", row, col, stage)


def test_the_k_loops_adds_reach_the_same_descriptors_an_encode_would():
    """mma_k_slot reaches atom mi of an MN-major A by adding row_block_step (a 64-column block of
    the [blk_k, blk_m] tile) and slot s by slot_step16 (one slot's bytes, either major)."""
    cfg = make_config("v9", 512, 512, 512, spec=_spec("M", "N"), num_warpgroups=1, blk_m=128, blk_n=128)
    plan = HopperPlan(cfg)
    shape = plan.tile_shape(cfg.blk_m, "MN")
    for mi in range(plan.m_atoms):
        assert plan.desc_a.row_block_step * mi * 16 == swizzle_offset("float16", shape, "128B", 0, 64 * mi)

    class Buf:  # what slot_step16 reads of a shared buffer
        dtype, shape = "float16", plan.a_shape(4)

    assert slot_step16(Buf) * 16 == cfg.blk_m * cfg.blk_k * 2
    assert plan.desc_a.stage_step == 0 and wgmma_desc_fields_mn("float16", plan.a_shape(4)).stage_step == 1024


def test_mn_major_descriptor_fields():
    """LBO: the next 64 M/N elements (a block of all blk_k rows x 128 B); SBO: the next 8 rows
    of K (1 KiB); one k16 step is 16 rows of K (2 KiB)."""
    d = wgmma_desc_fields_mn("bfloat16", (64, 256))
    assert (d.ldo, d.sdo, d.k_step, d.row_block_step, d.k_steps, d.trans) == (512, 64, 128, 512, 4, 1)
    assert d.encode_wgmma(0x400) == (0x40 | 512 << 16 | 64 << 32 | 1 << 62)
    assert operand_desc_fields("float16", (64, 64), "K").trans == 0
    assert d.offset16(k=1, rows=128, stage=0) == 128 + 2 * 512


@pytest.mark.parametrize("args, fragment", [
    (("float32", (64, 128)), "16-bit types only"),
    (("float16", (24, 64)), "k_rows=32"),
    (("float16", (64, 100)), "cols="),
    (("float16", (64, 128), "none"), "swizzled"),
])
def test_mn_major_descriptor_refuses_what_wgmma_cannot_read(args, fragment):
    with pytest.raises(ValueError, match=fragment):
        wgmma_desc_fields_mn(*args)


def test_the_boxes_are_one_swizzle_atom_wide():
    """An MN-major box is 64 elements of M (or N): 128 bytes of 16-bit values, the widest box a
    128B swizzle takes, so a 128-row part is two boxes."""
    assert producer.MN_BOX * 2 == 128


# -- the spec and the validator --------------------------------------------------------------------
def test_mn_major_is_built_on_v9_only_and_named_elsewhere():
    for a_major, b_major in LAYOUTS:
        assert not_built(_spec(a_major, b_major), "v9", mn_major=True) is None
        make_config("v9", 256, 256, 256, spec=_spec(a_major, b_major))
    for rung, knobs in (("v10", {"split_k": 2}), ("v11", {"split_k": 2})):
        with pytest.raises(ConfigError, match=f"{rung} builds only K-major.*built for v9"):
            make_config(rung, 64, 256, 512, spec=_spec("K", "N"), **knobs)
    with pytest.raises(ConfigError, match="MN-major"):
        check_built(_spec("M", "K"), "v9", ("none",))  # a rung that does not declare MN_MAJOR


def test_the_spec_text_of_the_majors():
    assert _spec("M", "N").text() == "d_float16.a_major_M.b_major_N"
    assert GemmSpec.parse("d_bfloat16.b_major_N") == _spec("K", "N", "bfloat16")
    assert _spec("K", "K").tag() == "" and _spec("K", "N").tag() == "d_float16-b_major_N"
    assert [o.shape for o in _spec("M", "N").operands()][:2] == [("K", "M"), ("K", "N")]


def test_the_kernel_takes_a_and_b_in_their_stored_shapes():
    cfg = make_config("v9", 200, 264, 320, spec=_spec("M", "N"), cluster_m=1)
    ops = {op.name: op.shape for op in gemm.operands(cfg, gemm.V9, cfg.M, 1)}
    assert ops == {"a": (320, 200), "b": (320, 264), "d": (200, 264)}


@pytest.mark.parametrize("knobs, fragment", [
    ({"spec": _spec("M", "K"), "blk_m": 64, "num_warpgroups": 1, "cluster_n": 2, "cluster_m": 1}, "cluster_n=1"),
    ({"spec": _spec("K", "N"), "blk_n": 64, "cluster_m": 2}, "cluster_m=1"),
    ({"spec": _spec("K", "N"), "tail_n": 232}, "tail_n=0"),
    ({"spec": _spec("M", "K"), "dynamic_m": True, "tile_order": "snake"}, "dynamic_m=False"),
])
def test_what_an_mn_major_tile_cannot_load_is_refused(knobs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        make_config("v9", 4096, 4096, 512, **knobs)


# -- the kernel ------------------------------------------------------------------------------------
@pytest.mark.parametrize("a_major, b_major, dtype", [("K", "N", "float16"), ("M", "K", "bfloat16"),
                                                     ("M", "N", "float16"), ("M", "N", "bfloat16")])
def test_v9_builds_each_layout_with_wgmmas_transposed_operands(a_major, b_major, dtype):
    """An odd shape (M, N not multiples of the tile or of 64), v9's defaults (2x1 clusters: B's
    parts multicast): the wgmma carries trans-a / trans-b, the loads are 64-wide boxes, and the
    SASS' HGMMA reads the transposed operands (tnspA / tnspB), spilling nothing."""
    mod = builder.build("v9", 200, 264, 320, spec=_spec(a_major, b_major, dtype))
    src = mod.cuda_source()
    t = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    trans = f"_1_1_{int(a_major == 'M')}_{int(b_major == 'N')}("
    assert f"mma_async_sync_aligned_m64n256k16_f32_{t}_{t}{trans}" in src
    assert mod.manifest()["spec"]["a_major"] == a_major and mod.manifest()["spec"]["b_major"] == b_major
    try:
        text, res = sass.disassemble(mod.binary), sass.resource_usage(mod.binary)
    except sass.SassToolError as err:  # cuobjdump is an optional tool (TIRX_NOTES.md)
        pytest.skip(f"no SASS here: {err}")
    hgmma = [line for line in text.splitlines() if "HGMMA" in line]
    assert hgmma and all((".tnspA" in line) == (a_major == "M") for line in hgmma)
    assert all((".tnspB" in line) == (b_major == "N") for line in hgmma)
    assert res.local == 0, res


def test_the_plain_kernel_is_unchanged_by_the_majors():
    """K-major A and B: no transpose bit, the K-major descriptor fields (LBO 1, SBO 64)."""
    src = builder.build("v9", 200, 264, 320, cluster_m=1).cuda_source()
    assert "m64n256k16_f32_f16_f16_1_1_0_0(" in src and "_1_1_1_" not in src and "_1_1_0_1(" not in src
    assert ", 1, 64, 3);" in src and ", 512, 64, 3);" not in src


@pytest.mark.parametrize("a_major, b_major", LAYOUTS[1:])
def test_the_barrier_checker_passes_mn_major_kernels(a_major, b_major):
    """More TMA boxes per stage, the same bytes on the same barrier: the protocol check passes."""
    assert check_config(make_config("v9", 512, 512, 512, spec=_spec(a_major, b_major), epi_under=True)).ok
