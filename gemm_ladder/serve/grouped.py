"""The grouped front door: one GEMM per expert of a mixture of experts, in one launch.

    import gemm_ladder
    D = gemm_ladder.grouped_mm(A, W, offs)        # A [M, K] tokens sorted by expert, W [E, N, K],
                                                  # offs [E] int32 cumulative end rows -> D [M, N]
    gemm_ladder.grouped_mm(A, W, offs, out=D)
    import gemm_ladder.serve.grouped_ops          # torch.ops.gemm_ladder.grouped_mm (torch.compile)

Semantics: ``torch._grouped_mm(A, W.transpose(1, 2), offs=offs)`` for the case the two share (2-d
A, 3-d weights, ``offs``): expert e's rows of A and D are ``[offs[e-1], offs[e])`` (``offs[-1]`` =
0), ``D[rows] = A[rows] . W[e]^T`` in fp32, rounded once. W is ``[E, N, K]`` row-major: each
expert's ``nn.Linear.weight`` stacked (torch's ``mat_b`` is its ``[E, K, N]`` transposed view).
Rows past ``offs[-1]`` are not written (torch leaves them unspecified too; pass a zeroed ``out``
where they are read).

How a call finds its kernel (once per (E, N, K, dtype, GPU) and pack module): a module registered
with :func:`use_grouped_module` (an exported v12 module, built with ``gemm_ladder.build('v12', 4096,
N, K, experts=E, spec='d_bfloat16.grouped_true')``); else the kernel packs the front door reads
(``gemm_ladder.use_pack``, ``$GEMM_LADDER_PACK``; ``pack build --grouped E,N,K``), by E, N, K, dtype,
layout and the token count known without a sync (here A's rows: a pack holds a decode module and prefill
modules of a weight, ``plan.grouped_choices``), the module whose token range holds it, else the
nearest; else torch's own ``torch._grouped_mm`` (bf16; fp16 where this torch has it), else a loop of
cuBLAS GEMMs over the experts (which reads ``offs`` on the host: a sync, and not CUDA-graph
capturable), with a ``KernelFallbackWarning`` once per shape; ``strict=True`` (or
``GEMM_LADDER_STRICT=1``) raises ``NoKernelError`` instead. ``explain=True`` prints which kernel,
from where (the pack and its file) and why. Registered modules are keyed by their layout too: a
masked module (``layout='masked'``) serves ``gemm_ladder.grouped_mm_masked``
(``serve/grouped_masked.py``) only.

What is checked before a launch: types, dtypes (A and W fp16 or bf16 alike, offs int32), devices
(one GPU), shapes (A [M, K], W [E, N, K] with W's K = A's, offs [E], out [M, N]), layouts
(contiguous, 16-byte aligned, W not torch's transposed [E, K, N] view), N and K multiples of 8
(TMA's 16-byte strides), gradients and an ``out`` that overlaps an input. What is NOT checked:
the VALUES of ``offs`` (non-decreasing, ``offs[-1] <= M``): they live on the GPU and reading them
would stall the host and break CUDA-graph capture. The kernel clamps them (a running max, then M),
so a bad ``offs`` never reads or writes outside A, W and D, but gives a wrong answer;
``check_offsets=True`` checks them on the host first (a sync), for debugging.

Runtime-only: with registered modules this needs the TVM runtime and torch, nothing of the
compiler. It launches on torch's current stream: warm a shape up once, then capture.
"""

from __future__ import annotations

import sys
import threading
import warnings
from dataclasses import dataclass, field

from ..core import device
from ..core.config import DTYPES
from ..core.spec import GemmSpec
from .front import STRICT_ENV, KernelFallbackWarning, NoKernelError, _strict, packs  # the front door's packs, strict
from .kernel_pack import FITS, Found, KernelPack
from .runtime import ModuleInputError, load

