"""``gemm_ladder.nn``: a drop-in ``nn.Linear`` on our kernels, and ``patch(model)`` to swap them in.

    import gemm_ladder.nn
    lin = gemm_ladder.nn.Linear(4096, 14336, bias=False, device="cuda", dtype=torch.bfloat16)
    swapped = gemm_ladder.nn.patch(model)      # every nn.Linear of model, in place; prints and returns the names
    report = gemm_ladder.nn.patch(model, fuse=True)  # and SwiGLU MLPs, q/k/v, Linear->act: report.fused, .left

:class:`Linear` is ``nn.Linear`` (its parameters, initialisation and state dict are nn.Linear's:
a checkpoint loads either way) whose forward is the front door's kernels, and whose backward is
``torch.ops.gemm_ladder.mm``'s (dX and dW read their operands as transposed views: MN-major
operands, no copies; ``serve.ops.linear_grads``). Traced (``torch.compile``, ``torch.export``,
fake tensors, functorch) it calls the registered op, which the tracer sees; eager it skips the
custom op's dispatch, ~150 us of torch's Python machinery per call that made a training step
host-bound (0.52x torch), and calls the same implementation through an
``autograd.Function`` (with grad) or directly (without): the same kernels, the same gradients.
Where the op does not apply -- a tensor off the GPU, a dtype other than fp16/bf16, x and the
weight in different dtypes -- it is ``F.linear``, as nn.Linear computes it. Under
``torch.autocast`` it casts x, the weight and the bias to the autocast dtype first, as autocast
does for ``F.linear`` (the op itself has no autocast rule): one cast of the weight per call,
whose backward takes the bf16 dW to the fp32 master weight's dtype, as torch's does (torch also
reuses a weight's cast within one autocast region; a layer called once per step, as here, casts
once either way).

:func:`patch` swaps every module whose type is exactly ``nn.Linear`` (subclasses keep their own
forward) for a :class:`Linear` that shares its parameters (the same ``Parameter`` objects: an
optimizer built before the patch, tied weights and hooks on them stay valid). With ``fuse=True``
it first fuses what it recognises (:func:`swiglu_mismatch`, :func:`sequential_pairs`):

- a LLaMA-style MLP (HF's LlamaMLP, MistralMLP, Qwen2MLP, ...: ``gate_proj``, ``up_proj``,
  ``down_proj`` linears, the gate and up without bias, and a forward that *is*
  ``down_proj(silu(gate_proj(x)) * up_proj(x))``, read from its torch.fx graph, not guessed from
  its attribute names) becomes a :class:`SwiGLUMLP` over the same three linears: one gated kernel
  (``torch.ops.gemm_ladder.swiglu``) for gate, up and silu, writing half the bytes;
- an attention's ``q_proj``, ``k_proj`` and ``v_proj`` (plain linears of one input width, dtype
  and device, a bias on all or none) become one :class:`SharedInput`: the first of them called
  computes the three products as one GEMM over ``cat([Wq, Wk, Wv])`` (in training too: one dX
  and one dW GEMM in the backward) and its siblings return theirs from it (column slices of one
  tensor) while their input is the same, unwritten tensor; anything else runs each alone, so the
  attention's forward need not be read;
- ``nn.Sequential(..., Linear, ReLU | GELU | SiLU, ...)``: the Linear takes the activation into
  its epilogue (:attr:`Linear.activation`; its bias kept) and the activation's slot holds an
  ``nn.Identity``.

``fuse=True`` makes them all; ``fuse=("swiglu", "act")`` (any of :data:`FUSIONS`) only those
named: the fused weights of SwiGLU and q/k/v cost their linears' bytes again in memory.

Module names and state-dict keys stay as they were. A look-alike (another activation, a bias on
the gate or up, hooks that would see the unfused tensors, another forward) is left alone, and
the report says why.
"""

from __future__ import annotations

import operator
import sys
import warnings

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .core.spec import torch_activation
from .serve import ops  # registers torch.ops.gemm_ladder.mm and .swiglu
from .serve.front import fast_mm, fast_swiglu, tensor_version

_DTYPES = (torch.float16, torch.bfloat16)
_PLAIN = (torch.Tensor, nn.Parameter)


def plain_inference() -> bool:
    """Whether a layer's call can ask nothing of torch but the product: no gradient recorded, no
    tracer (``torch.compile``, a dispatch mode, a functorch transform), no autocast on. Then
    :class:`Linear` and :class:`SwiGLUMLP` try the front door's fast path (a call like one already
    checked) before their own checks: on an H100's host a bf16 Linear at 512x768x768 cost 34 us a
    call against nn.Linear's 26 us, most of the difference those checks
    (``benchmarks/results/2026-11-26_h100_prefill_profile/``)."""
    # pylint: disable=protected-access
    # any autocast on (CUDA's or another device's) takes the checked path, which casts for x's device;
    # the query without a device string costs half of is_autocast_enabled("cuda")
    return not (torch.is_grad_enabled() or torch._C._is_any_autocast_enabled() or torch._C._len_torch_dispatch_stack()
                or torch._C._are_functorch_transforms_active() or torch.compiler.is_compiling())


