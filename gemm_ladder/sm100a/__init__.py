"""The ladder's Blackwell (sm_100a) forms: tcgen05 MMA from one thread, accumulators in TMEM.

=======  ===================================================================================
rung     technique
=======  ===================================================================================
v1       one tile: threads copy A, B to swizzled smem, one thread issues tcgen05.mma,
         TMEM -> registers -> global
v2       K loop: the MMA commits to an mbarrier before the next slice overwrites smem
v3       spatial tiling over CTAs; guarded copies and stores for any M (N, K multiples of 8)
v4       TMA loads (expect-tx mbarrier) and a TMA-store epilogue through swizzled smem
v5       pipe_depth-stage ring: a TMA warp and an MMA warp, full/empty barriers per stage
v6       persistent: one CTA per SM, tile scheduler, double-buffered TMEM accumulator,
         a separate epilogue warpgroup
v7       warp specialization: TMA, MMA and epilogue roles (WarpRole) with register budgets
         (setmaxnreg); the epilogue holds a row in registers and frees TMEM early
v8       CTA pairs in clusters: one cta_group::2 tcgen05.mma per 256-row tile, B split over
         the pair, A multicast across the cluster_n pairs of a cluster
v9       epi_consumers epilogue warpgroups drain each accumulator's columns in parallel
=======  ===================================================================================

Build any of them with ``gemm_ladder.hgemm_vN(M, N, K, arch="sm_100a")``; the Hopper forms
live in ``gemm_ladder/sm90a``. Nothing here runs without a Blackwell GPU: the CPU tests
(``tests/test_sm100a.py``, ``tests/test_sm100a_v7_v9.py``) check each rung's SASS and barrier
protocol instead.
"""
