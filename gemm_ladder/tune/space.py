"""The search space of a rung for one shape, pruned before anything is built.

Every knob the rung declares (its ``KNOBS``) takes the values of :data:`DEFAULT_CHOICES`, of the
rung's own ``TUNE_CHOICES`` (a rung with new knobs declares what to try there), or of ``space``
given by the caller; a knob with none keeps its default. Then, in order:

1. the validator (``rungs.make_config``) refuses what cannot build: shared memory, registers,
   divisibility (each refusal kept, with its reason);
2. orders that walk the grid without L2 groups (row, column) ignore ``l2_group_size``: one size
   stands for all;
3. the L2-reuse model (``schedulers.rank_group_sizes``) keeps the best ``l2_keep`` group sizes
   per tile shape, order and cluster shape. It plays the first :data:`MODEL_WAVES` waves only:
   the traffic of a grouped order repeats from group to group, so a 32768 x 32768 grid costs
   what a 4096 x 4096 one does, and the ranking is the full model's (``tests/test_tune.py``).

An operand spec other than the dtype's default (``spec``: an fp8 ``scaled_mm`` kernel's, as ``tune --dtype
float8_e4m3`` asks) is validated with every point and built into every candidate; the L2 model counts its
operands' bytes (one an element for fp8).

A shape past the kernels' 32-bit indices (``config.check_extents``: no knob can make it fit) is
refused at once, before any point is validated. A step that runs longer than
:data:`PROGRESS_DELAY_S` (validating the points of a large space, the L2 model) shows a tqdm bar.
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from dataclasses import dataclass, field

from tqdm import tqdm

from schedulers import rank_group_sizes

from .. import rungs
from ..core import device
from ..core.config import KNOB_NAME, ConfigError, check_extents, largest_m, parse_knob_value
from ..core.device import MODEL_MACHINE
from ..core.spec import SPEC_KNOB, as_spec, operand_bytes, text_is_fp8
from ..serve import plan

# Values tried for each knob a rung has; a knob not listed here (or in the rung's TUNE_CHOICES)
# keeps the rung's default.
DEFAULT_CHOICES = {
    "pipe_depth": (2, 3, 4, 5, 6, 7),
    "l2_group_size": (1, 2, 4, 8, 16, 32),
    "blk_m": (64, 128, 256),
    "blk_n": (64, 128, 192, 256),
    "num_warpgroups": (1, 2),
    "tile_order": ("grouped", "snake", "row", "column"),
    "stream_b": (False, True),
}
# Values tried for an fp8 (scaled_mm) kernel's knobs, around the policy's choice for the shape
# (space.rung_knobs): the ring, the order and the clusters. Its tile, consumers and promotion stay the
# policy's (the promotion's second accumulator set leaves the registers of no other tile; --space widens).
FP8_CHOICES = {
    "pipe_depth": (3, 4, 5, 6),
    "l2_group_size": (4, 8, 16),
    "tile_order": ("snake", "grouped"),
    "cluster_m": (1, 2),
    "cluster_n": (1, 2),
}
# Orders that walk the grid without L2 groups: l2_group_size changes nothing there.
UNGROUPED_ORDERS = ("row", "column")
# The L2 model's machine when no GPU of the arch is here to ask (assumptions, recorded as such).
MODEL_WAVES = 32  # waves the L2 model plays per candidate order (see the module docstring)
PROGRESS_DELAY_S = 2.0  # a step shows its progress bar once it has run this long


@dataclass
class Space:
    """What survives pruning (``candidates``: full knob dicts) and what did not, and why."""

    rung: str
    shape: tuple[int, int, int]
    dtype: str
    arch: str
    choices: dict
    candidates: list[dict] = field(default_factory=list)
    pruned: list[dict] = field(default_factory=list)
    points: int = 0
    l2_model: dict | None = None
    spec: str | None = None  # the operand spec's text where it is not the dtype's default (jobs.Job.spec)

    def spec_knobs(self) -> dict:
        """The knob that carries :attr:`spec` to a build (none for the default)."""
        return {SPEC_KNOB: self.spec} if self.spec else {}

    def counts(self) -> dict:
        out = {"points": self.points, "candidates": len(self.candidates)}
        for p in self.pruned:
            out[p["reason"]] = out.get(p["reason"], 0) + 1
        return out


def parse_space(items) -> dict:
    """``["pipe_depth=3,4,5", "blk_n=128,256;tile_order=grouped"]`` -> ``{knob: [values]}``; each
    value read by ``config.parse_knob_value`` (as ``--knob`` and plan files read them)."""
    out: dict = {}
    for item in items or []:
        for part in filter(None, (p.strip() for p in re.split(r"[;\s]+", item))):
            name, eq, values = part.partition("=")
            if not eq or not KNOB_NAME.fullmatch(name.strip()):
                raise ValueError(f"space item {part!r} is not knob=v1,v2,..., e.g. pipe_depth=3,4,5")
            name = name.strip()
            out[name] = [parse_knob_value(v, name) for v in values.split(",") if v.strip()]
            if not out[name]:
                raise ValueError(f"space item {part!r} gives {name} no value, e.g. {name}=3,4")
    return out


def rung_knobs(rung: str, arch: str, spec: str | None = None, shape=None) -> dict:
    """The rung's knobs and their defaults (imports the rung, hence TVM). With an fp8 ``spec``: the
    rung's fp8 defaults (``make_config`` with the spec), then the policy's knobs for ``shape`` where the
    policy takes this rung (``plan.fp8_module``: the rung's bare fp8 defaults are no kernel the front door
    runs), knobs the policy sets that are not the rung's own (``unroll_k``) included, and M read at run time
    (``dynamic_m``: the front door's modules do, and a static-M module's speed did not carry over to them: at
    256x2112x7168 a best 1.146x the policy's static module ran 1.010x the policy's runtime-M one,
    ``benchmarks/results/2026-11-29_h200_fp8_tune/``)."""
    defaults = dict(rungs.rung_module(rung, arch).KNOBS)
    if not text_is_fp8(spec):
        return defaults
    fp8 = as_spec(spec)
    made = rungs.make_config(rung, 512, 512, 4096, dtype=fp8.d, arch=arch, spec=fp8).knobs()
    defaults.update({k: v for k, v in made.items() if k not in ("dtype", "arch", SPEC_KNOB)})
    if shape is not None:
        policy_rung, knobs = plan.fp8_module(*shape, fp8.scales, fp8.bias)
        if policy_rung == rung:
            defaults.update(knobs)
    if "dynamic_m" in defaults:  # the module scaled_mm and pack build make reads M at run time: tune that one
        defaults["dynamic_m"] = True
    return defaults


def choices(rung: str, arch: str, space: dict | None = None, spec: str | None = None, shape=None) -> dict:
    """The values to try for each of the rung's knobs: ``space``, else the rung's ``TUNE_CHOICES``,
    else :data:`DEFAULT_CHOICES`, else the default alone (:func:`rung_knobs`). For an fp8 ``spec``,
    :data:`FP8_CHOICES` stands for the last two, the policy's own value first: around the policy's knobs,
    the policy's kernel among the candidates."""
    mod = rungs.rung_module(rung, arch)
    defaults = rung_knobs(rung, arch, spec, shape)
    fp8 = text_is_fp8(spec)
    table = FP8_CHOICES if fp8 else {**DEFAULT_CHOICES, **getattr(mod, "TUNE_CHOICES", {})}
    space = dict(space or {})
    unknown = sorted(set(space) - set(defaults))
    if unknown:
        raise ConfigError(
            f"rung {rung} ({arch}) has no knob {', '.join(unknown)} to tune; its knobs are {sorted(defaults)}"
        )
    out = {}
    for name, default in defaults.items():
        values = space.get(name, (default, *table[name]) if fp8 and name in table else table.get(name, (default,)))
        if isinstance(values, (str, int)):
            values = [values]
        out[name] = list(dict.fromkeys(values))
        if not out[name]:
            raise ConfigError(f"space for {name} is empty; give at least one value, e.g. {name}={default}")
    return out