def traced(*tensors) -> bool:
    """Whether a call must go through the registered op for a tracer to see it: under
    ``torch.compile``/``torch.export``, a dispatch mode (fake tensors, make_fx), a functorch
    transform, or with a tensor subclass."""
    # pylint: disable=protected-access
    return (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._are_functorch_transforms_active()
            or any(t is not None and type(t) not in _PLAIN for t in tensors))


class LinearFunction(torch.autograd.Function):
    """``act(x . W^T (+ bias))`` eager: the op's forward and backward (``ops.direct_mm``,
    ``ops.linear_grads``; with an activation, dD is taken through it at its input, recomputed by
    one more GEMM, as the op's backward does) without the custom op's dispatch. Saves x and W as
    the op does (the tensors themselves, no copies); a backward that builds a graph
    (``create_graph=True``) calls the op, which differentiates again."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation=None):  # pylint: disable=arguments-differ
        ctx.activation, ctx.has_bias = activation, bias is not None
        ctx.save_for_backward(x, weight, *((bias,) if activation and bias is not None else ()))
        return ops.direct_mm(x, weight, bias, activation)

    @staticmethod
    def backward(ctx, grad):  # pylint: disable=arguments-differ
        x, weight, *rest = ctx.saved_tensors
        needs = ctx.needs_input_grad
        gemm = torch.ops.gemm_ladder.mm if torch.is_grad_enabled() else ops.direct_mm
        if ctx.activation:  # at the activation's input Z = x . W^T + bias, recomputed
            grad = ops.activation_backward(grad, gemm(x, weight, rest[0] if rest else None), ctx.activation)
        return (*ops.linear_grads(grad, x, weight, (needs[0], needs[1], ctx.has_bias and needs[2]), gemm), None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None) -> torch.Tensor:
    """``act(F.linear(x, weight, bias))`` on the front door's kernels (``activation``: relu,
    gelu_tanh, gelu_erf, silu or None, in the epilogue), for tensors :func:`uses_kernel` takes
    (in one dtype: cast them first under autocast): the registered op where traced, else its
    implementation directly, through :class:`LinearFunction` where a gradient is wanted."""
    if traced(x, weight, bias):
        return torch.ops.gemm_ladder.mm(x, weight, bias, activation)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return LinearFunction.apply(x, weight, bias, activation)
    return ops.direct_mm(x, weight, bias, activation)


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast casts a linear layer's ``x`` to on its device, None where it is off (or
    the device has no autocast: meta)."""
    if x.device.type == "meta" or not torch.is_autocast_enabled(x.device.type):
        return None
    return torch.get_autocast_dtype(x.device.type)


def uses_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :class:`Linear` runs ``x`` through the op (else ``F.linear``)."""
    return x.is_cuda and weight.is_cuda and x.dtype == weight.dtype and x.dtype in _DTYPES


class Linear(nn.Linear):
    """``nn.Linear`` whose forward is ``torch.ops.gemm_ladder.mm`` (see the module docstring);
    ``activation`` (None, or one of relu, gelu_tanh, gelu_erf, silu): applied to the output in the
    kernel's epilogue (set by :meth:`from_linear`, by :func:`patch` for a Linear -> activation pair)."""

    activation: str | None = None
    shared: "SharedInput | None" = None  # set by patch(fuse=True) for an attention's q, k and v

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pylint: disable=arguments-renamed
        shared = self.shared
        if shared is not None and type(x) is torch.Tensor:
            # a product of this x kept by a sibling's call moments before (SharedInput.kept_for);
            # else the group's GEMM where it serves the call (None where it does not)
            done = shared.kept_for(self, x) if shared.holds(x) else None
            if done is None:
                done = shared.output(self, x)
            if done is not None:
                return done
        weight, bias = self.weight, self.bias
        if (self.activation is None and type(x) is torch.Tensor and type(weight) in _PLAIN
                and (bias is None or type(bias) in _PLAIN) and plain_inference()):
            done = fast_mm(x, weight, bias)  # None unless a call like this one was checked
            if done is not None:
                return done
        cast = autocast_dtype(x)
        if cast is not None:
            x, weight = x.to(cast), weight.to(cast)
            bias = bias.to(cast) if bias is not None else None
        if not uses_kernel(x, weight):
            out = F.linear(x, weight, bias)
            return torch_activation(out, self.activation) if self.activation else out
        return linear(x, weight, bias, self.activation)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation}" if self.activation else "")

    @classmethod
    def from_linear(cls, lin: nn.Linear, activation: str | None = None) -> "Linear":
        """A :class:`Linear` over ``lin``'s own parameters (shared, not copied), with ``activation``
        in its epilogue."""
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"Linear.from_linear takes an nn.Linear, got {type(lin).__name__}")
        if activation is not None and activation not in _ACTIVATIONS:
            raise ValueError(f"Linear.from_linear: activation={activation!r}; use one of "
                             f"{', '.join(_ACTIVATIONS)} or None")
        new = cls(lin.in_features, lin.out_features, bias=lin.bias is not None, device="meta",
                  dtype=lin.weight.dtype)
        new.weight = lin.weight
        new.bias = lin.bias
        new.activation = activation
        new.train(lin.training)
        return new


