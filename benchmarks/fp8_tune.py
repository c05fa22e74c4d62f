"""The fp8 tuner's run against the policy it would replace: which candidate is the policy's, and the rows.

``tune --dtype float8_e4m3 --measure`` times every candidate against ``torch._scaled_mm`` (its second
pass, the best four again in the same rounds). Where the best is not the policy's own kernel, that is
not yet evidence that the database should override the policy: the policy's candidate may not have
been in the second pass. So:

    # build box, after tune --build-only: each folder's policy candidate (the rung's knobs need TVM)
    .venv/bin/python benchmarks/fp8_tune.py policy build/tune_fp8/* > build/tune_fp8/policy.txt
    # GPU box, after tune --measure: each folder's policy and best in the same rounds (benchmarks/ab_rounds.py:
    # checked, then timed with torch._scaled_mm, the kernels replayed in CUDA graphs), where they differ
    python3 benchmarks/fp8_tune.py ab build/tune_fp8/policy.txt --out OUT
    # build box, once entries are merged: scaled_mm's own modules (M at run time) as its policy builds them
    # from the rules and from the database, at the tuned shapes and at shapes of their buckets not tuned on
    .venv/bin/python benchmarks/fp8_tune.py door build/fp8_door tensor:300x2112x7168 block:4096x2560x6144 ...
    # GPU box: each pair in the same rounds, kernels in CUDA graphs
    python3 benchmarks/fp8_tune.py abpairs build/fp8_door/pairs.txt --out OUT
    # build box: the rows (issue 32's results format) and the entries worth merging
    .venv/bin/python benchmarks/fp8_tune.py rows RUN.json ab_*.json --out fp8_tune.json
    # any ab_rounds.py files of fp8 modules (say, the rules before and after a change), a row per module
    .venv/bin/python benchmarks/fp8_tune.py abrows OUT/door_*.json --baseline rules_before --commit C --out rows.json

A row holds the recipe, M, N, K, whether every candidate was correct, the best's TFLOPS and its ratio to
``torch._scaled_mm`` (``ratio_to_scaled_mm``), the policy's, and the A/B's ratio of the best over the
policy timed together (``ratio_to_policy``). ``merge`` lists the measurement reports whose best beat the
policy in the A/B by more than :data:`MERGE_EDGE`: only those go into the packaged database.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemm_ladder.core import files
from gemm_ladder.core.spec import GemmSpec

MERGE_EDGE = 1.01  # the best must beat the policy's kernel by 1% in the same rounds to replace it


def _reports(run: Path) -> list[dict]:
    data = json.loads(run.read_text())
    return data["reports"] if "reports" in data else [data]


def policy_candidate(report: dict) -> dict | None:
    """The candidate of ``report`` whose knobs are the policy's for its shape and spec (the rung's fp8
    defaults under the policy's choice: ``tune.space.rung_knobs``), or None."""
    # the build layer: the policy's knobs (TVM's compiler, on the build box)
    from gemm_ladder.tune import space  # pylint: disable=import-outside-toplevel

    want = space.rung_knobs(report["rung"], report["arch"], report["spec"], tuple(report["shape"]))
    for r in report["results"]:
        if all(want.get(k) == v for k, v in r["knobs"].items()):
            return r
    return None


def policies(folders: list[Path]) -> list[str]:
    """``folder policy_file`` for each candidate folder (its candidates.json) that holds the policy's kernel."""
    lines = []
    for folder in folders:
        man = json.loads((folder / "candidates.json").read_text())
        found = policy_candidate({**man, "results": man["candidates"]})
        if found is None:
            print(f"{folder}: no candidate has the policy's knobs", file=sys.stderr)
            continue
        lines.append(f"{folder} {found['file']}")
    return lines