def _refusal_reason(msg: str) -> str:
    low = msg.lower()
    if "32-bit index" in low:
        return "32-bit-index"
    if "shared memory" in low:
        return "shared-memory"
    if "register" in low:
        return "registers"
    if any(w in low for w in ("multiple", "divis", "split", "whole")):
        return "divisibility"
    return "refused"


def model_machine(arch: str, num_sms: int | None = None, l2_bytes: int | None = None) -> dict:
    """SM count and L2 size for the L2 model: given, else the GPU here (if of ``arch``), else assumed."""
    machine = dict(MODEL_MACHINE.get(arch, MODEL_MACHINE["sm_90a"]))
    gpu = device.probe(0, arch=arch)
    if gpu is not None:
        machine.update(num_sms=gpu.sm_count, l2_bytes=gpu.l2_bytes, assumed=None, gpu=gpu.name)
    if num_sms:
        machine.update(num_sms=int(num_sms), assumed=None)
    if l2_bytes:
        machine.update(l2_bytes=int(l2_bytes), assumed=None)
    return machine


def _rank_groups(M, N, K, key, sizes, dtype_bytes, machine) -> list[tuple[int, object]]:
    """Group sizes by modelled DRAM traffic; ties go to the size nearest the model's optimum."""
    blk_m, blk_n, order, cluster_m, cluster_n = key
    tiles = math.ceil(M / blk_m) * math.ceil(N / blk_n)
    ctas = max(1, min(machine["num_sms"], tiles))
    ranked = rank_group_sizes(M, N, K, blk_m, blk_n, ctas, machine["l2_bytes"], order=order,
                              group_sizes=tuple(sizes), dtype_bytes=dtype_bytes, cluster_m=cluster_m,
                              cluster_n=cluster_n, max_waves=MODEL_WAVES)
    # a wave's footprint (g*blk_m + P/g*blk_n) is smallest near g = sqrt(P * blk_n / blk_m)
    best_g = math.sqrt(ctas * blk_n / blk_m)
    ranked.sort(key=lambda gt: (gt[1].total_bytes, abs(math.log2(gt[0] / best_g)), gt[0]))
    return ranked