_ACTIVATIONS = ("relu", "gelu_tanh", "gelu_erf", "silu")  # the epilogue's, by name (core.spec.ACTIVATIONS less none)


# -- q, k and v: sibling linears of one input as one GEMM (issue 31) ---------------------------------
def _weight_key(lin: nn.Linear) -> tuple:
    """What says a linear's parameters are the ones a fused weight or a kept product was made
    from: each one's object, storage (``.to()`` and ``.half()`` replace it) and version counter
    (``load_state_dict``, an optimizer step, any in-place write under ``no_grad``). Read from
    ``_parameters``: ``lin.weight`` passes through Module.__getattr__, ~0.6 us a read on the
    build box, and a group reads these on every call."""
    p = lin._parameters  # pylint: disable=protected-access
    w, b = p["weight"], p.get("bias")
    key = (id(w), w.data_ptr(), tensor_version(w))
    return key if b is None else (*key, id(b), b.data_ptr(), tensor_version(b))


class SharedInput:
    """Sibling linears that read one input -- an attention's ``q_proj``, ``k_proj`` and ``v_proj``
    -- run as one GEMM over ``cat([Wq, Wk, Wv])`` (and the biases, where they have them): the
    first of them called with ``x`` computes all the products, returns its own and
    keeps the others for its siblings, which then return theirs without a GEMM of their own while
    ``x`` is the same tensor, unwritten (its version counter), and their parameters unchanged.
    Against three calls: one launch and one host call instead of three, and one GEMM of
    Nq + Nk + Nv columns, whose tiles fill the GPU where k and v alone (a quarter of q each at
    Llama-3-8B's 8 KV heads) leave most SMs idle at a prefill's rows.

    Each output is the member's column slice of the one product: a strided view ([.., n] with the
    row stride of all the columns), as a fused QKV projection's split is. A forward that reshapes
    it by its last dimension (``.view(B, S, heads, head_dim)``, as HF's attention and
    ``benchmarks/e2e_check.py``'s do) sees no difference; one that needs it contiguous calls
    ``.contiguous()``.

    Where a gradient is recorded (training), the one GEMM is over ``cat([Wq, Wk, Wv])`` built at
    each forward from the parameters (in autocast's dtype under autocast: one cast of x instead of
    three), through :class:`LinearFunction`: its backward is one dX GEMM over the gradient of all
    the columns (K = Nq + Nk + Nv, where three GEMMs and two sums of [.., K] would be) and one dW
    GEMM (M = Nq + Nk + Nv rows, where k's and v's alone fill few tiles), and the concatenation's
    backward hands each parameter its rows.

    Anything else is the member's own :class:`Linear` call, the same product: a tracer
    (``torch.compile`` sees the three linears), an input off the GPU or in another dtype, a member
    called with another input than the one its siblings' products were made from, or in another
    grad mode. A forward that does not read all the members from one input (only q of a
    cross-attention, say) would compute products nobody reads: after :data:`MISSES` such calls
    in a row the group turns itself off (``off`` says why; a warning says so once) and the members run
    alone.

    The fused weight is not a parameter (the state dict is unchanged); it is built once for
    inference, cached, and built again when a member's parameters change (object, storage,
    version counter, dtype, device; after a write through ``.data``, which bumps no counter, call
    :meth:`refresh`). It costs the members' bytes again in memory, as :class:`SwiGLUMLP`'s does.
    Pickled or deep-copied, the group drops its cache and any kept products."""

    MISSES = 2

    def __init__(self, members: list):
        ws = [m.weight for m in members]
        if len(members) < 2 or any(type(m) is not Linear or m.activation is not None for m in members):  # pylint: disable=unidiomatic-typecheck
            raise ValueError("SharedInput: two or more gemm_ladder.nn.Linear layers without an activation")
        if len({(w.shape[1], w.dtype, w.device) for w in ws}) != 1 or len({m.bias is None for m in members}) != 1:
            raise ValueError("SharedInput: the members must read one input width in one dtype on one device, "
                             "all with a bias or none: " + ", ".join(f"{tuple(w.shape)} {w.dtype} {w.device}"
                                                                     for w in ws))
        self.members = list(members)
        self.widths = [w.shape[0] for w in ws]
        self.off: str | None = None
        self.misses = 0
        self._fused: tuple | None = None  # (keys, W, bias)
        self._kept: tuple | None = None  # (x, its version, [products or None], [member keys], grad mode)
        for m in members:
            m.shared = self

    def __getstate__(self):
        return {**self.__dict__, "_fused": None, "_kept": None}

    def refresh(self) -> None:
        """Drop the cached fused weight and any kept products (after writing a member's weight
        through ``.data``)."""
        self._fused = self._kept = None

    def fused(self, keys: list) -> tuple:
        """``(cat([W...]), cat([bias...]) or None)`` for the members' parameters as ``keys`` say
        (:func:`_weight_key`): the cached pair while they are unchanged, else a new one."""
        if self._fused is not None and self._fused[0] == keys:
            return self._fused[1:]
        self._fused = None  # the stale one's memory first
        with torch.inference_mode(False), torch.no_grad():
            W = torch.cat([m.weight for m in self.members])
            b = torch.cat([m.bias for m in self.members]) if self.members[0].bias is not None else None
        self._fused = (keys, W, b)
        return W, b

    def holds(self, x: torch.Tensor) -> bool:
        """Whether products of ``x`` are kept for members yet to read them."""
        return self._kept is not None and self._kept[0] is x

    def kept_for(self, member: Linear, x: torch.Tensor) -> torch.Tensor | None:
        """``member``'s product of ``x`` kept by a sibling's call, unread, while ``x`` is unwritten
        and ``member``'s parameters unchanged since; else None. It checks no more of the call:
        a sibling's call made the product moments before, in the same forward, in the same grad
        mode (a product made with its graph is not handed to a call without, nor the reverse)."""
        kept = self._kept
        if kept is None or kept[0] is not x:
            return None
        i = self.members.index(member)
        parts = kept[2]
        if parts[i] is None or kept[1] != tensor_version(x) or kept[3][i] != _weight_key(member) \
                or kept[4] != torch.is_grad_enabled():
            return None
        y, parts[i] = parts[i], None
        if all(p is None for p in parts):
            self._kept, self.misses = None, 0
        return y

    def output(self, member: Linear, x: torch.Tensor) -> torch.Tensor | None:
        """``member``'s product of ``x`` from the group's one GEMM, or None where the group does
        not serve the call (see the class docstring; the caller then runs the member alone)."""
        if self.off is not None:
            return None
        y = self.kept_for(member, x)
        if y is not None:
            return y
        if self._kept is not None:  # products no member read: the forward did not read them all from one input
            self._kept = None
            self.misses += 1
            if self.misses >= self.MISSES:
                self.off = (f"{self.misses} calls did not read every member's product from one input "
                            "(the forward does not call them all on the same tensor)")
                self._fused = None
                warnings.warn(f"gemm_ladder.nn.SharedInput: turned off, {self.off}; the members run alone",
                              stacklevel=3)
                return None
        i = self.members.index(member)
        keys = [_weight_key(m) for m in self.members]
        if plain_inference():
            if not uses_kernel(x, member._parameters["weight"]):  # pylint: disable=protected-access
                return None
            W, b = self.fused(keys)
            y = fast_mm(x, W, b)
            if y is None:
                y = ops.direct_mm(x, W, b, None)
        else:
            y = self._recorded(x)
            if y is None:
                return None
        parts = list(y.split(self.widths, dim=-1))
        mine, parts[i] = parts[i], None
        self._kept = (x, tensor_version(x), parts, keys, torch.is_grad_enabled())
        return mine

    def _recorded(self, x: torch.Tensor) -> torch.Tensor | None:
        """The one GEMM where autograd may record it (training; autocast; grad off but autocast
        on): the concatenated parameters built now, with their graph; None where the members run
        alone (traced, or off the kernels' path)."""
        ps = [(m._parameters["weight"], m._parameters.get("bias")) for m in self.members]  # pylint: disable=protected-access
        if traced(x, *(t for p in ps for t in p)):
            return None
        cast = autocast_dtype(x)
        dtype = cast or ps[0][0].dtype
        if not group_uses_kernel(x, ps[0][0], dtype, cast is not None):
            return None
        W = torch.cat([w.to(dtype) for w, _ in ps])
        b = torch.cat([b.to(dtype) for _, b in ps]) if ps[0][1] is not None else None
        return linear(x.to(dtype), W, b)