def ab(policy_list: Path, out: Path) -> None:
    """GPU box: for each folder of ``policy_list``, its measured best against the policy's candidate in the
    same rounds (``ab_rounds.py``), into ``out/ab_<folder>.json``; nothing where the best is the policy's."""
    import subprocess  # pylint: disable=import-outside-toplevel

    for line in policy_list.read_text().split("\n"):
        if not line.strip():
            continue
        folder, policy = line.split()
        reports = sorted(Path(folder).glob("measurements_*.json"))
        best = json.loads(reports[-1].read_text()).get("best") if reports else None
        if best is None or best["file"] == policy:
            print(f"{folder}: best is the policy's ({policy})" if best else f"{folder}: not measured", flush=True)
            continue
        subprocess.run([sys.executable, str(Path(__file__).with_name("ab_rounds.py")), f"{folder}/{policy}",
                        f"{folder}/{best['file']}", "--rounds", "30", "--per-round", "20", "--timer", "graph",
                        "--out", str(out / f"ab_{Path(folder).name}.json")], check=False)


def door(out: Path, cases: list[str]) -> list[str]:
    """Build box: for each ``recipe:MxNxK``, the module ``scaled_mm`` builds (``scaled.build_job``: M at run
    time) with the tuning database off (the rules) and with the packaged one, copied into ``out``; writes
    ``out/pairs.txt`` (``rules tuned name`` a line, where the two differ) and returns its lines."""
    # the build layer: the policy and the module cache (TVM's compiler, on the build box)
    # pylint: disable=import-outside-toplevel
    import os
    import shutil

    from gemm_ladder.compile import module_cache
    from gemm_ladder.compile.batch import BuildJob
    from gemm_ladder.serve import scaled, tuning_db

    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for case in cases:
        recipe, _, shape = case.partition(":")
        M, N, K = (int(x) for x in shape.split("x"))
        call = scaled.Call(M, N, K, recipe, GemmSpec.fp8("bfloat16", recipe))
        paths = {}
        for label, setting in (("rules", "off"), ("tuned", str(tuning_db.PACKAGED_DB))):
            os.environ[tuning_db.DB_ENV] = setting
            # a cache of the case's own: a runtime-M module from the shared cache keeps the M it was first
            # built at, and a pair must be timed at one M
            os.environ["GEMM_LADDER_CACHE"] = str(out / "cache" / f"{recipe}_{M}x{N}x{K}")
            rung, _, knobs = scaled.build_job(call, "sm_90a")
            path, _ = module_cache.get_or_build(BuildJob(rung, (M, N, K), knobs))
            paths[label] = out / f"{recipe}_{M}x{N}x{K}_{label}.so"
            for src, dst in ((path, paths[label]), (Path(f"{path}.json"), Path(f"{paths[label]}.json"))):
                shutil.copyfile(src, dst)
        if paths["rules"].read_bytes() != paths["tuned"].read_bytes():
            lines.append(f"{paths['rules']} {paths['tuned']} {recipe}_{M}x{N}x{K}")
        else:
            print(f"{case}: the database gives the rules' module", file=sys.stderr)
    (out / "pairs.txt").write_text("".join(line + "\n" for line in lines))
    return lines


def ab_pairs(pairs_file: Path, out: Path) -> None:
    """GPU box: each ``rules tuned name`` pair of ``pairs_file`` in the same rounds (``ab_rounds.py``, kernels
    in CUDA graphs), into ``out/door_<name>.json``."""
    import subprocess  # pylint: disable=import-outside-toplevel

    for line in pairs_file.read_text().split("\n"):
        if line.strip():
            rules, tuned, name = line.split()
            subprocess.run([sys.executable, str(Path(__file__).with_name("ab_rounds.py")), rules, tuned, "--rounds",
                            "30", "--per-round", "20", "--timer", "graph", "--out", str(out / f"door_{name}.json")],
                           check=False)