def _steps(items, total: int, desc: str, progress: bool):
    """``items``, with a tqdm bar on stderr that shows once the step has run
    :data:`PROGRESS_DELAY_S` (a short step prints nothing)."""
    if not progress:
        return items
    return tqdm(items, total=total, desc=desc, file=sys.stderr, delay=PROGRESS_DELAY_S, mininterval=1.0,
                leave=False, dynamic_ncols=True)


def _check_some_tile_fits(rung, M, N, K, table, defaults) -> None:
    """Refuse at once a shape that no tile of the space fits in 32-bit indices (every point would
    be refused): checked at the tile that takes the most rows, with that tile's message."""
    def ints(name):
        values = table.get(name, [defaults.get(name, 1)])
        return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0] or [1]

    tiles = list(itertools.product(ints("blk_m"), ints("blk_n"), ints("blk_k")))
    check_extents(f"tune {rung}", M, N, K, *max(tiles, key=lambda tile: largest_m(N, K, *tile)))


def _validate(rung, M, N, K, dtype, arch, names, values_list, sp: Space) -> list[dict]:
    valid = []
    for values in values_list:
        knobs = dict(zip(names, values))
        sp.points += 1
        try:
            rungs.make_config(rung, M, N, K, dtype=dtype, arch=arch, **knobs, **sp.spec_knobs())
        except ConfigError as err:
            sp.pruned.append({"knobs": knobs, "reason": _refusal_reason(str(err)), "detail": str(err)})
            continue
        valid.append(knobs)
    return valid


def _drop_ignored_group_sizes(valid: list[dict], default_g, sp: Space) -> list[dict]:
    """Row and column orders ignore l2_group_size: one size stands for all of them (the rung's
    default size, when it is in the space and valid there)."""
    def sig(knobs):
        return tuple((k, v) for k, v in knobs.items() if k != "l2_group_size")

    stand_in = {}
    for knobs in valid:
        if knobs["tile_order"] in UNGROUPED_ORDERS:
            if sig(knobs) not in stand_in or knobs["l2_group_size"] == default_g:
                stand_in[sig(knobs)] = knobs["l2_group_size"]
    kept = []
    for knobs in valid:
        if knobs["tile_order"] in UNGROUPED_ORDERS and knobs["l2_group_size"] != stand_in[sig(knobs)]:
            g = stand_in[sig(knobs)]
            sp.pruned.append({"knobs": knobs, "reason": "redundant",
                              "detail": f"tile_order={knobs['tile_order']} ignores l2_group_size; "
                                        f"same kernel as l2_group_size={g}"})
            continue
        kept.append(knobs)
    return kept


