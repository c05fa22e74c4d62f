"""The ladder: which rungs exist, which archs each has a form for, and how a call becomes a config.

``hgemm_vN(M, N, K, **knobs)`` is ``prim_func("vN", M, N, K, **knobs)``: it picks the rung's
form for ``arch`` (``gemm_ladder/<arch>/hgemm_vN.py``), fills in the rung's default knobs,
validates everything (:func:`make_config`, the one validator), and only then traces the
TVMScript kernel.

The rungs are the files: a new ``gemm_ladder/<arch>/hgemm_vN.py`` with ``TECHNIQUE``, ``KNOBS``
(its knobs and their defaults: a new knob is declared there, and its type is checked from its
default), ``check(cfg)``, ``launch(cfg)`` and ``kernel(cfg)`` is in :data:`RUNGS`. Importing
this module imports no TVM (the rung files are imported on first use).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

from .core.config import (ARCHS, BLK_M_CHOICES, BLK_N_CHOICES, BUILD_OPTIONS, COMMON_KNOBS, DEFAULT_ARCH, ConfigError,
    GemmConfig, check_common, check_knob_types, drop_retired_knobs)
from .core.launch import check_grid
from .core.spec import SPEC_KNOB, GemmSpec, as_spec, check_built, operand_bytes, spec_of

CONFIG_ATTR = "gemm_ladder.config"
_RUNG_FILE = re.compile(r"hgemm_(v\d+)\.py")


def _arch_package(arch: str) -> str:
    return arch.replace("_", "")  # sm_90a -> sm90a


def _arch_dirs(arch: str) -> list[Path]:
    spec = importlib.util.find_spec(f"gemm_ladder.{_arch_package(arch)}")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(loc) for loc in spec.submodule_search_locations]


def _discover() -> tuple[str, ...]:
    """Every rung that has a file for some arch, in ladder order (v1, v2, ..., v10)."""
    names = {m.group(1) for arch in ARCHS for d in _arch_dirs(arch) for p in d.glob("hgemm_v*.py")
             if (m := _RUNG_FILE.fullmatch(p.name))}
    return tuple(sorted(names, key=lambda r: int(r[1:])))


RUNGS = _discover()


_MODULES: dict = {}  # (rung, arch) -> its module, once imported


def rung_module(rung: str, arch: str = DEFAULT_ARCH) -> ModuleType:
    """The module that holds ``rung``'s form for ``arch``; a clear error when there is none."""
    if rung not in RUNGS:
        raise ConfigError(f"unknown rung {rung!r}; the ladder has {', '.join(RUNGS)}")
    if arch not in ARCHS:
        raise ConfigError(f"arch={arch!r} has no form in gemm-ladder; use one of {sorted(ARCHS)}")
    hit = _MODULES.get((rung, arch))
    if hit is not None:
        return hit
    name = f"gemm_ladder.{_arch_package(arch)}.hgemm_{rung}"
    try:
        hit = _MODULES[(rung, arch)] = importlib.import_module(name)
        return hit
    except ModuleNotFoundError as err:
        if err.name not in (name, name.rsplit(".", 1)[0]):  # the rung, or the whole arch, is missing
            raise
        have = [a for a in ARCHS if available(rung, a)]
        raise ConfigError(
            f"rung {rung} has no form for arch {arch}; it has forms for {have or 'no arch yet'}"
        ) from None


def available(rung: str, arch: str) -> bool:
    """Whether ``rung`` has a form for ``arch`` (without importing TVM)."""
    return any((d / f"hgemm_{rung}.py").exists() for d in _arch_dirs(arch))


