"""A rung's kernel as the protocol checker reads it: lowered device TIR plus what the host knows.

The device function alone does not say how many bytes a TMA box holds or how large the grid
is: the host half of TMA (``tensormap_encode_tiled`` with the box dims) and the launch are in
the host function. :func:`load` traces a config (or takes a traced prim_func), lowers it with
TVM's ``tirx`` pipeline (no device compiler needed) and gathers:

- the tensor maps the kernel receives: global dims, box dims, element size;
- the barrier arrays of the shared-memory pool: name, kind, offset, depth (from the trace's
  record, :mod:`gemm_ladder.sync.classes`, else from the pool's buffer names);
- the pool's other buffers (``Asmem``, ``Bsmem``, ...), so an address names a tile and a stage;
- the launch: grid, threads, cluster size.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import tvm
from tvm import ir

from ..core.config import GemmConfig
from ..rungs import CONFIG_ATTR, config_of_prim_func, kernel_of
from ..sync.classes import BARRIERS_ATTR, WATCHDOG_ATTR
from .values import DTYPE_BYTES, dtype_bytes, op_name


@dataclass(frozen=True)
class TensorMapInfo:
    name: str
    dims: tuple[int, ...]  # innermost first, as cuTensorMapEncodeTiled takes them
    box: tuple[int, ...]
    elem_bytes: int
    l2_promotion: int = 2  # bytes an L2 miss fetches: 0 none, 1 64 B, 2 128 B, 3 256 B (CUtensorMapL2promotion)

    @property
    def box_bytes(self) -> int:
        return math.prod(self.box) * self.elem_bytes

    def in_bounds_bytes(self, coords) -> int:
        """Bytes of the box at ``coords`` (innermost first) that lie inside the tensor."""
        n = self.elem_bytes
        for c, b, d in zip(coords, self.box, self.dims):
            if not isinstance(c, int):
                return self.box_bytes
            # a runtime extent (a runtime M) is not known here: the box counts as inside along it
            n *= max(0, min(c + b, c + b if d is None else d) - max(c, 0))
        return n

    def describe(self) -> str:
        box = "x".join(str(b) for b in reversed(self.box))
        return f"{self.name.replace('_tensormap', '')} box {box} = {self.box_bytes} B"


@dataclass(frozen=True)
class BarrierArray:
    name: str
    kind: str  # mbarrier | tma | tcgen05
    offset: int  # in uint64 units from the pool base
    depth: int

    def label(self, slot: int) -> str:
        return f"{self.name}[{slot}]"


@dataclass(frozen=True)
class SmemBuffer:
    name: str
    byte_offset: int
    nbytes: int
    shape: tuple[int, ...]
    elem_bytes: int

    @property
    def stage_bytes(self) -> int:
        # a ring buffer's first dimension is its stage: (S, rows, 64) tiles
        if len(self.shape) >= 3:
            return self.nbytes // self.shape[0]
        return self.nbytes


@dataclass
class KernelIR:
    func: object  # the traced prim_func
    device: object  # the lowered device PrimFunc
    arch: str
    cfg: object | None
    tensormaps: dict[str, TensorMapInfo]
    barriers: list[BarrierArray]
    buffers: list[SmemBuffer]
    operand_buffers: set[str]
    launch: dict[str, object] = field(default_factory=dict)  # "blockIdx.x" -> int or param name
    watchdog: dict | None = None

    def barrier_at(self, byte_off: int):
        """(array, slot) of the mbarrier at a pool byte offset, or None."""
        if byte_off % 8:
            return None
        idx = byte_off // 8
        for b in self.barriers:
            if b.offset <= idx < b.offset + b.depth:
                return b, idx - b.offset
        return None

    def slot_label(self, byte_off: int) -> str:
        hit = self.barrier_at(byte_off)
        return hit[0].label(hit[1]) if hit else f"mbarrier@{byte_off}"

    def region_of(self, byte_off: int):
        """(buffer, stage) holding a pool byte offset, or None."""
        cache = self.__dict__.setdefault("_regions", {})
        if byte_off not in cache:
            cache[byte_off] = self._region_of(byte_off)
        return cache[byte_off]

    def _region_of(self, byte_off: int):
        for b in self.buffers:
            if b.byte_offset <= byte_off < b.byte_offset + b.nbytes:
                return b.name, (byte_off - b.byte_offset) // b.stage_bytes
        return None

    def region_label(self, region) -> str:
        name, stage = region
        buf = next((b for b in self.buffers if b.name == name), None)
        return f"{name}[{stage}]" if buf is not None and len(buf.shape) >= 3 else name


def _target(arch: str):
    return tvm.target.Target({"kind": "cuda", "arch": arch})


def lower(func, arch: str):
    """TVM's tirx pipeline, host and device (what ``tvm.compile`` runs before codegen)."""
    target = _target(arch)
    host = tvm.target.Target("llvm" if tvm.runtime.enabled("llvm") else "c")
    with target:
        mod = tvm.IRModule.from_expr(func)
        mod = tvm.tirx.transform.BindTarget(target.with_host(host))(mod)
        pipeline, _, _ = tvm.tirx.get_tir_pipeline("tirx")
        return pipeline(mod)