def _l2_prune(valid: list[dict], M, N, K, dtype, defaults, l2_keep, machine, sp: Space,
              progress: bool = False) -> list[dict]:
    """Keep the best ``l2_keep`` group sizes per (tile, order, cluster) by the L2 model."""
    dtype_bytes = operand_bytes(as_spec(sp.spec, dtype))
    def key_of(knobs):
        get = {**defaults, **knobs}.get
        return (get("blk_m", 128), get("blk_n", 128), get("tile_order", "grouped"), get("cluster_m", 1),
                get("cluster_n", 1))

    groups: dict = {}
    for knobs in valid:
        key = key_of(knobs)
        if key[2] not in UNGROUPED_ORDERS:
            groups.setdefault(key, set()).add(knobs["l2_group_size"])
    keep: dict = {}
    for key, sizes in _steps(groups.items(), len(groups), f"L2 model, {sp.rung}", progress):
        ranked = _rank_groups(M, N, K, key, sorted(sizes), dtype_bytes, machine)
        keep[key] = {"kept": [g for g, _ in ranked[:l2_keep]], "traffic": {g: t.total_bytes for g, t in ranked}}
    kept = []
    for knobs in valid:
        key = key_of(knobs)
        if key in keep and knobs["l2_group_size"] not in keep[key]["kept"]:
            info, g = keep[key], knobs["l2_group_size"]
            best, mine = info["kept"][0] if info["kept"] else None, info["traffic"].get(g)
            detail = (f"L2 model: {key[2]} {key[0]}x{key[1]} tiles keep l2_group_size {info['kept']}; {g} reads "
                      + (f"{mine / 2**20:.0f} MiB vs {info['traffic'][best] / 2**20:.0f} MiB at {best} "
                         f"(first {MODEL_WAVES} waves)"
                         if mine is not None and best is not None else "an order that does not cover the grid"))
            sp.pruned.append({"knobs": knobs, "reason": "l2-model", "detail": detail})
            continue
        kept.append(knobs)
    return kept


def search_space(rung: str, shape, dtype: str = "float16", arch: str = "sm_90a", space: dict | None = None,
                 l2_keep: int | None = 3, num_sms: int | None = None, l2_bytes: int | None = None,
                 progress: bool = True, spec: str | None = None) -> Space:
    """Enumerate the rung's knob space for ``shape`` and prune it before anything is built.

    ``space`` narrows or widens the values per knob (``{"pipe_depth": [3, 4]}``); knobs it does
    not name take :func:`choices`. ``l2_keep``: keep the best ``l2_keep`` l2_group_size values per
    (blk_m, blk_n, tile_order) by the L2-reuse model; ``None`` or 0 keeps them all. ``progress``:
    a bar on stderr for a step that runs long. A shape no knob can fit in 32-bit indices raises
    ``IndexRangeError`` (a ``ConfigError``) at once. ``spec``: an operand spec's text (``GemmSpec.text``),
    built into every candidate (None or the dtype's default: none); a spec no rung builds is a ``ConfigError``.
    """
    M, N, K = (int(x) for x in shape)
    text = None if spec is None or as_spec(spec, dtype).is_default() else as_spec(spec, dtype).text()
    table = choices(rung, arch, space, text, (M, N, K))
    defaults = rung_knobs(rung, arch, text, (M, N, K))
    _check_some_tile_fits(rung, M, N, K, table, defaults)
    sp = Space(rung, (M, N, K), dtype, arch, table, spec=text)
    names = list(table)
    points = _steps(itertools.product(*(table[n] for n in names)), math.prod(len(table[n]) for n in names),
                    f"validate {rung} knobs", progress)
    valid = _validate(rung, M, N, K, dtype, arch, names, points, sp)
    if "l2_group_size" in table and "tile_order" in table:
        valid = _drop_ignored_group_sizes(valid, defaults["l2_group_size"], sp)
    if l2_keep and "l2_group_size" in table and len(table["l2_group_size"]) > l2_keep:
        machine = model_machine(arch, num_sms, l2_bytes)
        sp.l2_model = {"keep": l2_keep, "waves": MODEL_WAVES, **machine}
        valid = _l2_prune(valid, M, N, K, dtype, defaults, l2_keep, machine, sp, progress)
    sp.candidates = valid
    return sp