RUNG = "v12"
BUILD_M = 4096  # the M to build a module at (its knobs are validated there; M is read at run time)
_LOCK = threading.RLock()
_REGISTERED: dict = {}  # (layout, E, N, K, dtype, arch, epilogue) -> GroupedModule
_ROUTES: dict = {}  # (layout, E, N, K, dtype, index, ...) -> Route
_FROM_PACKS: dict = {}  # a pack module's path -> GroupedModule (loaded once)
_PACKS_SEEN: list = [None]  # the front door's packs the routes were made with (use_pack forgets the routes)
# calls already checked once (fast_key: the front door, strict, and the shapes, strides, dtypes and GPUs of
# A, W, the int32 table and out) -> (their route, D's shape): a hit needs only what can differ between such
# calls checked again (fast_run). A decode call's kernel takes 6-30 us, and the checks and the pack lookup
# cost more than that on the host (35 of a call's 50 us on an H100 box, against torch._grouped_mm's 20).
_FAST: dict = {}
_ARCHS: dict = {}  # device index -> arch


def spec_of_dtype(dtype: str) -> GemmSpec:
    """The operand spec of a grouped GEMM in ``dtype``."""
    return GemmSpec(a=dtype, b=dtype, d=dtype, grouped=True)


class GroupedModule:
    """A loaded v12 module: ``launch(A, W, offs, D)`` with the checks done by the caller."""

    def __init__(self, module):
        launch = module.manifest.get("launch", {})
        if module.rung != RUNG or not module.spec.grouped or "experts" not in launch:
            raise ModuleInputError(f"{module.path.name} is a {module.rung} module of spec {module.spec.text()}, not a "
                                   f"grouped GEMM ({RUNG}, spec grouped): build one with gemm_ladder.build('{RUNG}', "
                                   "M, N, K, experts=E, spec='d_float16.grouped_true')")
        self.module = module
        self.experts, self.N, self.K = int(launch["experts"]), module.N, module.K
        self.dtype, self.arch, self.path = module.dtype, module.arch, module.path
        # "contiguous" (offs) or "masked" (counts, serve.grouped_masked); manifests before: contiguous
        self.layout = str(launch.get("layout", "contiguous"))
        # "none", or "swiglu" (a gated W_gu [E, 2I, K], D [M, I]: serve.grouped_swiglu serves it, never grouped_mm)
        self.epilogue = module.spec.epilogue

    @property
    def key(self) -> tuple:
        return (self.layout, self.experts, self.N, self.K, self.dtype, self.arch, self.epilogue)

    def launch(self, A, W, offs, D) -> None:
        """The kernel on checked tensors: ``(A, W as [E * N, K], D, num_ctas, offs)``, on A's GPU (made
        the current one for the launch where it is not)."""
        import torch  # pylint: disable=import-outside-toplevel  (torch: the caller's)

        self.module.check_device(A.device)
        args = (A, W.view(self.experts * self.N, self.K), D, *self.module.launch_args(A.device), offs)
        if A.device.index == torch.cuda.current_device():
            self.module.entry()(*args)
            return
        with torch.cuda.device(A.device):
            self.module.entry()(*args)


def use_grouped_module(path) -> GroupedModule:
    """Serve grouped calls of this module's (layout, E, N, K, dtype, arch) with it from now on: a
    contiguous module serves ``grouped_mm``, a masked one ``grouped_mm_masked``."""
    mod = GroupedModule(load(path))
    with _LOCK:
        _REGISTERED[mod.key] = mod
        _ROUTES.clear()
        _FAST.clear()
    return mod


def registered(layout: str, E: int, N: int, K: int, dtype: str, arch: str, epilogue: str = "none"):
    """The module registered for this (layout, E, N, K, dtype, arch) and epilogue (``swiglu``: a gated
    W_gu of N = 2I rows an expert), or None."""
    with _LOCK:
        return _REGISTERED.get((layout, E, N, K, dtype, arch, epilogue))


def cached_route(key: tuple, make) -> "Route":
    """The route of ``key``, made once by ``make()`` (forgotten when a module is registered)."""
    with _LOCK:
        if key not in _ROUTES:
            _ROUTES[key] = make()
        return _ROUTES[key]


def reset() -> None:
    """Forget every registered module and choice."""
    with _LOCK:
        _REGISTERED.clear()
        _ROUTES.clear()
        _FAST.clear()
        _FROM_PACKS.clear()
        _ARCHS.clear()
        _PACKS_SEEN[0] = None


