"""The ring of the warp-specialized Hopper kernels (v8-v11): shared-memory stages, a full and an
empty mbarrier per stage, and the stage and phase of every slice in one place.

    position p   the p-th K slice that passes through the ring in this CTA (a running count
                 that the producer and each consumer keep alike: ``load_it + k``, ``it + k``)
    slot         p % stages                    the stage that slice p lands in
    phase        (p // stages) & 1             how many times the ring went round, mod 2

    ==========  ==========================================  ====================================
    barrier     arrived by                                  waited by (parity)
    ==========  ==========================================  ====================================
    full        the producer's ``arrive.expect_tx`` of the   every consumer thread before its
    (tma2mma)   whole stage, then the TMA bytes (its own     wgmmas read slot p: ``phase(p)``
                parts and its cluster peers' multicast)
    empty       lane 0 of every consumer warp of every CTA   the producer before it refills
    (mma2tma)   of the cluster, once slot p's wgmmas         slot p: ``phase(p) ^ 1`` (the
                retired (``release``)                        previous lap's release)
    ==========  ==========================================  ====================================

A kernel creates its two barriers under the names its tables use and hands them over::

    tma2mma = TMABar(pool, S)
    mma2tma = MBarrier(pool, S)
    ring = Ring(tma2mma, mma2tma, cluster_size=CS)
    ...                                   # the rest of the pool, pool.commit()
    ring.init(releases=RELEASES)

and from then on names positions only: ``ring.wait_full(it + k)``, ``ring.slot(it + k)``,
``ring.release(it + k - 1)``. Nobody writes ``(p // stages) & 1`` at a call site.

Where TVM's own classes fit, and where not. The barriers are TVM's ``TMABar`` and ``MBarrier``
(``tvm.backend.cuda.lang.pipeline``, recorded by ``gemm_ladder.barriers``). TVM's ``Pipeline``
pairs them too, but it initialises both barriers in its constructor, before the rest of the pool
is allocated and committed (these kernels initialise after, as they always have); it names them
``full`` / ``empty`` itself (the barrier tables, the protocol checker and the fault tests name
``tma2mma`` / ``mma2tma``, and swap the rung's barrier classes); and it has no release to every
CTA of a cluster. TVM's ``PipelineState`` keeps a stage and a phase in two registers advanced one
slice at a time; these kernels index the ring by a running count instead, which jumps by a whole
tile (split-K units and stream-K pieces start anywhere) and
which the whole-tile K loop unrolls over the slots with constant descriptor offsets. The count is
what the shipped SASS was measured with; this class only gives it one home.
"""

from __future__ import annotations

from tvm.script import tirx as T

@T.inline
def release_to_cluster(empty, stage, cluster_size):
    """One consumer warp's release of a stage to the producer of every CTA of the cluster: each
    of them may multicast into this CTA's copy of the stage. (:meth:`Ring.release`, plain Python,
    looks it up when a kernel is traced: tests/barrier_faults.py swaps in a broken one.)"""
    for c in T.unroll(cluster_size):
        empty.arrive(stage, remote=c)


@T.meta_class
class Ring:
    """``stages`` shared-memory stages between one producer and the consumers of a CTA (and of
    its cluster): the full barrier (``TMABar``), the empty barrier (``MBarrier``), and the slot
    and phase of each position (see the module docstring)."""

    def __init__(self, full, empty, cluster_size: int = 1):
        if full.depth != empty.depth:
            raise ValueError(f"the full and empty barriers have {full.depth} and {empty.depth} slots; give both "
                             "the ring's stage count")
        self.full = full
        self.empty = empty
        self.stages = full.depth
        self.cluster_size = cluster_size

    def init(self, releases: int) -> None:
        """One arrival (the producer's expect_tx) completes a full phase, ``releases`` (every
        consumer warp of the cluster that reads a stage) an empty one."""
        self.full.init(1)
        self.empty.init(releases)

    def slot(self, pos):
        return pos % self.stages

    def phase(self, pos):
        return (pos // self.stages) & 1

    def wait_full(self, pos) -> None:
        """Consumers: slice ``pos`` has landed in its slot."""
        self.full.wait(self.slot(pos), self.phase(pos))

    def wait_empty(self, pos) -> None:
        """Producer: the slice one lap before ``pos`` was released from its slot (the first lap
        passes at once: parity 1 of a fresh barrier is the phase before its first)."""
        self.empty.wait(self.slot(pos), self.phase(pos) ^ 1)

    def full_bar(self, pos):
        """The full barrier of ``pos``'s slot, for the TMA copies that complete on it."""
        return self.full.ptr_to([self.slot(pos)])

    def expect(self, pos, nbytes: int) -> None:
        """Producer: slice ``pos`` is ``nbytes`` on their way (the whole stage: TMA counts the
        zero-filled bytes past the edges and the peers' multicast parts alike)."""
        self.full.arrive(self.slot(pos), tx_count=nbytes)

    def release(self, pos) -> None:
        """One consumer warp (its lane 0): slot ``pos`` is read, to every producer of the
        cluster."""
        release_to_cluster(self.empty, self.slot(pos), self.cluster_size)

    def lane(self, lanes: int, lane) -> "Lane":
        """The ring as consumer ``lane`` of ``lanes`` that take alternate slices sees it
        (v9's ``k_consumers``, ``sm90a/kconsumers.py``): its position p is the ring's
        ``lanes * p + lane``."""
        return Lane(self, lanes, lane)


@T.meta_class
class Lane:
    """Every ``lanes``-th position of a :class:`Ring`, from ``lane``: a consumer that takes a
    tile's slices ``lane, lane + lanes, ...`` runs its K loop over positions ``it / lanes + j``
    (the tile's first position ``it`` a multiple of ``lanes``) and names them as any consumer
    does; the slots, phases and barriers are the ring's."""

    def __init__(self, ring: Ring, lanes: int, lane):
        self.ring = ring
        self.lanes = lanes
        self.lane = lane
        self.stages = ring.stages
        self.cluster_size = ring.cluster_size

    def position(self, pos):
        return self.lanes * pos + self.lane

    def slot(self, pos):
        return self.ring.slot(self.position(pos))

    def phase(self, pos):
        return self.ring.phase(self.position(pos))

    def wait_full(self, pos) -> None:
        self.ring.wait_full(self.position(pos))

    def release(self, pos) -> None:
        self.ring.release(self.position(pos))