def make_config(rung: str, M: int, N: int, K: int, **knobs) -> GemmConfig:
    """Fill in the rung's defaults and validate; raises :class:`ConfigError` before any compile.
    A knob the rung no longer has is ignored at its old default (tuning records made before)."""
    knobs = drop_retired_knobs(rung, knobs)
    arch = knobs.get("arch", DEFAULT_ARCH)
    mod = rung_module(rung, arch)
    if "grouped" in getattr(mod, "EPILOGUES", ()) and knobs.get(SPEC_KNOB) in (None, ""):
        # a grouped rung (v12) builds grouped specs only: its default is the grouped GEMM in the dtype
        dtype = knobs.get("dtype", COMMON_KNOBS["dtype"])
        knobs = {**knobs, SPEC_KNOB: GemmSpec(a=dtype, b=dtype, d=dtype, grouped=True)}
    knobs = _with_spec(knobs)
    # an fp8 spec: the rung's FP8_KNOBS (v9's promote), present only there (the knobs, tags and
    # cache keys of 16-bit modules stay as they were), and its FP8_DEFAULTS (blk_k=128)
    fp8 = SPEC_KNOB in knobs and as_spec(knobs[SPEC_KNOB], knobs["dtype"]).is_fp8
    fp8_knobs = {**getattr(mod, "FP8_DEFAULTS", {}), **getattr(mod, "FP8_KNOBS", {})} if fp8 else {}
    # likewise a residual spec's RESIDUAL_KNOBS (v9's c_prefetch)
    residual = SPEC_KNOB in knobs and as_spec(knobs[SPEC_KNOB], knobs["dtype"]).residual is not None
    fp8_knobs = {**fp8_knobs, **(getattr(mod, "RESIDUAL_KNOBS", {}) if residual else {})}
    # a rung's OPTIONAL_KNOBS (v10's reduce): taken anywhere, kept only away from their defaults
    # (the knobs, tags and cache keys of modules at the default stay as they were)
    optional = getattr(mod, "OPTIONAL_KNOBS", {})
    knobs = {k: v for k, v in knobs.items() if not (k in optional and type(v) is type(optional[k])
                                                     and v == optional[k])}
    fp8_knobs = {**fp8_knobs, **{k: v for k, v in optional.items() if k in knobs}}
    allowed = set(mod.KNOBS) | set(COMMON_KNOBS) | set(BUILD_OPTIONS) | {SPEC_KNOB} | set(fp8_knobs) | set(optional)
    unknown = sorted(set(knobs) - allowed)
    if unknown:
        only_fp8 = sorted(set(unknown) & set(getattr(mod, "FP8_KNOBS", {})))
        only_residual = sorted(set(unknown) & set(getattr(mod, "RESIDUAL_KNOBS", {})))
        raise ConfigError(
            f"rung {rung} ({arch}) takes no knob {', '.join(unknown)}; its knobs are {sorted(allowed)}"
            + (f" ({', '.join(only_fp8)}: fp8 specs only)" if only_fp8 else "")
            + (f" ({', '.join(only_residual)}: specs with a residual only)" if only_residual else "")
        )
    check_knob_types(rung, knobs, {**COMMON_KNOBS, SPEC_KNOB: "", **mod.KNOBS, **fp8_knobs})
    values = {**mod.KNOBS, **fp8_knobs, **knobs}
    fields = set(GemmConfig.__dataclass_fields__)
    extra = tuple(sorted((k, v) for k, v in values.items() if k not in fields))
    cfg = GemmConfig(rung=rung, M=M, N=N, K=K, extra=extra, knob_names=tuple(sorted(mod.KNOBS)),
                     **{k: v for k, v in values.items() if k in fields})
    check_common(cfg, getattr(mod, "BLK_M_CHOICES", BLK_M_CHOICES), operand_bytes(spec_of(cfg)),
                 getattr(mod, "BLK_N_CHOICES", BLK_N_CHOICES))
    # what the rung does not build yet
    check_built(spec_of(cfg), rung, getattr(mod, "EPILOGUES", ("none",)), getattr(mod, "MN_MAJOR", False))
    mod.check(cfg)
    check_grid(cfg, mod.launch(cfg))
    return cfg


def _with_spec(knobs: dict) -> dict:
    """The knobs with the operand spec (``spec``: a GemmSpec, its text or dict) as its text, and
    ``dtype`` from it; the spec is left out where it is the default for the dtype (the knobs, tag
    and cache key of such a module are those it had before the spec existed)."""
    if knobs.get(SPEC_KNOB) in (None, ""):
        return {k: v for k, v in knobs.items() if k != SPEC_KNOB}
    spec = as_spec(knobs[SPEC_KNOB], knobs.get("dtype", COMMON_KNOBS["dtype"]))
    # the config's dtype is D's, but where the spec has D in float32: then A's and B's (16-bit)
    want = spec.a if spec.d == "float32" else spec.d
    dtype = knobs.get("dtype", want)
    if dtype != want:
        raise ConfigError(f"dtype={dtype!r} but spec {spec.text()} has {'A' if spec.d == 'float32' else 'D'} in "
                          f"{want}; pass one of them, or both alike")
    rest = {k: v for k, v in knobs.items() if k != SPEC_KNOB}
    return {**rest, "dtype": dtype, **({} if spec.is_default() else {SPEC_KNOB: spec.text()})}


def prim_func(rung: str, M: int, N: int, K: int, **knobs):
    """The TVMScript ``T.prim_func`` of ``rung`` for this shape and these knobs."""
    cfg = make_config(rung, M, N, K, **knobs)
    return kernel_of(cfg)


def kernel_of(cfg: GemmConfig):
    """Trace the rung's kernel; the prim_func carries its config (``build(func)`` reads it) and
    the names of its barriers (``gemm_ladder.barriers``, which also bounds its waits when the
    ``watchdog`` knob is set)."""
    # optional: TVM's compiler (sync.classes subclasses its barrier classes; a runtime-only GPU box has none)
    from .sync.classes import RECORD_PARAM, traced  # pylint: disable=import-outside-toplevel

    func = traced(cfg, rung_module(cfg.rung, cfg.arch).kernel)
    # the runtime passes the spec's epilogue operands last (before a watchdog's record), in its
    # order: the kernel must take them so
    wanted = [op.name for op in spec_of(cfg).epilogue_operands()]
    have = [str(p.name) for p in func.params if str(p.name) != RECORD_PARAM]
    if wanted and have[-len(wanted):] != wanted:
        raise ConfigError(f"{cfg.rung}'s kernel takes ({', '.join(have)}), not its spec's epilogue operands "
                          f"({', '.join(wanted)}) last: declare them with sm90a.epilogue.kernel_operands")
    return func.with_attr(CONFIG_ATTR, json.dumps(cfg.to_dict(), sort_keys=True))


def from_dict(d: dict) -> GemmConfig:
    """The config :meth:`GemmConfig.to_dict` wrote, validated again."""
    d = dict(d)
    rung, M, N, K = d.pop("rung"), d.pop("M"), d.pop("N"), d.pop("K")
    return make_config(rung, M, N, K, **d)


def config_of_prim_func(func) -> GemmConfig:
    attrs = func.attrs if func.attrs is not None else {}
    if CONFIG_ATTR not in attrs:
        raise TypeError(
            "this prim_func was not made by a gemm_ladder rung: pass gemm_ladder.hgemm_v4(M, N, K) "
            "or call gemm_ladder.build('v4', M, N, K, ...)"
        )
    return from_dict(json.loads(str(attrs[CONFIG_ATTR])))