def rows(run: Path, ab_files: list[Path]) -> dict:
    ab = {}
    for f in ab_files:
        doc = json.loads(f.read_text())
        mods = {m["module"]: m for m in doc["modules"]}
        ab[tuple(doc["shape"])] = (doc, mods)
    out, merge = [], []
    for rep in _reports(run):
        M, N, K = rep["shape"]
        spec = GemmSpec.parse(rep["spec"])
        policy, best = policy_candidate(rep), rep.get("best") or {}
        doc, mods = ab.get((M, N, K), (None, {}))
        pair = (mods.get(policy["file"]) if policy else None, mods.get(best.get("file")))
        ratio = (pair[0]["ms"] / pair[1]["ms"]) if all(m and m.get("status") == "ok" for m in pair) and \
            pair[0] is not pair[1] else (1.0 if policy and policy["file"] == best.get("file") else None)
        row = {"recipe": spec.scales, "M": M, "N": N, "K": K,
               "correct": all(r["status"] == "ok" for r in rep["results"]),
               "candidates": len(rep["results"]), "tflops": best.get("tflops"),
               "ratio_to_scaled_mm": best.get("ratio_to_cublas"),
               "peer_ratios": {"torch_scaled_mm": best.get("ratio_to_cublas")},
               "best_knobs": best.get("knobs"), "best_confirmed": best.get("confirmed") is True,
               "policy_tflops": policy and policy.get("tflops"),
               "policy_ratio_to_scaled_mm": policy and policy.get("ratio_to_cublas"),
               "policy_confirmed": bool(policy and policy.get("confirmed")),
               "ratio_to_policy": ratio,
               "ab": None if doc is None else {m["module"]: {k: m.get(k) for k in ("status", "ms", "tflops",
                                                                                 "ratio_to_cublas")}
                                                for m in doc["modules"]},
               "ab_clocks": None if doc is None else doc.get("clocks")}
        out.append(row)
        if ratio is not None and ratio > MERGE_EDGE:
            merge.append(rep.get("path") or rep["candidates"])
    first = _reports(run)[0]
    return {"gpu": first.get("gpu"), "date": first.get("date"), "timer": first.get("timer"), "rows": out,
            "merge": merge, "merge_edge": MERGE_EDGE}


def door_rows(door_files: list[Path], tuned: set) -> list[dict]:
    """One row per ``door_<recipe>_<MxNxK>.json`` (``ab_rounds.py``'s: the rules' module first, the database's
    second): its ratio over the rules' module timed in the same rounds, and each one's ratio to torch's;
    ``held_out`` where the shape is not one the tuner ran (``tuned``: (recipe, M, N, K))."""
    out = []
    for f in door_files:
        doc = json.loads(f.read_text())
        recipe, asked = f.stem.split("_")[1], [int(x) for x in f.stem.split("_")[2].split("x")]
        M, N, K = doc["shape"]
        if asked != [M, N, K]:  # a runtime-M module from the cache keeps the M it was first built at
            print(f"{f.name}: timed at {M}x{N}x{K}, not the case's {'x'.join(map(str, asked))}: left out",
                  file=sys.stderr)
            continue
        rules, tuned_mod = doc["modules"]
        out.append({"recipe": recipe, "M": M, "N": N, "K": K, "held_out": (recipe, M, N, K) not in tuned,
                    "correct": rules["check"]["ok"] and tuned_mod["check"]["ok"], "tflops": tuned_mod.get("tflops"),
                    "ratio_to_scaled_mm": tuned_mod.get("ratio_to_cublas"),
                    "peer_ratios": {"torch_scaled_mm": tuned_mod.get("ratio_to_cublas"),
                                    "rules_module": tuned_mod.get("ratio_to_first")},
                    "rules_ratio_to_scaled_mm": rules.get("ratio_to_cublas"),
                    "ratio_to_rules": tuned_mod.get("ratio_to_first"),
                    "round_ratio_to_rules_quartiles": tuned_mod.get("round_ratio_to_first_quartiles"),
                    "tuned_knobs": tuned_mod.get("knobs"), "rules_knobs": rules.get("knobs"),
                    "clocks": doc.get("clocks"), "timer": doc.get("timer")})
    return out