# -- kernel packs (gemm_ladder.use_pack, $GEMM_LADDER_PACK: the front door's) ---------------------------
def arch_at(index: int) -> str:
    """The arch of CUDA device ``index``, asked once."""
    if index not in _ARCHS:
        _ARCHS[index] = device.arch_of(index)
    return _ARCHS[index]


def _packs_now() -> list[KernelPack]:
    """The front door's packs; the routes made with others are forgotten (a ``use_pack`` since)."""
    now = packs()
    with _LOCK:
        seen = _PACKS_SEEN[0]
        if seen is None or len(seen) != len(now) or any(a is not b for a, b in zip(seen, now)):
            _PACKS_SEEN[0] = tuple(now)
            _ROUTES.clear()
            _FAST.clear()
    return now


def from_packs(layout: str, E: int, N: int, K: int, dtype: str, arch: str, tokens: int,
               epilogue: str = "none") -> Found | None:
    """The packs' module for this weight and token count (contiguous: rows of A; masked:
    max_tokens): one whose token range holds it before one outside its range, the first pack on
    a tie (``use_pack``'s newest, then ``$GEMM_LADDER_PACK``'s in order); None where no pack has it."""
    best = None
    for pack in _packs_now():
        found = pack.find_grouped(layout, E, N, K, dtype, arch, tokens, epilogue)
        if found is not None and (best is None or FITS.index(found.fit) < FITS.index(best.fit)):
            best = found
    return best


def pack_module(found: Found) -> GroupedModule:
    """The pack's module, checked against ``pack.json`` and loaded once (``KernelPack.load``)."""
    with _LOCK:
        if found.path not in _FROM_PACKS:
            _FROM_PACKS[found.path] = GroupedModule(found.pack.load(found.entry))
        return _FROM_PACKS[found.path]


def pack_lines(found: Found) -> list[str]:
    """What ``explain`` says of a pack's module: which, from where, and why it serves the count."""
    e = found.entry
    count = "rows of A" if e["layout"] == "contiguous" else "max_tokens"
    lo, hi = e["tokens"]
    why = (f"{count} in its range {lo}..{hi}" if found.fit == "tuned-range" else
           f"{count} outside its range {lo}..{hi}, and no pack holds a module of this weight whose range has it")
    return [f"kernel: {RUNG} layout={e['layout']} {e['file']}", f"source: {found.describe()}",
            f"why: {why}; chosen by {(e.get('choice') or {}).get('why', 'the pack')}"]


def route_for(layout: str, E: int, N: int, K: int, dtype: str, index: int, tokens: int, strict: bool,
              make, epilogue: str = "none") -> "Route":
    """The route of a call: ``make(found)`` once per (weight, GPU, strict, epilogue, the pack module
    that serves ``tokens`` or None), with ``found`` None where a module is registered or no pack has one."""
    arch = arch_at(index)
    found = None if registered(layout, E, N, K, dtype, arch, epilogue) is not None else \
        from_packs(layout, E, N, K, dtype, arch, tokens, epilogue)
    key = (layout, E, N, K, dtype, index, strict, (str(found.path), found.fit) if found is not None else None,
           epilogue)
    return cached_route(key, lambda: make(found))


def fast_key(door: str, strict: bool, A, W, table, out) -> tuple | None:
    """What a call of front door ``door`` shares with an earlier, fully checked one: ``strict`` and the
    shapes, strides (so the same layouts), dtypes and GPUs of A, W, the int32 ``table`` (offs or counts)
    and ``out``; None where an argument is not a tensor (the checked path says what it should be)."""
    try:
        key = (door, strict, A.shape, A.stride(), A.dtype, A.device, W.shape, W.stride(), W.dtype, W.device,
               table.shape, table.stride(), table.dtype, table.device)
        return key if out is None else key + (out.shape, out.stride(), out.dtype, out.device)
    except (AttributeError, TypeError):
        return None


