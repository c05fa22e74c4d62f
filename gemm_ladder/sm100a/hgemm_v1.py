"""hgemm_v1 (Blackwell): one output tile, one K slice, one tcgen05 MMA pass.

The first rung: the smallest kernel that puts Blackwell's tensor cores to work. One CTA
computes the whole D = A.B^T, so the shape is exactly one tile: M = 128, N = blk_n, K = 64.

    all:      A -> Asmem, B -> Bsmem        16-byte copies into 128B-swizzled tiles
    all:      fence.proxy.async, CTA barrier
    thread 0: tcgen05.mma x 4 (K/16) -> tmem, tcgen05.commit -> mma2epi
    all:      wait mma2epi, tcgen05.ld tmem -> Dreg -> D (thread t writes row t)

What is new against Hopper: the MMA is issued by *one* thread (an elected lane of warp 0)
instead of a warpgroup, and the fp32 accumulator lives in tensor memory (TMEM), not in
registers. ``tcgen05.commit`` is how the issuing thread tells everyone else that the MMAs
are done: it arrives on an mbarrier when they finish.

Why the fences: the threads write the tiles through the generic proxy (``st.shared``) but
the tensor core reads them through the async proxy, so ``fence.proxy.async`` comes before
the barrier. ``tcgen05.fence::after_thread_sync`` orders the MMA (and, in the epilogue, the
TMEM loads) after the barrier or mbarrier wait that made it safe.

Barriers:   mma2epi[1]  arrived by tcgen05.commit (thread 0) when the MMAs are done;
            all threads wait on phase 0.

Constraints:
  - arch sm_100a; dtype float16 or bfloat16; D = A.B^T with A [M,K], B [N,K] row-major.
  - M == 128 (blk_m; tcgen05 cta_group::1 M), N == blk_n (64..256, a multiple of 64),
    K == 64 (v2 loops over K, v3 tiles M and N).
  - all 512 TMEM columns (see common.py).

Run:  python -m gemm_ladder build v1 --shape 128x128x64 --arch sm_100a --out build/
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from ..sync.classes import TCGen05Bar
from ..core.budget import check_budget
from ..core.config import GemmConfig
from . import common
from .common import EPI_COLS, MMA_M, TMEM_COLS, BlackwellPlan

TECHNIQUE = "one tile: threads copy to swizzled smem, one thread issues tcgen05.mma, TMEM to global"
KNOBS = {"blk_m": 128, "blk_n": 128, "blk_k": 64}


def check(cfg: GemmConfig) -> None:
    common.check_tile(cfg)
    common.check_exact_tile(cfg, k_loop=False)
    check_budget(cfg, common.smem_bytes(cfg, 1, epilogue_tile=False))


def launch(cfg: GemmConfig) -> dict:
    return common.launch_info(cfg, 1, epilogue_tile=False)


def kernel(cfg: GemmConfig):
    plan = BlackwellPlan(cfg)
    M, N, K, dtype = cfg.M, cfg.N, cfg.K, cfg.dtype
    BLK_M, BLK_N, BLK_K = cfg.blk_m, cfg.blk_n, cfg.blk_k
    A_layout, B_layout = plan.ab_layouts()

    # fmt: off
    @T.prim_func
    def hgemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx = T.cta_id([1])  # noqa: F841  one CTA
        wg_id = T.warpgroup_id([1])  # noqa: F841  (TMEMPool's warp guard needs the full id chain)
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])
        pool = T.SMEMPool()
        mma2epi = TCGen05Bar(pool, 1)
        tmem_pool = T.TMEMPool(pool, TMEM_COLS, cta_group=1)
        pool.move_base_to(1024)  # 128B-swizzled tiles must start 1 KiB aligned
        Asmem = pool.alloc((BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), dtype, layout=B_layout)
        pool.commit()
        mma2epi.init(1)
        common.alloc_tmem_and_sync(tmem_pool)
        tmem = tmem_pool.alloc((MMA_M, BLK_N), "float32")
        tid = T.meta_var(warp_id * 32 + lane_id)
        zeros = T.alloc_local((8,), dtype)
        for j in T.unroll(8):
            zeros[j] = T.cast(0, dtype)

        common.load_tile_sync(Asmem, A, 0, 0, BLK_M, tid, zeros)
        common.load_tile_sync(Bsmem, B, 0, 0, BLK_N, tid, zeros)
        # generic-proxy stores -> async-proxy (tensor core) reads
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        if warp_id == 0:
            # one lane issues: the MMA is a CTA-wide operation, not a per-thread one
            if T.cuda.elect_sync():
                T.ptx["tcgen05.fence::after_thread_sync"]()
                Tx.gemm_async(tmem[:, 0:BLK_N], Asmem[:, :], Bsmem[:, :],
                              accum=False, dispatch="tcgen05", cta_group=1)
                mma2epi.arrive(0)  # tcgen05.commit: arrives when the MMAs above are done
        mma2epi.wait(0, 0)
        T.ptx["tcgen05.fence::after_thread_sync"]()
        Dreg = T.alloc_local((EPI_COLS,), "float32")
        Dhalf = T.alloc_local((EPI_COLS,), dtype)
        common.tmem_to_global(plan, tmem, Dreg, Dhalf, D, 0, 0, tid, False)
        common.free_tmem(tmem_pool)
    # fmt: on

    return hgemm