def ab_rows(ab_files: list[Path], baseline: str) -> dict:
    """Issue 32's rows from ``ab_rounds.py`` files of scaled fp8 modules (one shape each, the group's first module
    the baseline): one row per module with its recipe, shape, knobs, check, TFLOPS, ratio to ``torch._scaled_mm``
    and, in ``peer_ratios``, ``baseline``'s time over its own (the same rounds), with the run's GPU and clocks."""
    out, gpu, dates = [], None, []
    for f in ab_files:
        doc = json.loads(f.read_text())
        gpu, M, N, K = gpu or doc.get("gpu"), *doc["shape"]
        dates.append(doc.get("date"))
        for i, m in enumerate(doc["modules"]):
            spec = GemmSpec.parse(m["knobs"]["spec"])
            ok = m.get("status") == "ok"
            out.append({"recipe": spec.scales, "M": M, "N": N, "K": K, "module": m["module"], "rung": m["rung"],
                        "baseline": i == 0, "correct": bool(m["check"]["ok"]), "rel_err": m["check"].get("rel_err"),
                        "torch_rel_err": m["check"].get("torch_rel_err"), "tflops": m.get("tflops") if ok else None,
                        "ratio_to_scaled_mm": m.get("ratio_to_cublas") if ok else None,
                        "peer_ratios": {"torch_scaled_mm": m.get("ratio_to_cublas") if ok else None,
                                        baseline: m.get("ratio_to_first") if ok and i else None},
                        "round_ratio_quartiles": m.get("round_ratio_to_first_quartiles") if i else None,
                        "knobs": {k: v for k, v in m["knobs"].items() if k not in ("dtype", "arch", "spec")},
                        "clocks": doc.get("clocks"), "timer": doc.get("timer"), "file": f.name})
    return {"gpu": gpu, "date": max(filter(None, dates), default=None), "baseline": baseline, "rows": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("policy", help="each candidate folder's policy candidate, one line each (build box)")
    p.add_argument("folders", nargs="+", type=Path)
    g = sub.add_parser("ab", help="each folder's best against its policy candidate, in the same rounds (GPU box)")
    g.add_argument("policy_list", type=Path)
    g.add_argument("--out", type=Path, required=True)
    d = sub.add_parser("door", help="scaled_mm's modules from the rules and from the database (build box)")
    d.add_argument("out", type=Path)
    d.add_argument("cases", nargs="+", help="recipe:MxNxK")
    q = sub.add_parser("abpairs", help="door's pairs in the same rounds (GPU box)")
    q.add_argument("pairs", type=Path)
    q.add_argument("--out", type=Path, required=True)
    b = sub.add_parser("abrows", help="the rows of ab_rounds.py files, each group's first module the baseline")
    b.add_argument("ab", nargs="+", type=Path)
    b.add_argument("--baseline", required=True, help="what the first module of each group is (a peer_ratios key)")
    b.add_argument("--commit", required=True, help="the commit the modules were built at")
    b.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("rows", help="the rows, with the A/B files of the pairs")
    r.add_argument("run", type=Path)
    r.add_argument("ab", nargs="*", type=Path)
    r.add_argument("--door", nargs="*", type=Path, default=[], help="abpairs' door_*.json files")
    r.add_argument("--commit", required=True, help="the commit the candidates and modules were built at")
    r.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "policy":
        print("\n".join(policies(a.folders)))
        return 0
    if a.cmd == "ab":
        ab(a.policy_list, a.out)
        return 0
    if a.cmd == "door":
        print("\n".join(door(a.out, a.cases)))
        return 0
    if a.cmd == "abpairs":
        ab_pairs(a.pairs, a.out)
        return 0
    if a.cmd == "abrows":
        files.write_json(a.out, {**ab_rows(a.ab, a.baseline), "commit": a.commit})
        return 0
    doc = rows(a.run, a.ab)
    tuned = {(r["recipe"], r["M"], r["N"], r["K"]) for r in doc["rows"]}
    files.write_json(a.out, {**doc, "commit": a.commit, "front_door": door_rows(a.door, tuned)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