def remember_fast(key: tuple | None, route: "Route", d_shape: tuple) -> None:
    """A checked call's route (launched) and D's shape, for the calls like it (:func:`fast_run`), with
    the front door's packs of now (a ``use_pack`` after forgets it)."""
    if key is not None:
        _packs_now()
        with _LOCK:
            _FAST[key] = (route, d_shape)


def fast_run(key: tuple | None, A, W, table, out):
    """The launch of a call like one already checked (:func:`fast_key`), its D returned; or None, and
    the checked path runs (and says what is wrong, if anything). Checked again here, as they may differ
    between such calls: grad wanted, 16-byte alignment of A, W and out, out apart from A, W and the table;
    and the front door's packs (a ``use_pack`` since forgets every remembered call)."""
    if key is None or key not in _FAST:
        return None
    _packs_now()
    hit = _FAST.get(key)
    if hit is None:
        return None
    route, d_shape = hit
    if A.requires_grad or W.requires_grad or (out is not None and out.requires_grad):
        import torch  # pylint: disable=import-outside-toplevel  (torch: the caller's)

        if torch.is_grad_enabled():
            return None
    pa, pw = A.data_ptr(), W.data_ptr()
    if out is None:
        if (pa | pw) & 15:
            return None
        out = A.new_empty(d_shape)
    else:
        pd = out.data_ptr()
        if (pa | pw | pd) & 15:
            return None
        d_end, pt = pd + out.nbytes, table.data_ptr()
        if (pd < pa + A.nbytes and pa < d_end) or (pd < pw + W.nbytes and pw < d_end) or \
                (pd < pt + table.nbytes and pt < d_end):
            return None
    route.run(A, W, table, out)
    return out


