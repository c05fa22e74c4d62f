"""End to end on a GPU (issue 31): a Llama-style model on torch's ``nn.Linear`` against the same
model patched onto our kernels (``gemm_ladder.nn.patch``), in inference and in training, bf16.

The model is written here in plain torch (:class:`Llama`: RMSNorm, rotary attention with grouped
KV heads through ``F.scaled_dot_product_attention``, a SwiGLU MLP of separate gate/up/down
``nn.Linear``, an untied or tied LM head; every weight an ``nn.Linear``), from a :class:`Config`
with random weights: no download, no ``transformers``, and a decode step with our own static KV
cache that a CUDA graph captures.

- inference (:data:`INFER_MODELS`: ``llama-8b-2l``, Llama-3.1-8B's widths with 2 layers, and
  ``llama-125m``, 12 layers of width 768), each model in a process of its own: the torch model and
  a deep copy patched with ``gemm_ladder.nn.patch``. Correctness first: the final hidden states
  of a 1x512 prefill and the last logits, and the logits of a graph-replayed decode step at batch
  8, against the same model in fp32 (TF32 off); ours passes where its relative error is at most
  twice torch's bf16 model's own plus bf16's floor (``harness.ERROR_FLOOR``): rounding differs,
  the error must not grow. Then prefill (eager, logits of the last position only, as generation
  computes them) at each batch x sequence of
  :data:`PREFILL`, and decode at each batch of :data:`DECODE` as one step captured in a CUDA graph
  and replayed (static KV cache of :data:`DECODE_CONTEXT` positions, the new token attending to all);
  torch and ours take turns in alternating rounds, median per-round times;
- training (:data:`TRAINS`, picked by ``prepare --train MODEL``: ``llama-125m``, full depth, 12
  layers at 8 x 512 tokens, host-bound, by default; ``llama-350m``, 5 layers of width 2048 at
  16 x 1024 tokens, GPU-bound, the arithmetic beside :data:`TRAINS`): from the same initial
  weights and the same
  batches (a fixed seed; sequences that walk a few fixed strides through part of the vocabulary,
  so the loss falls), AdamW with fp32 master weights under bf16 autocast (what mixed-precision
  training runs: the GEMMs in bf16, the optimizer state and updates in fp32), the run's ``steps``
  (150; 200) of torch, ours and a yardstick run (torch from weights perturbed by 1e-3 relative noise:
  how far two runs that differ only by rounding-size changes drift apart), taking turns by blocks
  of :data:`TRAIN_BLOCK` steps; ``loss_ok`` per :func:`loss_ok`; step time the median over the
  blocks after warm-up, each timed between GPU synchronisations (see :data:`TRAIN_BLOCK`);
- each phase runs in a child process with a deadline (``measure.isolate``): a hang costs its
  phase, not the run. The front door runs strict (``GEMM_LADDER_STRICT=1``: a GEMM no module of
  the pack serves is an error, never torch's matmul in disguise) and keeps the pack's choice
  (``GEMM_LADDER_MEASURE=0``): every patched GEMM is our kernel. ``--front measured`` runs it as a
  user gets it instead: the front door times the pack's modules against torch's matmul at each
  shape's first call and keeps the faster (:data:`FRONT_MODES`);
- ``--fuse`` (``prepare --fuse``, then ``run --fuse``): ours is patched with
  ``gemm_ladder.nn.patch(model, fuse=True)``: each MLP's gate, up and silu run as one gated kernel
  (``torch.ops.gemm_ladder.swiglu``) where no gradient is recorded; in training gate and up are
  one GEMM ``x . W_gu^T`` whose output the backward keeps (``SwiGLUMLP.recompute`` False), and
  dX and dW are taken over the fused [.., 2I] gradient (:func:`fused_gemms`). The plan then holds
  those GEMMs too, so one prepared folder runs both ways.

    PYTHONPATH=. .venv/bin/python benchmarks/e2e_check.py prepare build/e2e                  # build box
    PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 GEMM_LADDER_BUILD=0 GEMM_LADDER_PACK=build/e2e \\
        python3 benchmarks/e2e_check.py run build/e2e --out out/e2e_check.json            # GPU box

``prepare`` builds one kernel pack (through the module cache) holding every GEMM the runs make --
:func:`pack_requests` of :func:`plan` -- and writes the plan to ``e2e.json`` beside ``pack.json``;
``run`` needs the TVM runtime and torch only. The GPU-bound training run alone, fused and not
(one folder runs both)::

    PYTHONPATH=. .venv/bin/python benchmarks/e2e_check.py prepare build/e2e_350 --train llama-350m --phase train --fuse
    ... python3 benchmarks/e2e_check.py run build/e2e_350 --phase train [--fuse] --out out/e2e_train_350.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import phase_runs  # noqa: E402  (sibling scripts, not a package: run's scaffolding, shared with host_check)
from power_probe import Sampler  # noqa: E402

import gemm_ladder  # noqa: E402  (the front door: use_pack)
import gemm_ladder.nn as gnn  # noqa: E402
from gemm_ladder.core import cli_types, device, files  # noqa: E402
from gemm_ladder.core.records import Bool, Int, List, Map, Obj, Str, read_json  # noqa: E402
from gemm_ladder.core.spec import GemmSpec, spec_for  # noqa: E402
from gemm_ladder.measure import harness  # noqa: E402
from gemm_ladder.measure.report import table as fmt  # noqa: E402
from gemm_ladder.serve.kernel_pack import KernelPack, build_pack  # noqa: E402

FORMAT = "gemm_ladder.e2e_check"
PLAN_FILE = "e2e.json"
DTYPE = "bfloat16"
ARCH = "sm_90a"  # the pack's (H100)


# -- the model (plain torch) --------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """A Llama-style decoder's widths. ``tie``: the LM head shares the embedding's weight."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie: bool = False
    rope_theta: float = 500000.0
    eps: float = 1e-5

    def __post_init__(self):
        if self.hidden % self.heads or self.heads % self.kv_heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"config {self.name}: hidden ({self.hidden}) must split into heads ({self.heads}) "
                             f"of an even width, and heads into kv_heads ({self.kv_heads}) groups; e.g. hidden 768, "
                             "heads 12, kv_heads 4")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linears(self) -> dict[str, tuple[int, int]]:
        """Each distinct ``nn.Linear`` of a layer, and the LM head: name -> weight (out, in)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h),
                "gate_proj": (self.intermediate, h), "up_proj": (self.intermediate, h),
                "down_proj": (h, self.intermediate), "lm_head": (self.vocab, h)}

    def params(self) -> int:
        per_layer = sum(o * i for n, (o, i) in self.linears().items() if n != "lm_head") + 2 * self.hidden
        head = 0 if self.tie else self.vocab * self.hidden
        return self.layers * per_layer + self.vocab * self.hidden + head + self.hidden


CONFIGS = {
    # Llama-3.1-8B's widths with 2 of its 32 layers: every GEMM of the real model, 1/16 of the time
    "llama-8b-2l": Config("llama-8b-2l", hidden=4096, layers=2, heads=32, kv_heads=8, intermediate=14336,
                          vocab=128256),
    # a full-depth ~125M model to train (untied: the LM head's dX and dW are GEMMs of their own)
    "llama-125m": Config("llama-125m", hidden=768, layers=12, heads=12, kv_heads=4, intermediate=2048, vocab=32000,
                         rope_theta=10000.0),
    # a wide, shallow ~357M model to train where the GPU, not the host, bounds the step (see TRAINS)
    "llama-350m": Config("llama-350m", hidden=2048, layers=5, heads=16, kv_heads=4, intermediate=5632, vocab=32000,
                         rope_theta=10000.0),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # in fp32, as Llama does: a bf16 mean of squares loses the small rows
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rotary_tables(cfg: Config, positions: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions, head_dim] in fp32 (rotate-half convention)."""
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float32) / cfg.head_dim)
    freqs = torch.outer(torch.arange(positions, device=device, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def _repeat_kv(x, groups: int):
    """[B, kv, S, D] -> [B, kv * groups, S, D]: each KV head serves ``groups`` query heads (GQA;
    repeated rather than ``enable_gqa`` so SDPA keeps its flash kernel)."""
    if groups == 1:
        return x
    B, kv, S, D = x.shape
    return x[:, :, None].expand(B, kv, groups, S, D).reshape(B, kv * groups, S, D)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        o = cfg.linears()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, nn.Linear(o[name][1], o[name][0], bias=False))

    def forward(self, x, cos, sin, cache=None, pos=None, mask=None):
        """Prefill (``cache`` None: causal over x) or one decode step (x [B, 1, hidden]; the new
        K and V written at ``pos``, a 1-element device tensor, then attending to the cache under
        ``mask``)."""
        cfg = self.cfg
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, S, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, S, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        groups = cfg.heads // cfg.kv_heads
        if cache is None:
            y = F.scaled_dot_product_attention(q, _repeat_kv(k, groups), _repeat_kv(v, groups), is_causal=True)
        else:
            k_cache, v_cache = cache
            k_cache.index_copy_(2, pos, k)
            v_cache.index_copy_(2, pos, v)
            y = _decode_attention(q, k_cache, v_cache, mask)
        return self.o_proj(y.transpose(1, 2).reshape(B, S, cfg.hidden))


def _decode_attention(q, k, v, mask):
    """One query position against the whole cache, grouped by KV head (query head h reads KV head
    h // groups, as :func:`_repeat_kv` pairs them) without repeating the cache: at batch 64 the
    repeat would copy more bytes than the step's weights. q [B, H, 1, D], k and v [B, kv, L, D],
    ``mask`` [1, 1, 1, L]."""
    B, H, _, D = q.shape
    kv = k.shape[1]
    qg = q.view(B, kv, H // kv, D)
    scores = torch.matmul(qg, k.transpose(-1, -2)).float() * D ** -0.5  # [B, kv, groups, L]
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(q.dtype)
    return torch.matmul(p, v).view(B, H, 1, D)


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.attn = Attention(cfg)
        self.post_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache=None, pos=None, mask=None):
        x = x + self.attn(self.input_norm(x), cos, sin, cache, pos, mask)
        return x + self.mlp(self.post_norm(x))


class Llama(nn.Module):
    """A Llama-style decoder: ``forward(tokens)`` gives the logits of every position (training),
    ``hidden(tokens)`` the final normed states, ``decode(tokens, pos, cache, mask)`` one step."""

    def __init__(self, cfg: Config, max_positions: int = 8192):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tie:
            self.lm_head.weight = self.embed.weight
        cos, sin = rotary_tables(cfg, max_positions, device=self.embed.weight.device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def init_weights(self, seed: int, std: float = 0.02) -> "Llama":
        """Llama's initialisation (normal, std 0.02; norms at 1), from ``seed``."""
        g = torch.Generator(device=self.embed.weight.device).manual_seed(seed)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    m.weight.copy_(torch.randn(m.weight.shape, generator=g, device=m.weight.device) * std)
                elif isinstance(m, RMSNorm):
                    m.weight.fill_(1.0)
        return self

    def hidden(self, tokens):
        S = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.cos[:S], self.sin[:S]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)

    def forward(self, tokens, last_only: bool = False):
        h = self.hidden(tokens)
        return self.lm_head(h[:, -1] if last_only else h)

    def new_cache(self, batch: int, length: int) -> list:
        w = self.embed.weight
        shape = (batch, self.cfg.kv_heads, length, self.cfg.head_dim)
        return [(torch.zeros(shape, device=w.device, dtype=w.dtype), torch.zeros(shape, device=w.device, dtype=w.dtype))
                for _ in self.layers]

    def decode(self, tokens, pos, cache, mask):
        """One step: tokens [B, 1] at position ``pos`` (a 1-element long tensor on the model's
        device, so a captured graph reads it at replay); ``mask`` [1, 1, 1, length] says which
        cache positions it sees. Logits [B, vocab]."""
        x = self.embed(tokens)
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        for layer, kv in zip(self.layers, cache):
            x = layer(x, cos, sin, kv, pos, mask)
        return self.lm_head(self.norm(x)[:, -1])


def linear_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s modules whose type is exactly ``nn.Linear`` (what ``patch`` swaps)."""
    return [n for n, m in model.named_modules() if type(m) is nn.Linear]  # pylint: disable=unidiomatic-typecheck


# -- the plan and the pack (no GPU) -------------------------------------------------------------
INFER_MODELS = ("llama-8b-2l", "llama-125m")  # real widths, and a small model at full depth
PREFILL = ((1, 512), (4, 2048), (8, 4096))  # batch x sequence
DECODE = (1, 8, 64)  # batch
DECODE_CONTEXT = 1024  # cache positions; the timed step is the last, attending to all of them
CHECK_PREFILL = (1, 512)  # the prefill the correctness check runs (one of PREFILL: its modules are built)
CHECK_DECODE = 8  # likewise one of DECODE
TRAIN = {"model": "llama-125m", "batch": 8, "seq": 512, "steps": 150, "warmup": 20, "lr": 6e-4, "seed": 31}
# The training runs ``--train MODEL`` picks (``TRAIN``, the 125M run, by default; both are reported).
#
# llama-125m at 8 x 512 is host-bound: ~50 ms of host a step (12 layers, 85 linears) against ~21 ms
# of GPU, so its ratio measures the host path. llama-350m (357M parameters, Config.params) is sized
# so the GPU bounds the step, as in a real run on one H100:
#   GEMMs: 6 x 291.5M (the parameters a GEMM touches: all but the 65.5M embedding) x 16384 tokens
#          = 2.87e13 flop -> ~57 ms at ~500 TFLOPS (bf16 dense, forward + dX + dW);
#   attention (causal, flash): fwd 2 x B x S^2 x hidden a layer = 2 x 16 x 1024^2 x 2048 = 6.9e10,
#          x 3.5 with the backward, x 5 layers = 1.2e12 -> ~3 ms at ~400 TFLOPS;
#   the rest (RMSNorm and rotary in fp32, cross entropy over 16384 x 32000 fp32 logits, fused AdamW
#          over 357M fp32 parameters: ~28 bytes a parameter = 10 GB) -> ~10 ms at ~3 TB/s;
#   GPU ~70 ms a step against host ~4 ms a layer-block (the 125M run's 50 ms / 12 layers) x 5
#          + the head, loss and optimizer ~5 ms = ~25 ms: the GPU time is ~3x the host time.
# Wide and shallow: 5 layers of width 2048 put 36 linears a step on the host (the 125M model: 85)
# for 4x its GEMM flops a token. 16 x 1024 tokens: a batch a 350M run uses on one GPU (GPT-3's
# 350M trained on 0.5M-token batches, i.e. 32 of these by gradient accumulation), ~30 GB of memory
# for the three models (fp32 weights, gradients, AdamW state: 16 bytes a parameter) plus one
# step's activations. lr 3e-4: GPT-3's for its 350M model. 200 steps x 3 runs x ~75 ms ~ 45 s.
# The loss rule (loss_ok) holds as derived for any model: its tolerance is a fraction of the loss
# (LOSS_TOL) or a multiple of the drift of the yardstick run of the same model on the same batches
# (LOSS_YARDSTICK_X), not a number fitted to the 125M run; 200 steps leave the last LOSS_LAST
# compared after 150 steps of falling.
TRAINS = {
    "llama-125m": TRAIN,
    "llama-350m": {"model": "llama-350m", "batch": 16, "seq": 1024, "steps": 200, "warmup": 20, "lr": 3e-4,
                   "seed": 31, "deadline_s": 300},
}
PHASES = ("inference", "train")
LOSS_WINDOW, LOSS_LAST = 10, 50  # moving-average window, and the last steps compared
LOSS_TOL = 0.02  # the least tolerance of loss_ok, as a fraction of torch's loss (see loss_ok)
LOSS_YARDSTICK_X = 3.0  # ...or this many times the yardstick run's drift, where that is larger
PERTURB = 1e-3  # the yardstick run's relative noise on the initial weights
ROUNDS, PREFILL_REPS, DECODE_REPLAYS = 5, 3, 20
# Training's step time: the models take turns by blocks of TRAIN_BLOCK steps, each block timed by
# the wall clock from a synchronised GPU to a synchronised GPU. Events recorded around one step of
# each model in turn, unsynchronised (the timing before 2026-11-26's third session), measure the
# queue rather than the step where a step is host-bound, as this one is (~50 ms of host against
# ~21 of GPU): a step's span then starts when the GPU reaches it, which depends on how much of the
# previous model's step was still queued, and ours always ran between torch's and the yardstick's.
TRAIN_BLOCK = 5
TRAIN_TIMING = f"wall clock per step, blocks of {TRAIN_BLOCK} steps between GPU synchronisations, models alternating by block"

_MODEL = Obj({"name": Str(), **{k: Int(lo=1) for k in ("hidden", "layers", "heads", "kv_heads", "intermediate",
                                                          "vocab")}})
_INFERENCE = Obj({"models": List(Str(), min_len=1),
                  "prefill": List(List(Int(lo=1), length=2)),
                  "decode": List(Int(lo=1)), "decode_context": Int(lo=2),
                  "check_prefill": List(Int(lo=1), length=2), "check_decode": Int(lo=1)})
# a plan holds "inference" unless its "phases" leave it out (a training-only pack: prepare --phase train)
PLAN_SCHEMA = Obj({"format": Str([FORMAT]),
                   "models": Map(_MODEL),
                   "train": Obj({"model": Str(), "batch": Int(lo=1), "seq": Int(lo=2),
                                 "steps": Int(lo=LOSS_LAST + LOSS_WINDOW), "warmup": Int(lo=0)},
                                optional={"deadline_s": Int(lo=1)}),
                   "gemms": List(Obj({"layout": Str(["KK", "KN", "MN"]), "M": Int(lo=1), "N": Int(lo=1),
                                      "K": Int(lo=1), "why": Str()}, optional={"epilogue": Str(["swiglu"])}))},
                  optional={"fuse": Bool(), "inference": _INFERENCE, "phases": List(Str(list(PHASES)), min_len=1)})
LAYOUTS = {"KK": ("K", "K"), "KN": ("K", "N"), "MN": ("M", "N")}  # forward, dX = dY . W, dW = dY^T . X


def forward_gemms(cfg: Config, rows: int, head_rows: int | None = None) -> list[tuple[int, int, int]]:
    """(M, N, K) of a forward over ``rows`` tokens: each distinct layer weight at ``rows``, the LM
    head at ``head_rows`` (default ``rows``; a prefill's logits are the last position's)."""
    shapes = []
    for name, (n_out, k_in) in cfg.linears().items():
        shapes.append((rows if name != "lm_head" else (head_rows or rows), n_out, k_in))
    return sorted(set(shapes))


def backward_gemms(cfg: Config, rows: int) -> dict[str, list[tuple[int, int, int]]]:
    """The op's backward for every weight at ``rows`` tokens: dX = dY . W (M = rows, N = k_in,
    K = n_out, W read [n_out, k_in] as it lies: KN) and dW = dY^T . X (M = n_out, N = k_in,
    K = rows, both read as they lie: MN)."""
    ws = sorted(set(cfg.linears().values()))
    return {"KN": [(rows, k, n) for n, k in ws], "MN": [(n, k, rows) for n, k in ws]}


def fused_gemms(cfg: Config, rows: int, backward: bool = False) -> dict[tuple[str, str], list[tuple[int, int, int]]]:
    """(layout, epilogue) -> (M, N, K) of the fused MLP (``patch(model, fuse=True)``) over ``rows``
    tokens: the gated forward over W_gu = cat([Wg, Wu]) [2I, H] (N = 2I: the kernel reads both
    halves); with ``backward``, ``x . W_gu^T`` plain (KK: training's forward, whose output the
    backward keeps, or ``ops.swiglu_grads``' recompute of it under ``SwiGLUMLP.recompute``), dX =
    dh . W_gu (KN, K = 2I) and dW_gu = dh^T . x (MN)."""
    gu, h = 2 * cfg.intermediate, cfg.hidden
    out = {("KK", "swiglu"): [(rows, gu, h)]}
    if backward:
        out.update({("KK", "none"): [(rows, gu, h)], ("KN", "none"): [(rows, h, gu)], ("MN", "none"): [(gu, h, rows)]})
    return out


def qkv_gemms(cfg: Config, rows: int, backward: bool = False) -> dict[str, list[tuple[int, int, int]]]:
    """layout -> (M, N, K) of each attention's q, k and v as one GEMM (``gnn.SharedInput``) over
    ``rows`` tokens: x . W_qkv^T (N = Nq + Nk + Nv); with ``backward``, dX = dY . W_qkv (KN, K = the
    three widths) and dW_qkv = dY^T . x (MN)."""
    n, h = cfg.hidden + 2 * cfg.kv_heads * cfg.head_dim, cfg.hidden
    out = {"KK": [(rows, n, h)]}
    if backward:
        out.update({"KN": [(rows, h, n)], "MN": [(n, h, rows)]})
    return out


def plan(fuse: bool = False, train_model: str = TRAIN["model"], phases=PHASES) -> dict:
    """What ``prepare`` writes to :data:`PLAN_FILE`: the models, the runs, and every GEMM they make
    (``fuse``: those of the fused model too, :func:`fused_gemms`; entries with an ``epilogue``).
    ``train_model``: the training run of :data:`TRAINS`; ``phases``: those the plan holds (a pack
    of only the training GEMMs is a fraction of the size: ``prepare --phase train``)."""
    if train_model not in TRAINS:
        raise ValueError(f"no training run for model {train_model!r}: pick one of {', '.join(TRAINS)}")
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases:
        raise ValueError(f"phases {list(phases)}: pick one or more of {', '.join(PHASES)}")
    train_run = TRAINS[train_model]
    tr = CONFIGS[train_model]
    gemms: dict = {}

    def add(layout, shapes, why, epilogue="none"):
        for s in shapes:
            gemms.setdefault((layout, *s, epilogue), why)

    def add_fused(cfg, rows, why, backward=False):
        for (layout, epilogue), shapes in fused_gemms(cfg, rows, backward).items():
            add(layout, shapes, f"{why} (fused MLP)", epilogue)
        for layout, shapes in qkv_gemms(cfg, rows, backward).items():
            add(layout, shapes, f"{why} (q/k/v as one GEMM)")

    for inf in (CONFIGS[n] for n in (INFER_MODELS if "inference" in phases else ())):
        for b, s in PREFILL:
            add("KK", forward_gemms(inf, b * s, head_rows=b), f"{inf.name} prefill {b}x{s}")
            if fuse:
                add_fused(inf, b * s, f"{inf.name} prefill {b}x{s}")
        for b in DECODE:
            add("KK", forward_gemms(inf, b), f"{inf.name} decode {b}")
            if fuse:
                add_fused(inf, b, f"{inf.name} decode {b}")
    if "train" in phases:
        rows = train_run["batch"] * train_run["seq"]
        add("KK", forward_gemms(tr, rows), f"train forward ({tr.name})")
        for layout, shapes in backward_gemms(tr, rows).items():
            add(layout, shapes, f"train backward {'dX' if layout == 'KN' else 'dW'} ({tr.name})")
        if fuse:
            add_fused(tr, rows, f"train ({tr.name})", backward=True)
    inference = {"inference": {"models": list(INFER_MODELS), "prefill": [list(p) for p in PREFILL],
                               "decode": list(DECODE), "decode_context": DECODE_CONTEXT,
                               "check_prefill": list(CHECK_PREFILL), "check_decode": CHECK_DECODE}}
    return {"format": FORMAT, **({"fuse": True} if fuse else {}), "phases": list(phases),
            "models": {n: dataclasses.asdict(c) for n, c in CONFIGS.items()},
            **(inference if "inference" in phases else {}),
            "train": dict(train_run),
            "gemms": [{"layout": lay, "M": M, "N": N, "K": K, "why": why, **({"epilogue": ep} if ep != "none" else {})}
                      for (lay, M, N, K, ep), why in sorted(gemms.items())]}


def pack_requests(doc: dict) -> list[dict]:
    """The ``build_pack`` calls that build every GEMM of the plan: one per layout and epilogue
    (``none``, or the fused MLP's ``swiglu``), bf16."""
    groups: dict = {}
    for g in doc["gemms"]:
        groups.setdefault((g["layout"], g.get("epilogue", "none")), set()).add((g["M"], g["N"], g["K"]))
    return [{"layouts": [LAYOUTS[lay]], "dtypes": [DTYPE], "epilogues": [ep], "shapes": sorted(shapes)}
            for (lay, ep), shapes in sorted(groups.items())]


def unserved(pack: KernelPack, doc: dict, arch: str) -> list[str]:
    """The plan's GEMMs that no module of ``pack`` serves as built for (an exact M, or a runtime-M
    module whose tuned range holds M): what ``run`` would find missing (strict: an error) or
    served by a module made for other M."""
    out = []
    for g in doc["gemms"]:
        a_major, b_major = LAYOUTS[g["layout"]]
        epilogue = g.get("epilogue", "none")
        spec = (GemmSpec(a=DTYPE, b=DTYPE, d=DTYPE, a_major=a_major, b_major=b_major) if epilogue == "none"
                else spec_for(DTYPE, epilogue))
        found = pack.find(g["M"], g["N"], g["K"], DTYPE, arch, spec)
        if found is None or found.fit not in ("exact", "tuned-range"):
            what = g["layout"] if epilogue == "none" else f"{g['layout']} {epilogue}"
            out.append(f"{what} {g['M']}x{g['N']}x{g['K']} ({g['why']}): "
                       f"{'no module' if found is None else found.fit}")
    return out


def config_of(doc: dict, name: str) -> Config:
    """The plan's model ``name`` (a run names models the plan's ``models`` holds)."""
    if name not in doc["models"]:
        raise ValueError(f"the plan runs model {name!r} but holds only {', '.join(doc['models'])}: "
                         "run prepare again")
    return Config(**doc["models"][name])


# -- the rules (no GPU) -------------------------------------------------------------------------
def smooth(xs: list[float], window: int = LOSS_WINDOW) -> list[float]:
    """The trailing moving average (the first ``window - 1`` over what there is)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def drift(losses: list[float], ref: list[float], last: int = LOSS_LAST) -> float:
    """Mean |smoothed difference| over the last ``last`` steps, as a fraction of ``ref``'s mean
    smoothed loss there."""
    if len(losses) != len(ref) or len(ref) < last:
        raise ValueError(f"drift: two curves of the same length, at least {last} steps (got {len(losses)} "
                         f"and {len(ref)})")
    a, b = smooth(losses)[-last:], smooth(ref)[-last:]
    return sum(abs(x - y) for x, y in zip(a, b)) / last / (sum(b) / last)


def loss_ok(ours: list[float], torch_losses: list[float], yardstick: list[float] | None = None) -> dict:
    """Whether our loss curve tracks torch's: both finite, ours fell as far as half of torch's fall,
    and its drift from torch's (:func:`drift`) is at most :data:`LOSS_TOL` of the loss or
    :data:`LOSS_YARDSTICK_X` times the yardstick run's drift, the larger. Why: bf16 GEMMs that
    sum in another order round differently, and the two trajectories then drift apart chaotically
    -- bitwise equality is not expected -- but by what any rounding-size change causes (the
    yardstick measures it); a wrong gradient shows as a curve that stops falling or leaves by
    several percent."""
    finite = all(math.isfinite(x) for x in ours + torch_losses)
    if not finite:
        return {"ok": False, "why": "a loss is not finite"}
    d = drift(ours, torch_losses)
    yd = drift(yardstick, torch_losses) if yardstick else None
    tol = max(LOSS_TOL, LOSS_YARDSTICK_X * yd) if yd is not None else LOSS_TOL
    s_ours, s_torch = smooth(ours), smooth(torch_losses)
    fell = (s_ours[0] - s_ours[-1]) >= 0.5 * (s_torch[0] - s_torch[-1]) and s_torch[-1] < s_torch[0]
    ok = fell and d <= tol
    why = ("tracks torch's" if ok else "did not fall as torch's did" if not fell else
           f"drifts {d:.4f} of the loss from torch's (tolerance {tol:.4f})")
    return {"ok": ok, "drift": d, "yardstick_drift": yd, "tolerance": tol, "fell": fell, "why": why}


def error_ok(rel: float, torch_rel: float) -> bool:
    """Ours within twice torch's own bf16 error against the fp32 model, plus bf16's floor."""
    return math.isfinite(rel) and rel <= 2 * torch_rel + harness.ERROR_FLOOR[DTYPE]


def train_step(m, opt, x, y, vocab: int, dev, sched=None):
    """One training step of ``m`` as every run here takes it: the forward under bf16 autocast, the
    cross-entropy in fp32, the backward, gradients clipped to norm 1, ``opt`` (and ``sched``) stepped,
    gradients cleared; the loss, detached."""
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        logits = m(x)
    loss = F.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=dev.type == "cuda")
    opt.step()
    if sched is not None:
        sched.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def training_pair(doc: dict, dev, fuse: bool = False) -> tuple:
    """torch's model and ours (``gnn.patch``, ``fuse``) from the same fp32 weights of the plan's
    training model, each with its AdamW as :func:`train` sets it up: ``(cfg, models, swapped, opts)``
    for the scripts that time a training step (host_check, train_profile)."""
    tr = doc["train"]
    cfg = config_of(doc, tr["model"])
    with torch.device(dev):
        base = Llama(cfg, tr["seq"]).init_weights(seed=tr["seed"])
    models = {"torch": base, "ours": copy.deepcopy(base)}
    swapped = gnn.patch(models["ours"], verbose=False, fuse=fuse)
    opts = {n: torch.optim.AdamW(m.parameters(), lr=tr["lr"], betas=(0.9, 0.95), weight_decay=0.1,
                                 fused=dev.type == "cuda") for n, m in models.items()}
    return cfg, models, swapped, opts


def train_batch(cfg: Config, batch: int, seq: int, step: int, seed: int, device=None):
    """Step ``step``'s tokens: each row walks one of 8 strides through the first ``span`` ids from a
    random start (mod span), so a model can learn it; the same for every run of a seed."""
    span = min(cfg.vocab, 2048)
    g = torch.Generator(device=device or "cpu").manual_seed(seed * 100003 + step)
    start = torch.randint(span, (batch, 1), generator=g, device=device)
    stride = torch.randint(1, 9, (batch, 1), generator=g, device=device)
    seqs = (start + stride * torch.arange(seq + 1, device=device)) % span
    return seqs[:, :-1], seqs[:, 1:]


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


# -- prepare (build box) ------------------------------------------------------------------------
def prepare(out, sms: int, workers: int | None = None, fuse: bool = False, train_model: str = TRAIN["model"],
            phases=PHASES) -> int:
    doc = plan(fuse, train_model, phases)
    results = []
    for req in pack_requests(doc):
        man = build_pack(out, req["shapes"], req["dtypes"], arch=ARCH, sms=sms, workers=workers,
                         epilogues=req["epilogues"],
                         layouts=req["layouts"], request={"by": "benchmarks/e2e_check.py"})
        results += man["results"]
    failed = [r for r in results if r["status"] == "failed"]
    for r in failed:
        print(f"failed: {r['file']}: {r.get('detail')}", file=sys.stderr)
    files.write_json(Path(out) / PLAN_FILE, doc)
    missing = unserved(KernelPack(out), doc, ARCH)
    for m in missing:
        print(f"not served as planned: {m}", file=sys.stderr)
    size = sum(p.stat().st_size for p in Path(out).iterdir() if p.is_file())
    print(f"{len({r['file'] for r in results})} modules for {len(doc['gemms'])} GEMMs, {size / 2**20:.1f} MiB in {out}")
    return 1 if failed or missing else 0


# -- the GPU side (a CPU dry run for the tests: eager steps, wall clock) ----------------------------
class Span:
    """A timed span on ``dev``'s queue: CUDA events on a GPU (what ran between them there), the
    wall clock elsewhere."""

    def __init__(self, dev: torch.device):
        self.cuda = dev.type == "cuda"
        self.t0 = self.t1 = 0.0
        if self.cuda:
            self.e0, self.e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            self.e0.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.e1.record()
        else:
            self.t1 = time.perf_counter()

    def ms(self) -> float:
        if self.cuda:
            self.e1.synchronize()
            return self.e0.elapsed_time(self.e1)
        return (self.t1 - self.t0) * 1e3


def _sync(dev: torch.device) -> None:
    """Wait for ``dev``'s queue (a no-op off the GPU)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _mean_ms(fn, reps: int, dev: torch.device) -> float:
    """Mean milliseconds of ``reps`` calls of ``fn`` queued back to back."""
    span = Span(dev)
    span.start()
    for _ in range(reps):
        fn()
    span.stop()
    return span.ms() / reps


def _alternate(fns: dict, rounds: int, reps: int, dev: torch.device) -> dict:
    """Median over ``rounds`` of each fn's mean time, the fns taking turns (order flipped each
    round, so neither always runs on the clocks the other left)."""
    got: dict = {n: [] for n in fns}
    names = list(fns)
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            got[n].append(_mean_ms(fns[n], reps, dev))
    return {n: statistics.median(v) for n, v in got.items()}


def _rel(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return torch.nan_to_num(x - ref, nan=float("inf")).norm().item() / (ref.norm().item() or 1.0)


def _free(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


FRONT_MODES = {
    # every patched GEMM on a kernel of the pack (a GEMM none serves is an error, never torch's
    # matmul in disguise), the pack's choice, nothing timed at first use: our kernels' own speed
    "strict": {"GEMM_LADDER_STRICT": "1", "GEMM_LADDER_MEASURE": "0"},
    # what a user gets: the front door times the pack's modules against torch's matmul at each
    # shape's first call and keeps the faster (torch's where it wins), as it does by default
    "measured": {"GEMM_LADDER_STRICT": "0", "GEMM_LADDER_MEASURE": "1"},
}


def _use_front(folder, mode: str) -> None:
    """The front door on this pack in ``mode`` (:data:`FRONT_MODES`)."""
    os.environ.update(FRONT_MODES[mode])
    gemm_ladder.use_pack(folder)


@dataclass
class DecodeStep:
    """One decode step of a model at a batch: ``replay()`` runs it (a CUDA graph's replay on a
    GPU), ``logits`` holds its output, ``state`` its inputs (tokens, pos, cache, mask)."""

    replay: object
    logits: torch.Tensor
    state: tuple


def decode_step(model, batch: int, length: int, seed: int) -> DecodeStep:
    """A decode step of ``model`` with its static cache (filled with seeded random K and V, the
    same for every model at a seed); the new token sits at the last position. On a GPU the step
    is captured in a CUDA graph after three warm-up runs on a side stream (which also load every
    module: the front door must not load inside capture)."""
    dev = model.embed.weight.device
    g = torch.Generator(device=dev).manual_seed(seed)
    cache = model.new_cache(batch, length)
    for k, v in cache:
        k.copy_(torch.randn(k.shape, generator=g, device=dev))
        v.copy_(torch.randn(v.shape, generator=g, device=dev))
    tokens = torch.randint(model.cfg.vocab, (batch, 1), generator=g, device=dev)
    pos = torch.tensor([length - 1], device=dev)
    mask = (torch.arange(length, device=dev) <= pos).view(1, 1, 1, length)
    state = (tokens, pos, cache, mask)
    if dev.type != "cuda":
        logits = model.decode(*state)
        return DecodeStep(lambda: logits.copy_(model.decode(*state)), logits, state)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.decode(*state)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = model.decode(*state)
    return DecodeStep(graph.replay, logits, state)


FUSE_ARG = "fuse="  # a phase's argument: the fusions ours is patched with (gnn.FUSIONS), by name, "+"-joined
# (measure.isolate passes a job's arguments comma-joined)


def fuse_arg(text: str) -> tuple:
    """The fusions a phase's ``fuse=a+b`` argument names (``fuse`` alone: all of them)."""
    if text == "fuse":
        return tuple(gnn.FUSIONS)
    if not text.startswith(FUSE_ARG):
        raise ValueError(f"phase argument {text!r}: expected {FUSE_ARG}NAMES (some of {', '.join(gnn.FUSIONS)})")
    return tuple(sorted(gnn.fusions(tuple(text[len(FUSE_ARG):].split("+")))))


def fuse_job_args(fuse) -> list[str]:
    """The phase's arguments that carry ``fuse`` (True, or some of ``gnn.FUSIONS``): none where
    ours is not fused; :func:`fuse_arg` reads it back."""
    kinds = sorted(gnn.fusions(fuse))
    return [FUSE_ARG + "+".join(kinds)] if kinds else []


def _fused(fuse) -> dict:
    """A row's record of how ours was patched: ``fused`` (any fusion) and ``fusions`` (which)."""
    kinds = sorted(gnn.fusions(fuse))
    return {"fused": bool(kinds), "fusions": kinds}


def phase_job(item: str, args) -> dict:
    """An isolated job (``measure.isolate``, ``package.module:function``): ``item`` is the phase
    (``inference:MODEL`` or ``train``); ``args``: the pack folder, the front-door mode, and
    ``fuse`` where ours is patched with ``fuse=True``."""
    folder, mode = args[0], (args[1] if len(args) > 1 else "strict")
    fuse = fuse_arg(args[2]) if len(args) > 2 else False
    doc = read_json(Path(folder) / PLAN_FILE, "e2e_check plan", "run prepare again", PLAN_SCHEMA)
    if item not in phases_of(doc):
        raise ValueError(f"unknown phase {item!r}: " + ", ".join(phases_of(doc)))
    if mode not in FRONT_MODES:
        raise ValueError(f"unknown front-door mode {mode!r}: " + ", ".join(FRONT_MODES))
    _use_front(folder, mode)
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference is fp32
    if item == "train":
        return train(doc, fuse=fuse)
    return inference(doc, item.partition(":")[2], fuse=fuse)


def phases_of(doc: dict, only=PHASES) -> list[str]:
    """The isolated phases of the plan (each a child process): inference of each model, training;
    ``only``: those kinds (of those the plan holds: its ``phases``, both where it does not say)."""
    held = doc.get("phases", PHASES)
    items = ([f"inference:{m}" for m in doc["inference"]["models"]] if "inference" in held else []) + \
        (["train"] if "train" in held else [])
    return [i for i in items if i.partition(":")[0] in only]


def deadline(doc: dict, phase: str) -> float:
    """Seconds ``phase``'s child may run: :data:`PHASE_TIMEOUT`, or the training run's own
    ``deadline_s`` where it sets one (a larger model's steps take longer)."""
    if phase == "train":
        return float(doc["train"].get("deadline_s", PHASE_TIMEOUT["train"]))
    return PHASE_TIMEOUT[phase.partition(":")[0]]


NO_QKV = "ours_no_qkv"  # inference --fuse: ours fused as before the q/k/v groups (patch fuse=("swiglu", "act"))


def _row(phase: str, cfg: Config, batch: int, tokens: int, ms: dict, t0: float, **extra) -> dict:
    """A timed row of the results format (``tokens``: processed per call; ``t0``, ``t1``: when it
    was timed, for the clocks ``run`` sampled)."""
    ab = {"no_qkv_ms": ms[NO_QKV], "no_qkv_ratio_to_torch": ms["torch"] / ms[NO_QKV]} if NO_QKV in ms else {}
    return {"t0": t0, "t1": time.time(), "phase": phase, "model": cfg.name, "batch": batch, "tokens": tokens,
            **extra, "torch_ms": ms["torch"], "ours_ms": ms["ours"], "ratio_to_torch": ms["torch"] / ms["ours"],
            "tokens_per_s": tokens / ms["ours"] * 1e3, "torch_tokens_per_s": tokens / ms["torch"] * 1e3, **ab}


def inference_pair(doc: dict, model: str, dev: torch.device, fuse: bool = False) -> tuple:
    """(cfg, {"torch": model, "ours": its copy patched}, what ``patch`` swapped): the inference
    phase's ``model`` in bf16 from seeded random weights, in eval mode, with positions for every
    prefill and the decode context of the plan."""
    inf = doc["inference"]
    cfg = config_of(doc, model)
    positions = max([s for _, s in inf["prefill"]] + [inf["decode_context"]])
    with torch.device(dev):
        base = Llama(cfg, positions).to(torch.bfloat16).init_weights(seed=8)
        base.cos, base.sin = rotary_tables(cfg, positions, device=dev)  # the angles stay fp32, as Llama's
    base.eval()
    ours = copy.deepcopy(base)
    swapped = gnn.patch(ours, verbose=False, fuse=fuse)
    return cfg, {"torch": base, "ours": ours}, swapped


def inference(doc: dict, model: str, dev: str = "cuda", fuse: bool = False) -> dict:
    """Correctness against the fp32 model, then prefill and decode timings (see the module
    docstring); ``dev`` other than cuda: a dry run of the same steps (tests); ``fuse``: ours
    patched with ``fuse=True``."""
    inf = doc["inference"]
    dev = torch.device(dev)
    cfg, models, swapped = inference_pair(doc, model, dev, fuse)
    base = models["torch"]
    out: dict = {"status": "ok", "swapped": len(swapped), "fused": len(swapped.fused), "rows": []}
    timed = dict(models)
    if "qkv" in gnn.fusions(fuse):  # the same fused model without its q/k/v groups, in the same rounds: what they buy
        timed[NO_QKV] = copy.deepcopy(base)
        gnn.patch(timed[NO_QKV], verbose=False, fuse=tuple(k for k in gnn.fusions(fuse) if k != "qkv"))
    g = torch.Generator(device=dev).manual_seed(5)
    with torch.inference_mode():
        # correctness: a prefill's hidden states and last logits, and a decode step, against fp32
        b, s = inf["check_prefill"]
        tokens = torch.randint(cfg.vocab, (b, s), generator=g, device=dev)
        ref = copy.deepcopy(base).float()
        ref_h = ref.hidden(tokens)
        refs = {"hidden": ref_h, "logits": ref.lm_head(ref_h[:, -1])}
        got = {n: {"hidden": m.hidden(tokens), "logits": m(tokens, last_only=True)} for n, m in models.items()}
        check: dict = {"prefill": [b, s]}
        for what, r in refs.items():
            rel, trel = _rel(got["ours"][what], r), _rel(got["torch"][what], r)
            check[what] = {"rel_err": rel, "torch_rel_err": trel,
                           "ours_vs_torch": _rel(got["ours"][what], got["torch"][what]), "ok": error_ok(rel, trel)}
        steps = {n: decode_step(m, inf["check_decode"], inf["decode_context"], seed=9) for n, m in models.items()}
        for st in steps.values():
            st.replay()
        tok, pos, cache, mask = steps["torch"].state
        ref_step = ref.decode(tok, pos, [(k.float(), v.float()) for k, v in cache], mask)
        rel, trel = _rel(steps["ours"].logits, ref_step), _rel(steps["torch"].logits, ref_step)
        check["decode"] = {"batch": inf["check_decode"], "rel_err": rel, "torch_rel_err": trel,
                           "ok": error_ok(rel, trel)}
        del ref, ref_h, refs, got, steps, ref_step
        _free(dev)
        out["check"] = check
        if not all(check[k]["ok"] for k in ("hidden", "logits", "decode")):
            out["status"] = "wrong"
            return out  # nothing timed on wrong answers

        for b, s in inf["prefill"]:
            tokens = torch.randint(cfg.vocab, (b, s), generator=g, device=dev)
            fns = {n: (lambda m=m, t=tokens: m(t, last_only=True)) for n, m in timed.items()}
            for fn in fns.values():
                fn()
            t0 = time.time()
            ms = _alternate(fns, ROUNDS, PREFILL_REPS, dev)
            out["rows"].append(_row("prefill", cfg, b, b * s, ms, t0, seq=s, **_fused(fuse)))
            del tokens, fns
            _free(dev)
        for b in inf["decode"]:
            steps = {n: decode_step(m, b, inf["decode_context"], seed=10 + b) for n, m in timed.items()}
            t0 = time.time()
            ms = _alternate({n: st.replay for n, st in steps.items()}, ROUNDS, DECODE_REPLAYS, dev)
            out["rows"].append(_row("decode", cfg, b, b, ms, t0, context=inf["decode_context"],
                                    cuda_graph=dev.type == "cuda", **_fused(fuse)))
            del steps
            _free(dev)
    return out


def train(doc: dict, dev: str = "cuda", fuse: bool = False) -> dict:
    """torch, ours and the yardstick run from the same weights on the same batches, a step of each
    in turn (see the module docstring); ``dev`` other than cuda: a dry run (tests); ``fuse``: ours
    patched with ``fuse=True``."""
    tr = doc["train"]
    cfg = config_of(doc, tr["model"])
    dev = torch.device(dev)
    with torch.device(dev):
        base = Llama(cfg, tr["seq"]).init_weights(seed=tr["seed"])  # fp32 master weights
    models = {"torch": base, "ours": copy.deepcopy(base), "yardstick": copy.deepcopy(base)}
    swapped = gnn.patch(models["ours"], verbose=False, fuse=fuse)
    g = torch.Generator(device=dev).manual_seed(tr["seed"] + 1)
    with torch.no_grad():
        for p in models["yardstick"].parameters():
            p.mul_(1 + PERTURB * torch.randn(p.shape, generator=g, device=dev))
    opts = {n: torch.optim.AdamW(m.parameters(), lr=tr["lr"], betas=(0.9, 0.95), weight_decay=0.1,
                                 fused=dev.type == "cuda")
            for n, m in models.items()}
    warm = max(1, tr["warmup"])
    scheds = {n: torch.optim.lr_scheduler.LambdaLR(o, lambda i: min(1.0, (i + 1) / warm)) for n, o in opts.items()}
    losses: dict = {n: [] for n in models}
    spans: dict = {n: [] for n in models}

    def step(name, x, y):
        return train_step(models[name], opts[name], x, y, cfg.vocab, dev, scheds[name])

    names = list(models)
    t0 = time.time()
    for b, first in enumerate(range(0, tr["steps"], TRAIN_BLOCK)):
        batches = [train_batch(cfg, tr["batch"], tr["seq"], i, tr["seed"], device=dev)
                   for i in range(first, min(first + TRAIN_BLOCK, tr["steps"]))]
        for n in (names if b % 2 == 0 else names[::-1]):
            _sync(dev)
            start = time.perf_counter()
            for x, y in batches:
                losses[n].append(step(n, x, y))
            _sync(dev)
            if first >= tr["warmup"]:
                spans[n].append((time.perf_counter() - start) * 1e3 / len(batches))
    losses = {n: torch.stack(v).tolist() for n, v in losses.items()}
    ms = {n: statistics.median(v or [float("nan")]) for n, v in spans.items()}
    rule = loss_ok(losses["ours"], losses["torch"], losses["yardstick"])
    row = {"t0": t0, "t1": time.time(), "phase": "train", "model": cfg.name, "params": cfg.params(),
           "batch": tr["batch"], "seq": tr["seq"], "tokens": tr["batch"] * tr["seq"], "steps": tr["steps"],
           "precision": "bf16 autocast, fp32 master weights", "optimizer": "AdamW", "timing": TRAIN_TIMING,
           "torch_step_ms": ms["torch"],
           "ours_step_ms": ms["ours"], "yardstick_step_ms": ms["yardstick"], "ratio_to_torch": ms["torch"] / ms["ours"],
           "tokens_per_s": tr["batch"] * tr["seq"] / ms["ours"] * 1e3, "loss_ok": rule["ok"],
           "loss_rule": rule, "first_loss": losses["torch"][0], "final_loss_torch": smooth(losses["torch"])[-1],
           "final_loss_ours": smooth(losses["ours"])[-1], "losses": losses, **_fused(fuse)}
    return {"status": "ok" if rule["ok"] else "wrong", "swapped": len(swapped), "fused": len(swapped.fused),
            "rows": [row]}


# -- run ----------------------------------------------------------------------------------------
# seconds a phase's child may run (a training run of TRAINS may set its own: deadline)
PHASE_TIMEOUT = {"inference": 150.0, "train": 90.0}


def table(rows: list[dict]) -> str:
    out = [{"phase": r["phase"], "model": r["model"], "batch": r["batch"], "tokens": r["tokens"],
            "torch ms": f"{r.get('torch_ms', r.get('torch_step_ms', 0)):.3f}",
            "ours ms": f"{r.get('ours_ms', r.get('ours_step_ms', 0)):.3f}",
            "x torch": f"{r['ratio_to_torch']:.3f}",
            "no q/k/v groups x torch": f"{r['no_qkv_ratio_to_torch']:.3f}" if "no_qkv_ratio_to_torch" in r else "",
            "loss ok": {True: "yes", False: "NO"}.get(r.get("loss_ok"), "")}
           for r in rows]
    return fmt(out, list(out[0])) if out else "no rows"


def phase_line(phase: str, res: dict) -> str:
    """One line on a finished phase: its status, the errors of its checks, or what went wrong."""
    checks = "; ".join(f"{k} rel err {v['rel_err']:.2e} (torch {v['torch_rel_err']:.2e})"
                       for k, v in res.get("check", {}).items() if isinstance(v, dict))
    detail = str(res.get("detail", ""))[-300:]
    return " ".join(x for x in (f"{phase}: {res.get('status')}", checks, detail) if x)


def summarize(results: dict, rows: list[dict]) -> dict:
    """Per phase and model of the rows: how many, the geomean and least ratio to torch, and (train)
    whether the loss check passed; per isolated phase its status."""
    out: dict = {"status": {p: r.get("status") for p, r in results.items()}}
    for key in sorted({(r["phase"], r["model"]) for r in rows}):
        part = [r for r in rows if (r["phase"], r["model"]) == key]
        ratios = [r["ratio_to_torch"] for r in part]
        out[f"{key[0]} {key[1]}"] = {"rows": len(part), "geomean_ratio": geomean(ratios), "min_ratio": min(ratios),
                                     **({"loss_ok": all(r["loss_ok"] for r in part)} if key[0] == "train" else {})}
    return out


def run(folder, out, only=PHASES, mode: str = "strict", fuse=False, train_model: str | None = None) -> int:
    """Each phase in a child with its deadline (``fuse``: ours patched with ``fuse=fuse``: True,
    or some of ``gnn.FUSIONS``); writes
    ``out``. 0 once written, 2 where it cannot run (``phase_runs.checked_plan`` says why).
    ``train_model``: the training run the caller expects the plan to hold (prepare's ``--train``
    chose it; a plan of another model is refused rather than reported under the wrong name)."""
    def read(fix):
        doc = read_json(Path(folder) / PLAN_FILE, "e2e_check plan", fix, PLAN_SCHEMA)
        for name in [*doc.get("inference", {}).get("models", []), doc["train"]["model"]]:
            config_of(doc, name)  # a model the plan lacks: ValueError
        if "inference" in doc.get("phases", PHASES) and "inference" not in doc:
            raise ValueError(f"the plan in {folder} runs inference but has no inference section: {fix}")
        held = doc.get("phases", PHASES)
        if not phases_of(doc, only):
            raise ValueError(f"the plan in {folder} holds only the phase(s) {', '.join(held)}, not "
                             f"{', '.join(only)}: run with --phase {held[0]}, or prepare {folder} again with "
                             f"--phase {only[0]} on the build box")
        if train_model is not None and "train" in only and doc["train"]["model"] != train_model:
            raise ValueError(f"--train {train_model}: the plan in {folder} trains {doc['train']['model']}: run "
                             f"benchmarks/e2e_check.py prepare {folder} --train {train_model} on the build box")
        if fuse and not doc.get("fuse"):
            raise ValueError(f"the plan in {folder} has no fused-MLP GEMMs: run benchmarks/e2e_check.py prepare "
                             f"{folder} --fuse on the build box")
        return doc

    doc = phase_runs.checked_plan("e2e_check", folder, read,
                                  lambda doc: unserved(KernelPack(folder), doc, device.arch_of(0)))
    if doc is None:
        return 2
    start, gpu = time.time(), harness.gpu_info()
    args = [str(folder), mode] + fuse_job_args(fuse)
    results, rows = phase_runs.run_phases(phase_runs.job_of(__name__, "e2e_check"), phases_of(doc, only), args,
                                          lambda phase: deadline(doc, phase), phase_line, Sampler())
    phase_runs.write_results(out, FORMAT, gpu, start, __doc__.split("\n\n")[2].strip(),
                             {"mode": mode, "env": FRONT_MODES[mode]}, summarize(results, rows), results, rows, table,
                             fuse=bool(gnn.fusions(fuse)), fusions=sorted(gnn.fusions(fuse)))
    return 0


def fusion_names(text: str) -> tuple:
    """``--fusions``: comma-separated names of ``gnn.FUSIONS``."""
    try:
        return tuple(sorted(gnn.fusions(tuple(n.strip() for n in text.split(",") if n.strip()))))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--fusions {text!r}: {err}") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare", help="build box: the kernel pack of every GEMM of the runs, and the plan")
    pr.add_argument("out", help="the folder to build (and carry to the GPU box)")
    pr.add_argument("--sms", type=cli_types.count, default=132, help="SM count the policy plans for (H100 SXM)")
    pr.add_argument("--workers", type=cli_types.count, default=None)
    pr.add_argument("--fuse", action="store_true", help="also the GEMMs of the fused model (run --fuse)")
    pr.add_argument("--train", choices=list(TRAINS), default=TRAIN["model"],
                    help=f"the training run's model (default {TRAIN['model']}: host-bound; llama-350m: GPU-bound)")
    pr.add_argument("--phase", choices=PHASES, action="append",
                    help="only the GEMMs of these phases (default both; --phase train: a training-only pack)")
    r = phase_runs.add_run_parser(sub, help="GPU box: inference and training, torch against patched",
                                  folder_help="the folder prepare built", out="e2e_check.json",
                                  front_modes=FRONT_MODES,
                                  front_help="strict: every patched GEMM ours (default); measured: the front "
                                             "door's timed choice, torch's matmul where it is faster")
    r.add_argument("--phase", choices=PHASES, action="append", help="only these phases (default: the plan's)")
    r.add_argument("--train", choices=list(TRAINS), default=None,
                   help="the training run's model the plan must hold (prepare --train chose it; default: the plan's)")
    r.add_argument("--fusions", type=fusion_names, default=None,
                   help=f"patch ours with only these fusions (comma-separated, some of {', '.join(gnn.FUSIONS)}; "
                        "the folder from prepare --fuse); --fuse is all of them")
    r.add_argument("--fuse", action="store_true",
                   help="patch ours with gemm_ladder.nn.patch(model, fuse=True): SwiGLU MLPs on the gated kernel "
                        "(the folder from prepare --fuse)")
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a.out, a.sms, a.workers, a.fuse, a.train, tuple(a.phase or PHASES))
    if "e2e" not in Path(a.out).name:
        p.error(f"--out {a.out}: the results file's name must contain 'e2e' (issue 31's results format)")
    if a.fusions is not None and a.fuse:
        p.error("--fuse is every fusion: give it or --fusions, not both")
    return run(a.folder, a.out, tuple(a.phase or PHASES), a.front, a.fusions or a.fuse, a.train)


if __name__ == "__main__":
    sys.exit(main())