def group_uses_kernel(x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype, autocast: bool) -> bool:
    """Whether a :class:`SharedInput` whose weights are like ``weight`` runs ``x`` through one GEMM
    in ``dtype`` where a gradient may be recorded: on the GPU, fp16/bf16, x in that dtype (under
    autocast: any, it is cast as F.linear's input is)."""
    return x.is_cuda and weight.is_cuda and dtype in _DTYPES and (autocast or x.dtype == dtype)


_QKV = ("q_proj", "k_proj", "v_proj")


def shared_input_mismatch(module: nn.Module) -> str | None:
    """None where ``module``'s ``q_proj``, ``k_proj`` and ``v_proj`` can be one :class:`SharedInput`
    (plain linears, one input width, dtype and device, a bias on all or none), else what differs.
    Their forward need not be read: a call that does not fit the group is its member's own."""
    ms = [getattr(module, n, None) for n in _QKV]
    if not all(_plain_linear(m) for m in ms):
        return "q_proj, k_proj and v_proj are not all nn.Linear"
    if any(getattr(m, "shared", None) is not None for m in ms):
        return "already fused"
    if len({(m.in_features, m.weight.dtype, m.weight.device) for m in ms}) != 1:
        return "q_proj, k_proj and v_proj differ in input width, dtype or device"
    if len({m.bias is None for m in ms}) != 1 or len({m.bias.dtype for m in ms if m.bias is not None}) > 1:
        return "q_proj, k_proj and v_proj do not all have a bias (of one dtype), or all none"
    return None


