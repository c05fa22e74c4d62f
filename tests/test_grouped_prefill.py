"""The grouped GEMM's prefill tiles with the warp scan (v12, issue 33) on the CPU: the scan's partial
results cost no shared memory (they sit in the barriers' padding below the tiles), the kernel's walk
under the scan with v9's 128x256 and 128x128 tiles is the model's, and the protocol check passes.
(Decode's tiles: ``test_grouped_decode.py``; the timing: ``benchmarks/grouped_prefill_check.py``.)"""

from __future__ import annotations

import re

import pytest

from gemm_ladder import make_config
from gemm_ladder.core.spec import GemmSpec
from gemm_ladder.protocol.check import check_config
from gemm_ladder.sm90a import grouped

from .grouped_loads import cumulative, loads_of

GROUPED = GemmSpec(grouped=True).text()
PREFILL_TILES = [dict(), dict(blk_n=128, pipe_depth=6), dict(blk_m=64, num_warpgroups=1, pipe_depth=5)]


def dyn_smem(cfg) -> int:
    """The kernel's own shared memory: the pool's high-water mark, which TVM launches it with."""
    return int(re.search(r'dyn_smem_bytes": T\.int64\((\d+)\)', grouped.kernel(cfg).script()).group(1))


@pytest.mark.parametrize("experts, N, K", [(256, 2048, 7168), (8, 14336, 4096)])
@pytest.mark.parametrize("tile", PREFILL_TILES)
def test_the_warp_scan_costs_no_shared_memory(experts, N, K, tile):
    serial = make_config("v12", 4096, N, K, experts=experts, spec=GROUPED, **tile)
    scan = make_config("v12", 4096, N, K, experts=experts, spec=GROUPED, warp_scan=True, **tile)
    assert dyn_smem(scan) == dyn_smem(serial) == grouped.launch(scan)["smem_bytes"]


@pytest.mark.parametrize("table, M", [
    (cumulative((0, 130, 0, 0, 3, 0, 0, 300)), 440),
    (cumulative((5, 0, 129) + (0,) * 40 + (70,)), 210),       # past 32 experts: two chunks a lane
])
@pytest.mark.parametrize("tile", [dict(), dict(blk_n=128, pipe_depth=6),
                                  # swapped 16-token tiles in bands of 2 and of 64 (more than an expert holds)
                                  dict(swap_ab=True, blk_m=16, blk_n=128, l2_group_size=2),
                                  dict(swap_ab=True, blk_m=16, blk_n=128, l2_group_size=64)])
def test_the_prefill_walk_under_the_warp_scan_is_the_models(monkeypatch, table, M, tile):
    E = len(table)
    cfg = make_config("v12", M, 520, 128, experts=E, spec=GROUPED, warp_scan=True, **tile)
    loads = loads_of(monkeypatch, cfg, table, M)
    want = grouped.walk(list(table), M, cfg.blk_m, -(-520 // cfg.blk_n), cfg.l2_group_size, 3)
    assert sum(len(w) for w in want) > 3
    for cta in range(3):
        mine = [(name, c) for b, name, c in loads if b == cta]
        assert [c[1] for name, c in mine if name.startswith("A")][::cfg.k_tiles] == [u.row0 for u in want[cta]]
        assert [c[1] for name, c in mine if name.startswith("B")][::cfg.k_tiles] == \
            [u.expert * 520 + u.n_tile * cfg.blk_n for u in want[cta]]


@pytest.mark.parametrize("tile", PREFILL_TILES)
def test_prefill_tiles_with_the_warp_scan_pass_the_protocol_check(tile):
    cfg = make_config("v12", 600, 1000, 520, experts=40, spec=GROUPED, warp_scan=True, **tile)
    report = check_config(cfg, policies=("forward", "lockstep"))
    assert report.ok, report.table()
    assert all(s.finished for s in report.sims), report.summary()