def _walk_calls(stmt, found: list, names: set):
    t = type(stmt).__name__
    if t == "SeqStmt":
        for s in stmt.seq:
            _walk_calls(s, found, names)
        return
    for f in ("body", "then_case", "else_case"):
        v = getattr(stmt, f, None)
        if v is not None:
            _walk_calls(v, found, names)
    for f in ("value", "condition"):
        v = getattr(stmt, f, None)
        if v is not None:
            _walk_expr(v, found, names)


def _walk_expr(e, found, names):
    if type(e).__name__ == "Call":
        if isinstance(e.op, ir.Op) and e.op.name in names:
            found.append(e)
        for a in e.args:
            _walk_expr(a, found, names)


def _pool_buffers(func) -> list:
    """DeclBuffers of the traced function whose scope is shared memory: (name, buffer)."""
    out = []

    def walk(s):
        t = type(s).__name__
        if t == "SeqStmt":
            for x in s.seq:
                walk(x)
            return
        if t == "DeclBuffer" and s.buffer.scope().startswith("shared"):
            out.append(s.buffer)
        for f in ("body", "then_case", "else_case"):
            v = getattr(s, f, None)
            if v is not None:
                walk(v)
    walk(func.body)
    return out


def _int(x):
    return int(x.value) if hasattr(x, "value") else (int(x) if isinstance(x, int) else None)


def load(func_or_cfg, arch: str | None = None) -> KernelIR:
    """Trace (for a config) and lower a kernel; gather what the checker needs to run it."""

    cfg = None
    if isinstance(func_or_cfg, GemmConfig):
        cfg = func_or_cfg
        func = kernel_of(cfg)
    else:
        func = func_or_cfg
        attrs = func.attrs if func.attrs is not None else {}
        if CONFIG_ATTR in attrs:
            cfg = config_of_prim_func(func)
    arch = arch or (cfg.arch if cfg is not None else "sm_90a")
    attrs = func.attrs if func.attrs is not None else {}
    mod = lower(func, arch)
    device = host = None
    for gv, f in mod.functions.items():
        fattrs = f.attrs if f.attrs is not None else {}
        if "tirx.is_global_func" in fattrs:
            device = f
        elif "tirx.is_entry_func" in fattrs:
            host = f
    if device is None:
        raise ValueError(f"no device kernel in the lowered module of {gv}")

    # tensor maps: host encode calls, matched to the device params through the launch
    encodes: list = []
    launches: list = []
    if host is not None:
        _walk_calls(host.body, encodes, {"tirx.tensormap_encode_tiled"})
        _walk_calls(host.body, launches, {"tirx.call_ffi_kernel"})
    by_var = {}
    for call in encodes:
        rank = int(call.attrs.rank)
        ints = [_int(a) for a in call.args[2:]]
        dims, box = ints[:rank], ints[2 * rank - 1:3 * rank - 1]
        dtype = str(call.attrs.descriptor_dtype)
        by_var[call.args[0].__chandle__()] = (call.args[0].name, dims, box, DTYPE_BYTES.get(dtype, 2),
                                              int(call.attrs.l2_promotion))
    tensormaps = {}
    launch = {}
    if launches:
        call = launches[0]
        args = list(call.args[1:])
        for p, a in zip(device.params, args):
            info = by_var.get(a.__chandle__()) if type(a).__name__ == "Var" else None
            if info is not None:
                tensormaps[p.name] = TensorMapInfo(info[0], tuple(info[1]), tuple(info[2]), info[3], info[4])
        params = list(call.attrs.launch_params)
        for name, value in zip(params, args[-len(params):]):
            launch[name] = _int(value) if _int(value) is not None else getattr(value, "name", str(value))

    # the pool: barrier arrays and tiles
    pool = _pool_buffers(func)
    recorded = json.loads(str(attrs[BARRIERS_ATTR])) if BARRIERS_ATTR in attrs else []
    names = {b["offset"]: b for b in recorded}
    barriers, buffers = [], []
    for buf in pool:
        off = _int(buf.elem_offset) or 0
        shape = tuple(int(d) for d in buf.shape)
        elem = dtype_bytes(buf.dtype)
        if str(buf.dtype) == "uint64" and len(shape) == 1 and shape[0] > 0:
            if any(b.offset == off for b in barriers):
                continue  # a view of a barrier array mapped into a peer CTA (remote_view)
            rec = names.get(off)
            name = rec["name"] if rec else (buf.name[:-4] if buf.name.endswith("_buf") else buf.name)
            kind = rec["kind"] if rec else "mbarrier"
            barriers.append(BarrierArray(name, kind, off, shape[0]))
        elif math.prod(shape) > 0 and str(buf.dtype) not in ("uint64", "uint32"):
            buffers.append(SmemBuffer(buf.name, off * elem, math.prod(shape) * elem, shape, elem))
    operands: set[str] = set()
    found: list = []
    _walk_calls(device.body, found, {"tirx.cuda.wgmma_encode_matrix_descriptor",
                                     "tirx.cuda.tcgen05_encode_matrix_descriptor"})
    for call in found:
        arg = call.args[1]
        while type(arg).__name__ == "Call" and op_name(arg) in ("tirx.address_of", "tirx.cuda.cvta_generic_to_shared"):
            arg = arg.args[0]
        if type(arg).__name__ == "TensorLoad":
            operands.add(arg.source.name)

    wd = json.loads(str(attrs[WATCHDOG_ATTR])) if WATCHDOG_ATTR in attrs else None
    return KernelIR(func, device, arch, cfg, tensormaps, barriers, buffers, operands, launch, wd)