# -- SwiGLU: gate, up and silu in one kernel (issue 31) --------------------------------------------
class SwiGLUFunction(torch.autograd.Function):
    """``silu(x . Wg^T) * (x . Wu^T)`` eager from the fused weight ``W_gu`` (``cat([Wg, Wu])``,
    built by :class:`SwiGLUMLP`, no grad of its own), for training; the gradients of x, Wg and Wu
    by ``ops.swiglu_grads`` on our kernels (dWg and dWu: the halves of dW_gu, in each weight's
    dtype, as autocast's cast node would give them).

    Its forward is one GEMM for gate and up together, ``h = x . W_gu^T`` [.., 2N], kept for the
    backward with ``silu(gate)`` (what torch's autograd of the unfused MLP keeps, less its two
    linears' outputs as separate tensors), and ``silu(gate) * up`` by torch (as the unfused MLP
    rounds it). With ``recompute``
    it is the op's gated kernel instead, which writes only Y, and the backward recomputes h: half
    the activation memory of the layer for one more GEMM of the forward's size (1.3-1.5 ms a layer
    at 16384 x 11264 x 2048 on an H100: what a GPU-bound step pays). A backward that builds a graph
    concatenates the weights again, differentiably, and calls the op."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, W_gu, recompute=False):  # pylint: disable=arguments-differ
        if recompute:
            ctx.save_for_backward(x, w_gate, w_up, W_gu)
            return ops.direct_swiglu(x, W_gu)
        h = ops.direct_mm(x, W_gu)
        n = h.shape[-1] // 2
        silu = F.silu(h[..., :n])
        ctx.save_for_backward(x, w_gate, w_up, W_gu, h, silu)  # silu(gate) too, as torch's autograd keeps it
        return silu * h[..., n:]

    @staticmethod
    def backward(ctx, grad):  # pylint: disable=arguments-differ
        x, w_gate, w_up, W_gu, *kept = ctx.saved_tensors
        needs = ctx.needs_input_grad
        graph = torch.is_grad_enabled()
        if graph:  # create_graph: W_gu, and h, must be functions of the weights
            W_gu, gemm, kept = torch.cat([w_gate, w_up]).to(W_gu.dtype), torch.ops.gemm_ladder.mm, []
        else:
            gemm = ops.direct_mm
        dx, dW = ops.swiglu_grads(grad, x, W_gu, (needs[0], needs[1] or needs[2]), gemm, eager=not graph,
                                  h=kept[0] if kept else None, silu=kept[1] if kept else None)
        d_gate, d_up = dW.chunk(2) if dW is not None else (None, None)
        return (dx, d_gate.to(w_gate.dtype) if needs[1] else None, d_up.to(w_up.dtype) if needs[2] else None, None,
                None)


class SwiGLUMLP(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` with gate, up and silu in one gated kernel
    (``torch.ops.gemm_ladder.swiglu``: half the output bytes of the two products, no [.., 2N]
    intermediate). The three linears are the original modules (``from_mlp``), so the parameters,
    their names and the state dict are the MLP's, and an optimizer holding them stays valid.

    The kernel reads one fused weight ``W_gu = cat([Wg, Wu])``. It is not a parameter (that would
    change the state dict, break ``load_state_dict`` and hide the optimizer's Parameters); it is
    built from the two weights: for inference once, cached, and built again when either weight's
    object, storage, version counter (``load_state_dict``, an optimizer step, any in-place write
    under ``no_grad``), dtype or device changes -- a write through ``.data`` bumps no counter:
    after one, call :meth:`refresh`. It costs gate and up's bytes again in memory. Where a
    gradient is recorded for the weights (training) it is built at every forward instead (one
    copy a step, as autocast's cast of each weight is; under autocast it is that cast) so an
    optimizer that writes ``.data`` can never leave it stale. Traced (``torch.compile``, fake
    tensors) it is ``torch.cat`` in the graph, and the op's autograd takes the gradients to Wg
    and Wu. Off the GPU, or in a dtype the kernel does not take, it is the MLP's own formula on
    its own modules.

    Training (a gradient recorded) runs the MLP's own formula on its linears by default
    (``fused_training = False``), x cast once for both: gate and up as separate GEMMs whose
    outputs are contiguous. The fused training path (``fused_training = True``) runs gate and up
    as one GEMM over ``W_gu`` and keeps its output h [.., 2N] for the backward
    (:class:`SwiGLUFunction`), but silu(gate) * up and its backward then read h's halves as
    strided views, which torch's elementwise kernels run unvectorised: it measured slower over a
    whole step than the separate GEMMs (llama-350m, 16 x 1024 tokens: 0.982x against 1.002x torch
    on an H100, ``benchmarks/results/2026-11-26_h100_e2e_train_350/``); with this default and the
    q/k/v groups, ``fuse=True`` ran that step at 1.036x on an H200
    (``benchmarks/results/2026-11-28_h200_e2e_train_350/``). On that path
    the gated kernel writes only Y, so keeping h spares a recompute; ``recompute = True`` (default
    False) takes the gated kernel and the recompute instead: the memory of h saved for that GEMM."""

    recompute: bool = False
    fused_training: bool = False

    def __init__(self, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Module):
        super().__init__()
        if gate_proj.weight.shape != up_proj.weight.shape or gate_proj.bias is not None or up_proj.bias is not None:
            raise ValueError(f"SwiGLUMLP: gate_proj {tuple(gate_proj.weight.shape)} and up_proj "
                             f"{tuple(up_proj.weight.shape)} must be bias-free linears of one shape (the fused "
                             "kernel takes cat([W_gate, W_up]) and no bias)")
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.act_fn = nn.SiLU()
        self._fused: tuple | None = None  # (key, W_gu): see fused_weight

    @classmethod
    def from_mlp(cls, mlp: nn.Module) -> "SwiGLUMLP":
        """A :class:`SwiGLUMLP` over ``mlp``'s own three linears, where :func:`swiglu_mismatch`
        finds none; else ValueError saying what differs."""
        why = swiglu_mismatch(mlp)
        if why is not None:
            raise ValueError(f"SwiGLUMLP.from_mlp: {type(mlp).__name__} is not fused: {why}")
        new = cls(mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        new.train(mlp.training)
        return new

    def refresh(self) -> None:
        """Drop the cached fused weight (after writing a weight through ``.data``)."""
        self._fused = None

    def fused_weight(self, dtype: torch.dtype, cache: bool = True) -> torch.Tensor:
        """``cat([Wg, Wu])`` in ``dtype``, no grad of its own: the cached one while the weights are
        unchanged (see the class docstring), or a new one (``cache=False``: not kept)."""
        wg, wu = self.gate_proj.weight, self.up_proj.weight
        key = (id(wg), id(wu), wg.data_ptr(), wu.data_ptr(), tensor_version(wg), tensor_version(wu), dtype,
               wg.device)
        if cache and self._fused is not None and self._fused[0] == key:
            return self._fused[1]
        self._fused = None  # the stale one's memory first
        n = wg.shape[0]
        if not cache and not torch.is_inference_mode_enabled():
            # a training forward's (every step): the same copies from detached weights, which record
            # no graph, without the two context managers (~5 us of host a call on the build box)
            W_gu = torch.empty((2 * n, wg.shape[1]), dtype=dtype, device=wg.device)
            W_gu[:n].copy_(wg.detach())
            W_gu[n:].copy_(wu.detach())
            return W_gu
        # a normal tensor even inside inference_mode: a later forward with grad may save it
        with torch.inference_mode(False), torch.no_grad():
            W_gu = torch.empty((2 * n, wg.shape[1]), dtype=dtype, device=wg.device)
            W_gu[:n].copy_(wg)
            W_gu[n:].copy_(wu)
        if cache:
            self._fused = (key, W_gu)
        return W_gu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wg, wu = self.gate_proj.weight, self.up_proj.weight
        if self._fused is not None and type(x) is torch.Tensor and type(wg) in _PLAIN and type(wu) in _PLAIN \
                and plain_inference():
            y = fast_swiglu(x, self.fused_weight(wg.dtype))  # None unless a call like this one was checked
            if y is not None:
                return self.down_proj(y)
        cast = autocast_dtype(x)
        dtype = cast or wg.dtype
        if not swiglu_uses_kernel(x, wg, wu, dtype, cast is not None):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        x = x.to(dtype)
        if traced(x, wg, wu):
            y = torch.ops.gemm_ladder.swiglu(x, torch.cat([wg.to(dtype), wu.to(dtype)]))
        elif torch.is_grad_enabled() and (x.requires_grad or wg.requires_grad or wu.requires_grad):
            if not self.fused_training:  # the MLP's own formula on its linears (see the class docstring)
                return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
            y = SwiGLUFunction.apply(x, wg, wu, self.fused_weight(dtype, cache=False), self.recompute)
        else:
            y = ops.direct_swiglu(x, self.fused_weight(dtype))
        return self.down_proj(y)


def swiglu_uses_kernel(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, dtype: torch.dtype,
                       autocast: bool) -> bool:
    """Whether :class:`SwiGLUMLP` runs ``x`` through the gated kernel in ``dtype`` (the weights'
    dtype, or autocast's), else the MLP's own formula: on the GPU, fp16/bf16, x in that dtype
    (under autocast: any, it is cast as F.linear's input is)."""
    return (x.is_cuda and w_gate.is_cuda and w_up.is_cuda and dtype in _DTYPES and w_up.dtype == w_gate.dtype
            and (autocast or x.dtype == dtype))


class _LinearLeaves(torch.fx.Tracer):
    """torch.fx's tracer with every linear a leaf (ours too: its forward is not the question)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, nn.Linear) or super().is_leaf_module(m, module_qualified_name)


def _plain_linear(m) -> bool:
    """An ``nn.Linear`` or our :class:`Linear` without an activation (the same function)."""
    return type(m) is nn.Linear or (type(m) is Linear and m.activation is None)  # pylint: disable=unidiomatic-typecheck


def _hooked(*modules) -> bool:
    # pylint: disable=protected-access
    return any(m is not None and (m._forward_hooks or m._forward_pre_hooks) for m in modules)


def _call(node, op: str, target=None, nargs: int = 1) -> bool:
    return (node.op == op and (target is None or node.target == target) and len(node.args) == nargs
            and not node.kwargs)


def swiglu_mismatch(mlp: nn.Module) -> str | None:
    """None where ``mlp`` computes ``down_proj(silu(gate_proj(x)) * up_proj(x))`` with bias-free
    gate and up linears of one shape (what :class:`SwiGLUMLP` computes), else what differs. The
    forward is read from its torch.fx graph (the linears as leaves): exactly those five calls on
    its one input, silu as ``F.silu`` or an ``nn.SiLU`` module (HF's ``ACT2FN["silu"]``), the
    product in either order. Hooks on the MLP, the gate, the up or the activation refuse it (they
    would see tensors the fused kernel never makes)."""
    gate, up, down = (getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj"))
    if not all(_plain_linear(m) for m in (gate, up, down)):
        return "gate_proj, up_proj and down_proj are not all nn.Linear"
    if gate.bias is not None or up.bias is not None:
        return "gate_proj or up_proj has a bias (the gated kernel takes none)"
    if gate.weight.shape != up.weight.shape or down.in_features != gate.out_features:
        return (f"gate_proj {tuple(gate.weight.shape)}, up_proj {tuple(up.weight.shape)} and down_proj "
                f"{tuple(down.weight.shape)} do not chain")
    if gate.weight.dtype != up.weight.dtype or gate.weight.device != up.weight.device:
        return "gate_proj and up_proj weights differ in dtype or device"
    act = getattr(mlp, "act_fn", None)
    if _hooked(mlp, gate, up, act if isinstance(act, nn.Module) else None):
        return "it, its gate_proj, up_proj or act_fn has forward hooks"
    try:
        graph = _LinearLeaves().trace(mlp)
    except Exception as err:  # pylint: disable=broad-except  # any forward fx cannot trace is not ours to fuse
        return f"its forward does not trace with torch.fx ({type(err).__name__})"
    nodes = list(graph.nodes)
    x = [n for n in nodes if n.op == "placeholder"]
    out = nodes[-1].args[0] if nodes and nodes[-1].op == "output" else None
    if len(nodes) != 7 or len(x) != 1 or out is None or not _call(out, "call_module", "down_proj"):
        return "its forward is not down_proj(silu(gate_proj(x)) * up_proj(x))"
    prod = out.args[0]
    if not (_call(prod, "call_function", operator.mul, 2) or _call(prod, "call_function", torch.mul, 2)):
        return "its forward is not down_proj(silu(gate_proj(x)) * up_proj(x))"
    for a, u in (prod.args, prod.args[::-1]):
        if not (isinstance(u, torch.fx.Node) and _call(u, "call_module", "up_proj") and u.args[0] is x[0]):
            continue
        act_name = _activation_of(mlp, a)
        if act_name != "silu":
            return f"its activation is {act_name}, not silu"
        g = a.args[0]
        if isinstance(g, torch.fx.Node) and _call(g, "call_module", "gate_proj") and g.args[0] is x[0]:
            return None
    return "its forward is not down_proj(silu(gate_proj(x)) * up_proj(x))"


def _activation_of(mlp: nn.Module, node) -> str:
    """``silu`` where the fx ``node`` is silu of one tensor (``F.silu``, an ``nn.SiLU`` module), else
    what it is (the activation's name, for the report)."""
    if not isinstance(node, torch.fx.Node) or len(node.args) != 1:
        return f"{getattr(node, 'op', type(node).__name__)} (not one call on one tensor)"
    if node.op == "call_module":
        sub = mlp.get_submodule(node.target)
        silu = type(sub) is nn.SiLU and not node.kwargs  # pylint: disable=unidiomatic-typecheck
        return "silu" if silu else type(sub).__name__
    if node.op == "call_function":
        if node.target is F.silu and set(node.kwargs) <= {"inplace"}:
            return "silu"
        return getattr(node.target, "__name__", str(node.target))
    return node.op


_PAIR_ACTS = {nn.ReLU: lambda m: "relu", nn.SiLU: lambda m: "silu",
              nn.GELU: lambda m: "gelu_tanh" if m.approximate == "tanh" else "gelu_erf"}


def sequential_pairs(seq: nn.Module) -> list[tuple[int, str]]:
    """(index of the Linear, activation) of each ``Linear, ReLU | GELU | SiLU`` pair of children of
    an ``nn.Sequential`` (its type exactly: a subclass may have its own forward), neither hooked:
    in a Sequential the Linear's output goes to the activation and nowhere else."""
    if type(seq) is not nn.Sequential:  # pylint: disable=unidiomatic-typecheck
        return []
    kids = list(seq)
    return [(i, _PAIR_ACTS[type(b)](b)) for i, (a, b) in enumerate(zip(kids, kids[1:]))
            if _plain_linear(a) and type(b) in _PAIR_ACTS and not _hooked(a, b)]


class PatchReport(list):
    """What :func:`patch` did: the list of the nn.Linear layers it swapped (names, as before), and
    ``fused``: (name, what) of each fusion, ``left``: (name, why) of each look-alike it left alone."""

    def __init__(self, swapped=(), fused=(), left=()):
        super().__init__(swapped)
        self.fused, self.left = list(fused), list(left)


FUSIONS = ("swiglu", "qkv", "act")  # what patch(fuse=...) names: SwiGLU MLPs, q/k/v groups, Linear -> act pairs


def fusions(fuse) -> frozenset:
    """The fusions ``patch(model, fuse=fuse)`` makes: all of :data:`FUSIONS` for True, none for
    False, else the names given (one, or a collection); anything else is refused with the names."""
    if fuse is True or fuse is False:
        return frozenset(FUSIONS if fuse else ())
    kinds = {fuse} if isinstance(fuse, str) else set(fuse) if isinstance(fuse, (list, tuple, set, frozenset)) else None
    if kinds is None or not kinds <= set(FUSIONS):
        raise ValueError(f"patch(fuse={fuse!r}): use True (every fusion), False (none) or some of "
                         f"{', '.join(FUSIONS)}, e.g. fuse=('swiglu', 'act')")
    return frozenset(kinds)


def _fuse(model: nn.Module, kinds=frozenset(FUSIONS)) -> tuple[list, list, list]:
    """Fuse what :func:`swiglu_mismatch`, :func:`shared_input_mismatch` and
    :func:`sequential_pairs` recognise (those of ``kinds``), in place: (fused, left, the names of
    the Linears it made)."""
    fused, left, made = [], [], []
    for name, module in list(model.named_modules()) if "swiglu" in kinds else ():
        if isinstance(module, SwiGLUMLP) or not all(hasattr(module, n) for n in ("gate_proj", "up_proj",
                                                                                  "down_proj")):
            continue
        why = swiglu_mismatch(module)
        if why is None and not name:
            why = "it is the model itself: patch its parent, or use SwiGLUMLP.from_mlp"
        if why is not None:
            left.append((name, why))
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, SwiGLUMLP.from_mlp(module))
        fused.append((name, "swiglu: gate_proj, up_proj and silu in one kernel"))
    for name, module in list(model.named_modules()) if "qkv" in kinds else ():
        if not all(hasattr(module, n) for n in _QKV):
            continue
        why = shared_input_mismatch(module)
        if why is not None:
            left.append((name, why))
            continue
        members = []
        for n in _QKV:
            lin = getattr(module, n)
            if type(lin) is nn.Linear:  # pylint: disable=unidiomatic-typecheck
                lin = Linear.from_linear(lin)
                setattr(module, n, lin)
                made.append(f"{name}.{n}" if name else n)
            members.append(lin)
        SharedInput(members)
        fused.append((name, "qkv: q_proj, k_proj and v_proj in one GEMM"))
    for name, module in list(model.named_modules()) if "act" in kinds else ():
        for i, act in sequential_pairs(module):
            module[i] = Linear.from_linear(module[i], activation=act)
            module[i + 1] = nn.Identity()
            prefix = f"{name}." if name else ""
            fused.append((f"{prefix}{i}", f"linear+{act}: {prefix}{i + 1} in its epilogue (now nn.Identity)"))
            made.append(f"{prefix}{i}")
    return fused, left, made


def patch(model: nn.Module, verbose: bool = True, fuse=False) -> PatchReport:
    """Swap every ``nn.Linear`` of ``model`` (type exactly nn.Linear) for a :class:`Linear` over the
    same parameters, in place; with ``fuse``, first fuse the SwiGLU MLPs, attentions' q/k/v and
    Linear -> activation pairs it recognises (see the module docstring; ``fuse`` True for all of
    them, or some of :data:`FUSIONS` by name). Returns the swapped modules' names (a
    :class:`PatchReport`, with what it fused and what it left alone and why), printed to stderr
    when ``verbose``. ``model`` itself cannot be swapped in place: an nn.Linear is refused."""
    if type(model) is nn.Linear:  # pylint: disable=unidiomatic-typecheck
        raise TypeError("patch(model) swaps the nn.Linear layers inside model; for one layer use "
                        "gemm_ladder.nn.Linear.from_linear(layer)")
    kinds = fusions(fuse)
    fused, left, swapped = _fuse(model, kinds) if kinds else ([], [], [])
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:  # pylint: disable=unidiomatic-typecheck
                setattr(module, child_name, Linear.from_linear(child))
                swapped.append(f"{name}.{child_name}" if name else child_name)
    if verbose:
        print(f"gemm_ladder.nn.patch: {len(swapped)} nn.Linear layer(s) now run on gemm_ladder's kernels"
              + "".join(f"\n  {s}" for s in swapped)
              + (f"\nfused {len(fused)}:" if kinds else "") + "".join(f"\n  {n}: {w}" for n, w in fused)
              + (f"\nleft unfused {len(left)}:" if left else "") + "".join(f"\n  {n}: {w}" for n, w in left),
              file=sys.stderr)
    return PatchReport(swapped, fused, left)