# -- checks ---------------------------------------------------------------------------------------
def check_grouped(A, W, offs, out=None, who: str = "gemm_ladder.grouped_mm") -> tuple[int, int, int, int]:
    """(M, E, N, K) of a call whose arguments fit, all but their devices and the values of offs
    (see the module docstring); else ModuleInputError with the fix. No GPU needed."""
    import torch  # pylint: disable=import-outside-toplevel

    for name, t, what in (("A", A, "[M, K]"), ("W", W, "[E, N, K]"), ("offs", offs, "[E] int32")):
        if not isinstance(t, torch.Tensor):
            raise ModuleInputError(f"{who}: {name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if out is not None and not isinstance(out, torch.Tensor):
        raise ModuleInputError(f"{who}: out must be a torch.Tensor [M, N] or None, got {type(out).__name__}")
    if A.dim() != 2 or W.dim() != 3:
        raise ModuleInputError(f"{who}: A must be [M, K] (tokens sorted by expert) and W [E, N, K] (one nn.Linear "
                               f"weight an expert); got A {tuple(A.shape)} and W {tuple(W.shape)}")
    if A.dtype != W.dtype:
        raise ModuleInputError(f"{who}: A is {A.dtype} and W is {W.dtype}; pass one dtype (W.to({A.dtype}))")
    if str(A.dtype).removeprefix("torch.") not in DTYPES:
        raise ModuleInputError(f"{who}: A has dtype {A.dtype}; use torch.float16 or torch.bfloat16"
                               + ("; for fp8 with rowwise scales: gemm_ladder.scaled_grouped_mm" if A.element_size() == 1
                                  else ""))
    M, K = A.shape
    E, N, Kw = W.shape
    if Kw != K:
        hint = ""
        if W.shape[1] == K:
            hint = (" W looks like torch._grouped_mm's mat_b [E, K, N]; pass W as [E, N, K] (each expert's "
                    "nn.Linear.weight): mat_b.transpose(1, 2), contiguous")
        raise ModuleInputError(f"{who}: A is {tuple(A.shape)} and W {tuple(W.shape)}: W's last dim must be A's "
                               f"K={K} (D = A . W[e]^T).{hint}")
    if offs.dim() != 1 or offs.shape[0] != E:
        raise ModuleInputError(f"{who}: offs has shape {tuple(offs.shape)}; it is one int32 per expert, ({E},): the "
                               "cumulative END row of each expert (torch._grouped_mm's offs: counts.cumsum(0))")
    if offs.dtype != torch.int32:
        raise ModuleInputError(f"{who}: offs has dtype {offs.dtype}; pass offs.to(torch.int32)")
    if out is not None:
        if out.dtype != A.dtype:
            raise ModuleInputError(f"{who}: out has dtype {out.dtype}; it must be A's {A.dtype}")
        if tuple(out.shape) != (M, N):
            raise ModuleInputError(f"{who}: out has shape {tuple(out.shape)}; D is ({M}, {N})")
    if W.dim() == 3 and not W.is_contiguous() and W.transpose(1, 2).is_contiguous():
        raise ModuleInputError(f"{who}: W {tuple(W.shape)} is the transposed view of a contiguous [E, {K}, {N}] "
                               f"tensor; W is read as [E, N, K] like stacked nn.Linear weights: pass the [E, N, K] "
                               "tensor itself, or W.contiguous() if you mean these values")
    for name, t in (("A", A), ("W", W), ("offs", offs), ("out", out)):
        if t is not None and not t.is_contiguous():
            raise ModuleInputError(f"{who}: {name} is not contiguous; pass {name}.contiguous()")
    wants_grad = [name for name, t in (("A", A), ("W", W), ("out", out)) if t is not None and t.requires_grad]
    if wants_grad and torch.is_grad_enabled():
        raise ModuleInputError(f"{who}: {' and '.join(wants_grad)} require grad, and the grouped GEMM has no backward "
                               "yet; call it under torch.no_grad(), or pass .detach()ed tensors")
    return M, E, N, K


def check_devices(A, W, offs, out=None, who: str = "gemm_ladder.grouped_mm", table: str = "offs") -> None:
    """One GPU for all, and what TMA needs of the addresses; ``table``: the int32 operand's name in
    messages (``counts`` for the masked layout)."""
    for name, t in (("A", A), ("W", W), (table, offs), ("out", out)):
        if t is None:
            continue
        if t.device.type != "cuda":
            raise ModuleInputError(f"{who}: {name} is on {t.device}; move it to the GPU ({name}.cuda())")
        if t.device != A.device:
            raise ModuleInputError(f"{who}: {name} is on {t.device} and A on {A.device}; put all on one GPU")
        if name != table and t.numel() and t.data_ptr() % 16:  # the int32 table takes plain loads
            raise ModuleInputError(f"{who}: {name} does not start on a 16-byte boundary, which TMA needs; pass "
                                   f"{name}.clone()")
    if out is not None and out.numel():
        for name, t in (("A", A), ("W", W), (table, offs)):
            if t.numel() and out.data_ptr() < t.data_ptr() + t.nbytes and t.data_ptr() < out.data_ptr() + out.nbytes:
                raise ModuleInputError(f"{who}: out overlaps {name} in memory: the kernel would overwrite it while "
                                       "it reads it; pass an out that shares no memory with the inputs")


def check_offsets(offs, M: int, who: str = "gemm_ladder.grouped_mm") -> None:
    """The values of ``offs`` on the host (a sync): non-negative, non-decreasing, at most M."""
    values = offs.tolist()
    prev = 0
    for e, v in enumerate(values):
        if v < prev or v > M:
            raise ModuleInputError(f"{who}: offs[{e}] = {v} after {prev}: offs must be non-decreasing end rows in "
                                   f"0..{M} (counts.cumsum(0) of the tokens sorted by expert)")
        prev = v


# -- routes -----------------------------------------------------------------------------------------
@dataclass
class Route:
    """How one (E, N, K, dtype, GPU) is computed, and the lines ``explain`` prints."""

    run: object  # run(A, W, offs, D)
    source: str
    lines: list = field(default_factory=list)


def torch_grouped_mm(A, W, offs, out) -> None:
    """torch's own: ``torch._grouped_mm`` (bf16 everywhere it runs; fp16 where this torch has it),
    else a loop of cuBLAS GEMMs over the experts (``offs`` read on the host)."""
    import torch  # pylint: disable=import-outside-toplevel

    try:
        out.copy_(torch._grouped_mm(A, W.transpose(1, 2), offs=offs))  # pylint: disable=protected-access
        return
    except (RuntimeError, AttributeError):
        pass
    start = 0
    for e, end in enumerate(offs.tolist()):
        end = min(max(end, start), A.shape[0])
        if end > start:
            torch.matmul(A[start:end], W[e].t(), out=out[start:end])
        start = end


def _route(E: int, N: int, K: int, dtype: str, index: int, strict: bool, found: Found | None) -> Route:
    arch = arch_at(index)
    reg = registered("contiguous", E, N, K, dtype, arch)
    if reg is not None:
        return Route(reg.launch, "registered", [f"kernel: {RUNG} {reg.path.name}", "source: use_grouped_module"])
    if found is not None:
        return Route(pack_module(found).launch, "kernel pack", pack_lines(found))
    why = ("N or K is not a multiple of 8 (TMA's 16-byte strides)" if N % 8 or K % 8
           else f"no {RUNG} module was registered for it, and no kernel pack holds one "
                f"({len(_packs_now())} packs looked in)")
    how = (f"build a pack on a box with TVM's compiler (python -m gemm_ladder pack build --grouped {E},{N},{K},"
           f"contiguous --dtypes {dtype}) and pass it to gemm_ladder.use_pack (or $GEMM_LADDER_PACK), or build one "
           f"module (gemm_ladder.build('{RUNG}', {BUILD_M}, {N}, {K}, experts={E}, spec='{spec_of_dtype(dtype).text()}'))"
           " and pass it to gemm_ladder.use_grouped_module")
    if strict:
        raise NoKernelError(f"gemm_ladder.grouped_mm E={E} N={N} K={K} {dtype} on {arch}: {why} (strict mode); {how}")
    warnings.warn(f"gemm_ladder.grouped_mm E={E} N={N} K={K} {dtype}: torch computes it ({why}). For a kernel of "
                  f"ours, {how}. {STRICT_ENV}=1 (or strict=True) makes this an error",
                  KernelFallbackWarning, stacklevel=7)
    return Route(torch_grouped_mm, "torch fallback", ["kernel: torch._grouped_mm (or a loop of torch.matmul), the "
                                                      "fallback", f"why: {why}"])


def route_of(E: int, N: int, K: int, dtype: str, index: int, tokens: int = 1, strict: bool = False) -> Route:
    """The route of a contiguous call with ``tokens`` rows of A (the pack's module for that count)."""
    return route_for("contiguous", E, N, K, dtype, index, tokens, strict,
                     lambda found: _route(E, N, K, dtype, index, strict, found))


def grouped_mm(A, W, offs, *, out=None, explain: bool = False, strict: bool | None = None,
               check_offsets_first: bool = False):
    """``D[offs[e-1]:offs[e]] = A[offs[e-1]:offs[e]] . W[e]^T`` for every expert e (see the module
    docstring); ``out``: D [M, N] to write into (else a new tensor); ``explain``: print which
    kernel and why; ``strict``: no torch fallback, NoKernelError instead (default
    ``$GEMM_LADDER_STRICT``); ``check_offsets_first``: check the values of offs on the host first (a sync)."""
    import torch  # pylint: disable=import-outside-toplevel

    strict = _strict(strict)
    key = None if explain or check_offsets_first else fast_key("grouped_mm", strict, A, W, offs, out)
    if (done := fast_run(key, A, W, offs, out)) is not None:
        return done
    M, E, N, K = check_grouped(A, W, offs, out)
    check_devices(A, W, offs, out)
    if check_offsets_first:
        check_offsets(offs, M)
    if out is None:
        out = torch.empty((M, N), dtype=A.dtype, device=A.device)
    if M == 0 or N == 0 or E == 0:
        return out
    if K == 0:  # every sum is empty
        return out.zero_()
    index = A.device.index if A.device.index is not None else torch.cuda.current_device()
    route = route_of(E, N, K, str(A.dtype).removeprefix("torch."), index, M, strict)
    if explain:
        print("\n".join(route.lines + [f"tokens: {M} rows of A"]), file=sys.stderr)
    route.run(A, W, offs, out)
    remember_fast(key, route, (M, N))
    return out
