"""CPU tests of the layouts package: models vs TVM's own layouts and vs the hardware rules."""

import doctest
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import layouts
from layouts import (
    LAYOUT_NAMES,
    PATTERNS,
    SWIZZLE_MODES,
    acc_fragment_coord,
    acc_fragment_map,
    acc_fragment_owner,
    atom_table,
    bank_of,
    conflict_report,
    plot_acc_fragment,
    plot_swizzle,
    plot_swizzle_atom,
    swizzle_offset,
    wavefronts,
    wgmma_desc_fields,
    write_all,
)
from layouts.swizzle import linear_offset

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("float16", "bfloat16", "float32")
ESIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
WIDTH = {"none": 16, "32B": 32, "64B": 64, "128B": 128}


@pytest.fixture(scope="module")
def bridge():
    pytest.importorskip("tvm")
    from layouts import tvm_bridge

    return tvm_bridge


def _shapes(mode, dtype):
    """Valid tile shapes for a mode: 1 and 2 atom columns, several row counts, staged 3-D/4-D."""
    e = ESIZE[dtype]
    per_row = (WIDTH.get(mode, 64)) // e  # rowmajor: 64-byte rows
    shapes = [(8, per_row), (64, per_row), (128, per_row), (64, 2 * per_row), (24, 4 * per_row),
              (3, 64, per_row), (2, 16, 2 * per_row), (2, 2, 8, per_row)]
    if mode in ("none", "rowmajor"):
        shapes += [(40, 12), (2, 24, 6), (16, 128 // e)]  # rows not a multiple of 16 bytes
    return shapes


def _coords(shape, limit=768):
    """Every coordinate of small tiles; corners plus a fixed random sample of large ones."""
    lead = 1
    for s in shape[:-2]:
        lead *= s
    rows, cols = shape[-2:]
    everything = [(s, r, c) for s in range(lead) for r in range(rows) for c in range(cols)]
    if len(everything) <= limit:
        return everything
    rng = random.Random(0)
    return everything[:cols] + everything[-cols:] + rng.sample(everything, limit)


def _unflatten(stage, shape):
    out = []
    for extent in reversed(shape[:-2]):
        out.append(stage % extent)
        stage //= extent
    return tuple(reversed(out))


# --- package hygiene ------------------------------------------------------------------------


def test_import_does_not_load_tvm_or_matplotlib():
    code = ("import sys, layouts; "
            "assert 'tvm' not in sys.modules, 'tvm'; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib'; "
            "layouts.swizzle_offset('float16', (8, 64), '128B', 1, 0)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_docstring_examples_run():
    result = doctest.testmod(layouts)
    assert result.attempted >= 5 and result.failed == 0


def test_public_names():
    assert SWIZZLE_MODES == ("none", "32B", "64B", "128B")
    for name in ("shared_layout", "tvm_swizzle_mode"):
        assert name in layouts.__all__
    with pytest.raises(AttributeError):
        layouts.no_such_name  # noqa: B018


# --- swizzle model vs TVM and vs the hardware XOR rule ---------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", LAYOUT_NAMES)
def test_model_matches_tvm_layout(bridge, mode, dtype):
    esize = ESIZE[dtype]
    for shape in _shapes(mode, dtype):
        layout = bridge.shared_layout(dtype, shape, mode)
        for stage, row, col in _coords(shape):
            coord = (*_unflatten(stage, shape), row, col)
            want = bridge.layout_apply(layout, shape, coord) * esize
            got = swizzle_offset(dtype, shape, mode, row, col, stage=stage)
            assert got == want, f"{mode} {dtype} {shape} {coord}: model {got}, TVM {want}"


@pytest.mark.parametrize("mode", SWIZZLE_MODES)
def test_tvm_swizzle_params_are_the_hardware_bits(bridge, mode):
    # TVM's ComposeLayout XORs element-offset bits; in bytes that must be bits 4.. and 7..
    for dtype in DTYPES:
        layout = bridge.shared_layout(dtype, (64, WIDTH[mode] // ESIZE[dtype]), mode)
        if mode == "none":
            assert not hasattr(layout, "swizzle_len")
            continue
        per_element = int(layout.per_element)
        assert (1 << per_element) * ESIZE[dtype] == 16  # 16-byte chunks
        assert int(layout.atom_len) == 3  # row bits start 3 above the chunk bits: bit 7
        assert int(layout.swizzle_len) == {"32B": 1, "64B": 2, "128B": 3}[mode]
        assert bool(layout.swizzle_inner)
        assert bridge.tvm_swizzle_mode(mode).value == {"32B": 1, "64B": 2, "128B": 3}[mode]


def _hardware_xor(addr, mode):
    """The rule as written in the PTX/TMA docs, one bit at a time."""
    n = {"none": 0, "32B": 1, "64B": 2, "128B": 3}[mode]
    for b in range(n):
        if (addr >> (7 + b)) & 1:
            addr ^= 1 << (4 + b)
    return addr


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", SWIZZLE_MODES)
def test_model_follows_hardware_xor_rule(mode, dtype):
    e = ESIZE[dtype]
    shape = (2, 64, 2 * WIDTH[mode] // e)
    rows, cols = shape[1:]
    seen = set()
    for stage in range(2):
        for row in range(rows):
            for col in range(cols):
                lin = linear_offset(dtype, shape, mode, row, col, stage)
                got = swizzle_offset(dtype, shape, mode, row, col, stage)
                assert got == _hardware_xor(lin, mode)
                # the swizzle only permutes 16-byte chunks inside one W-byte atom row
                assert got // WIDTH[mode] == lin // WIDTH[mode]
                assert got % 16 == lin % 16
                seen.add(got)
    # a bijection onto the tile's bytes
    assert seen == set(range(0, 2 * rows * cols * e, e))


def test_atom_tables():
    assert atom_table("128B") == [[r ^ c for c in range(8)] for r in range(8)]
    assert atom_table("64B") == [[(r >> 1) ^ c for c in range(4)] for r in range(8)]
    assert atom_table("32B") == [[(r >> 2) ^ c for c in range(2)] for r in range(8)]
    assert atom_table("none") == [[0]] * 8
    for mode in ("32B", "64B", "128B"):
        table = atom_table(mode)
        for line in table:
            assert sorted(line) == list(range(len(line)))


def test_none_is_the_packed_16_byte_layout_not_row_major():
    # row 1 follows row 0 after 16 bytes; the next 16-byte column starts after all rows
    assert swizzle_offset("float16", (128, 64), "none", 1, 0) == 16
    assert swizzle_offset("float16", (128, 64), "none", 0, 8) == 128 * 16
    assert swizzle_offset("float16", (128, 64), "rowmajor", 1, 0) == 128


def test_bank_of():
    assert bank_of("float16", (128, 64), "rowmajor", 5, 8) == 4  # every row: banks 4-7
    assert [bank_of("float16", (128, 64), "128B", r, 0) for r in range(8)] == [
        4 * r for r in range(8)]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("float16", (128, 32), "128B"), "cols=64"),
        (("float16", (128, 32), "128B"), "'64B'"),
        (("float16", (100, 64), "128B"), "rows=104"),
        (("float16", (128, 64), "256B"), "'128B'"),
        (("int4", (128, 64), "128B"), "dtype"),
    ],
)
def test_bad_tiles_raise_with_a_fix(args, fragment):
    with pytest.raises(ValueError, match=fragment):
        swizzle_offset(*args, 0, 0)


# --- bank conflicts ------------------------------------------------------------------------


def test_wavefront_counting():
    assert wavefronts([16 * t for t in range(32)]) == 4  # 512 contiguous bytes
    assert wavefronts([0] * 32) == 4  # broadcast: one wavefront per phase
    assert wavefronts([128 * t for t in range(32)]) == 32  # 8-way in every phase
    assert wavefronts([4 * t for t in range(32)], nbytes=4) == 1
    assert wavefronts([8 * t for t in range(32)], nbytes=4) == 2  # 2-way
    assert wavefronts([None] * 8 + [16 * t for t in range(8)]) == 1
    with pytest.raises(ValueError, match="aligned"):
        wavefronts([8], nbytes=16)


LADDER_TILES = [("float16", (128, 64)), ("bfloat16", (256, 64)), ("float16", (64, 64)),
                ("float32", (128, 32))]


@pytest.mark.parametrize(("dtype", "shape"), LADDER_TILES)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_128b_swizzle_is_conflict_free(dtype, shape, pattern):
    rep = conflict_report(dtype, shape, "128B", pattern)
    assert rep.conflict_free
    assert rep.wavefronts == 4 * rep.requests  # every request is 32 threads x 16 B


@pytest.mark.parametrize(("dtype", "shape"), LADDER_TILES)
@pytest.mark.parametrize("pattern", ["ldmatrix", "row_store"])
def test_row_major_tile_conflicts(dtype, shape, pattern):
    rep = conflict_report(dtype, shape, "rowmajor", pattern)
    assert not rep.conflict_free
    assert rep.ways == 8.0  # 8 rows of >= 128 bytes share 4 banks


@pytest.mark.parametrize(("row_bytes", "ways"), [(32, 2), (64, 4), (128, 8), (256, 8)])
def test_row_major_conflict_degree_follows_row_width(row_bytes, ways):
    assert conflict_report("float16", (64, row_bytes // 2), "rowmajor", "ldmatrix").ways == ways


@pytest.mark.parametrize("mode", ["32B", "64B"])
def test_narrow_swizzles_are_conflict_free_on_their_atoms(mode):
    shape = (128, WIDTH[mode] // 2)
    for pattern in PATTERNS:
        assert conflict_report("float16", shape, mode, pattern).conflict_free


def test_tma_box_writes_are_conflict_free_even_row_major():
    # TMA writes whole contiguous 128-byte rows; the swizzle matters for the readers
    assert conflict_report("float16", (128, 64), "rowmajor", "tma_box").conflict_free


# --- descriptors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "shape", "mode", "fields"),
    [
        ("float16", (128, 64), "128B", (1, 64, 3, 2, 512)),
        ("bfloat16", (64, 64), "128B", (1, 64, 3, 2, 512)),
        ("float32", (128, 32), "128B", (1, 64, 3, 2, 512)),
        ("float16", (128, 32), "64B", (1, 32, 2, 2, 256)),
        ("float16", (64, 16), "32B", (1, 16, 1, 2, 128)),
        ("float16", (128, 64), "none", (128, 8, 0, 256, 64)),
    ],
)
def test_descriptor_fields(dtype, shape, mode, fields):
    d = wgmma_desc_fields(dtype, shape, mode)
    assert (d.ldo, d.sdo, d.swizzle_code, d.k_step, d.row_block_step) == fields
    assert d.k_elems == 32 // ESIZE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", SWIZZLE_MODES)
def test_descriptor_steps_agree_with_the_layout(bridge, mode, dtype):
    e = ESIZE[dtype]
    cols = (64 if mode == "none" else WIDTH[mode]) // e  # "none": two K steps per row
    shape = (2, 128, cols)
    d = wgmma_desc_fields(dtype, shape, mode)
    assert d.swizzle_code == bridge.tvm_swizzle_mode(mode).value

    def tvm_at(stage, row, col):  # TVM's own byte offset, 16-byte units
        return bridge.tvm_byte_offset(dtype, shape, mode, (stage, row, col)) // 16

    assert tvm_at(0, 8, 0) == d.sdo  # next 8-row group
    assert tvm_at(0, 64, 0) == d.row_block_step  # next wgmma m64 block
    if d.k_steps > 1:  # a 32B row holds a single K step
        assert tvm_at(0, 0, d.k_elems) == d.k_step  # next K step (row 0: XOR is identity)
    assert tvm_at(1, 0, 0) == d.stage_step
    if mode == "none":
        assert tvm_at(0, 0, 16 // e) == d.ldo  # next 16-byte column of core matrices
    k = min(1, d.k_steps - 1)
    assert d.offset16(k=k, rows=64, stage=1) == k * d.k_step + d.row_block_step + d.stage_step


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("float16", (128, 128), "128B"), ["exactly 128 bytes", "cols=64"]),
        (("float16", (128, 32), "128B"), ["'64B'"]),
        (("float32", (128, 32), "64B"), ["exactly 64 bytes", "'128B'", "cols=16"]),
        (("float16", (100, 64), "128B"), ["rows=104"]),
        (("float16", (100, 64), "none"), ["rows=104"]),
        (("float16", (128, 8), "none"), ["32 bytes", "cols=16"]),
        (("float16", (128, 64), "rowmajor"), ["'none'"]),
        (("float16", (128, 64), "128b"), ["'128B'"]),
    ],
)
def test_descriptor_validation(args, fragments):
    with pytest.raises(ValueError) as err:
        wgmma_desc_fields(*args)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_descriptor_address_checks():
    d = wgmma_desc_fields("float16", (128, 64), "128B")
    with pytest.raises(ValueError, match="1024"):
        d.encode_wgmma(512)
    with pytest.raises(ValueError, match="K step"):
        d.offset16(k=4)
    assert wgmma_desc_fields("float16", (128, 64), "none").encode_wgmma(16) & 0x3FFF == 1


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build TVM's encoder")
def test_wgmma_encoding_matches_tvm_encoder(bridge, tmp_path):
    # compile TVM's real encoder body and bitfield for the host, feed it the same fields
    src = tmp_path / "enc.cpp"
    src.write_text(bridge.wgmma_encoder_cpp())
    subprocess.run(["g++", "-std=c++17", "-o", str(tmp_path / "enc"), str(src)], check=True)
    cases = [(mode, addr) for mode in SWIZZLE_MODES for addr in (0, 0x400, 0x3FC00)]
    args, want = [], []
    for mode, addr in cases:
        d = wgmma_desc_fields("float16", (128, max(WIDTH[mode], 32) // 2), mode)
        args += [str(addr), str(d.ldo), str(d.sdo), str(d.swizzle_code)]
        want.append(d.encode_wgmma(addr))
    out = subprocess.run([str(tmp_path / "enc"), *args], check=True, capture_output=True,
                         text=True).stdout.split()
    assert [int(x) for x in out] == want
    # the argument is TVM's SwizzleMode; the hardware field (bits 62-63) is 1 for 128B
    assert int(out[-1]) >> 62 == 1


@pytest.mark.parametrize("mode", SWIZZLE_MODES)
def test_tcgen05_encoding_matches_tvm(bridge, mode):
    d = wgmma_desc_fields("bfloat16", (128, max(WIDTH[mode], 32) // 2), mode)
    assert d.encode_tcgen05(0) == bridge.tcgen05_desc_base(d.ldo, d.sdo, d.swizzle_code)
    assert d.encode_tcgen05(0x2000) == d.encode_tcgen05(0) | (0x2000 >> 4)
    assert d.encode_tcgen05(0) >> 61 == {"none": 0, "128B": 2, "64B": 4, "32B": 6}[mode]


# --- accumulator fragment ------------------------------------------------------------------


@pytest.mark.parametrize("n", [8, 16, 64, 128, 256])
def test_acc_fragment_is_a_bijection(n):
    fmap = acc_fragment_map(n)
    assert fmap.shape == (128, n // 2, 2)
    coords = {tuple(rc) for rc in fmap.reshape(-1, 2).tolist()}
    assert coords == {(r, c) for r in range(64) for c in range(n)}
    # registers 2k, 2k+1 hold adjacent columns of one row (a thread's 8-byte f32 pair)
    assert (fmap[:, 1::2] - fmap[:, 0::2] == [0, 1]).all()
    assert (fmap[:, 0::2, 1] % 8 == 2 * (np.arange(128) % 4)[:, None]).all()
    owner = acc_fragment_owner(n)
    assert (owner >= 0).all()
    warp_of_row = owner[..., 0] // 32
    assert (warp_of_row == np.arange(64)[:, None] // 16).all()  # warp w: rows 16w..16w+15


def test_acc_fragment_known_values():
    assert acc_fragment_coord(0, 0, 0) == (0, 0)
    assert acc_fragment_coord(1, 0, 0) == (0, 1)
    assert acc_fragment_coord(2, 0, 0) == (8, 0)
    assert acc_fragment_coord(0, 0, 1) == (0, 2)
    assert acc_fragment_coord(0, 0, 4) == (1, 0)
    assert acc_fragment_coord(6, 2, 5) == (41, 10)
    assert acc_fragment_coord(63, 3, 31) == (63, 127)  # last register of n128
    assert acc_fragment_coord(127, 3, 31) == (63, 255)  # last register of n256


def test_acc_fragment_on_tvm_exprs(bridge):
    import tvm
    from tvm.sym import Analyzer

    r, w, lane = (tvm.tirx.Var(name, "int32") for name in ("r", "w", "lane"))
    row_expr, col_expr = acc_fragment_coord(r, w, lane)
    for args in [(0, 0, 0), (6, 2, 5), (63, 3, 31), (13, 1, 22)]:
        ana = Analyzer()
        for var, value in zip((r, w, lane), args, strict=True):
            ana.bind(var, value)
        got = (int(ana.simplify(row_expr)), int(ana.simplify(col_expr)))
        assert got == acc_fragment_coord(*args)


def test_acc_fragment_rejects_bad_n():
    with pytest.raises(ValueError, match="multiple of 8"):
        acc_fragment_map(12)
    with pytest.raises(ValueError, match="8..256"):
        acc_fragment_map(264)


# --- pictures ------------------------------------------------------------------------------


def _is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000


def test_plots_write_files(tmp_path):
    import matplotlib.pyplot as plt

    fig = plot_swizzle("float16", (64, 64), "128B", tmp_path / "s.png")
    assert fig.axes and _is_png(tmp_path / "s.png")
    plt.close(fig)
    fig = plot_swizzle_atom("64B", tmp_path / "atom.svg")
    assert (tmp_path / "atom.svg").read_text().lstrip().startswith("<?xml")
    plt.close(fig)
    fig = plot_acc_fragment(16, tmp_path / "acc.png")
    assert _is_png(tmp_path / "acc.png")
    plt.close(fig)
    plt.close(plot_swizzle_atom("128B"))  # no path: figure only, nothing written
    assert list(tmp_path.iterdir()) and len(list(tmp_path.iterdir())) == 3


def test_write_all(tmp_path):
    paths = write_all(tmp_path / "pics")
    assert len(paths) >= 8
    assert all(_is_png(p) for p in paths)
    assert {p.name for p in paths} >= {"swizzle_atom_128B.png", "acc_fragment_n128.png",
                                       "banks_float16_128x64_rowmajor.png"}
