"""The one reader of every file the project reads (``gemm_ladder.core.records``), and the readers built
on it: module manifests, folder manifests, ``pack.json``, the tuning database, measurements and
run files, plan files.

Each reader is thrown missing files, folders, binary files, files cut short, JSON nested too
deep, and (with hypothesis) random JSON and valid documents with one field replaced by random
JSON: only ``records.RecordError`` (or the subclass the reader names) may escape, its message one
line naming the file. ``tests/test_records_cli.py`` does the same through the CLI.
"""

import hashlib
import json
import os
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemm_ladder.compile import batch
from gemm_ladder.core import config, records
from gemm_ladder.core.manifest import MANIFEST_VERSION, ManifestError, manifest_path, read_manifest
from gemm_ladder.serve import kernel_pack
from gemm_ladder.cli import parse_knob
from gemm_ladder.core.records import Check, Int, List, Map, Maybe, Obj, RecordError, Str
from gemm_ladder.serve import tuning_db as db
from gemm_ladder.tune import merge as tune_merge
from gemm_ladder.tune import jobs
from gemm_ladder.tune import space as tune_space
from gemm_ladder.tune.measuring import MEASUREMENTS_FORMAT, RUN_FORMAT

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TVM = "0.27.0.post1"


# -- documents of every format (valid), and the readers -----------------------------------------
def module_files(folder: Path, name: str = "m.so", **manifest) -> Path:
    """A stand-in module and its manifest (``manifest`` overrides fields)."""
    blob = hashlib.sha256(name.encode()).digest() * 8
    so = folder / name
    so.write_bytes(blob)
    man = {"format": MANIFEST_VERSION, "rung": "v9", "shape": [64, 256, 512], "dtype": "float16",
           "arch": "sm_90a", "knobs": {"dtype": "float16", "arch": "sm_90a", "stream_b": False},
           "tvm_version": TVM, "launch": {"grid": ["num_ctas"], "threads": 384, "smem_bytes": 1024,
                                          "persistent": True, "dynamic_m": True},
           "so_bytes": len(blob), "so_sha256": hashlib.sha256(blob).hexdigest(), **manifest}
    manifest_path(so).write_text(json.dumps(man))
    return so


def pack_doc(folder: Path) -> dict:
    so = module_files(folder)
    man = json.loads(manifest_path(so).read_text())
    entry = {"file": so.name, "rung": "v9", "shape": [1, 256, 512], "dtype": "float16", "arch": "sm_90a",
             "knobs": man["knobs"], "dynamic_m": True, "m_range": [1, 64], "m_values": [1, 16, 64],
             "so_bytes": man["so_bytes"], "so_sha256": man["so_sha256"],
             "choice": {"source": "rule", "rule": "weight-streaming", "why": "w"}}
    return {"format": kernel_pack.PACK_FORMAT, "version": kernel_pack.PACK_VERSION, "arch": "sm_90a",
            "modules": [entry]}


def db_entry(**fields) -> dict:
    return {"rung": "v4", "shape": [4096, 4096, 4096], "bucket": [4096, 4096, 4096], "dtype": "float16",
            "arch": "sm_90a", "gpu": "NVIDIA H100 80GB HBM3", "tvm_version": TVM,
            "knobs": {"blk_m": 128, "blk_n": 128}, "tflops": 500.0, "ratio_to_cublas": 0.9, **fields}


def db_doc() -> dict:
    return {"format": db.DB_FORMAT, "version": db.DB_VERSION, "entries": [db_entry()]}


def measurements_doc() -> dict:
    return {"format": MEASUREMENTS_FORMAT, "version": 1, "rung": "v4", "shape": [4096, 4096, 4096],
            "dtype": "float16", "arch": "sm_90a", "tvm_version": TVM, "gpu": {"name": "NVIDIA H100 80GB HBM3"},
            "date": "2026-11-22T05:02:12+00:00", "results": [
                {"id": "c000", "status": "ok", "knobs": {"blk_m": 128, "blk_n": 128}, "tflops": 500.0,
                 "cublas_tflops": 600.0, "ratio_to_cublas": 0.83, "ms": 0.27}]}


def read_pack(folder: Path):
    pk = kernel_pack.KernelPack(folder)
    for e in pk.modules:  # what the front door does with an entry
        pk.find(e["shape"][0] + 3, e["shape"][1], e["shape"][2], e["dtype"], e["arch"])
        pk.check_entry(e)
    return pk


def read_db_strict(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an entry refused is skipped with a warning, the file is refused
        return db.TuningDB(path, strict=True)


def read_db_lenient(path: Path):
    """The build policy's reading: never raises on content, warns and ignores instead."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tdb = db.TuningDB(path)
        db.best_knobs("v4", 4096, 4096, 4096, db=tdb, gpu=None)
    return tdb


def read_folder(folder: Path):
    entries, problems = batch.read_folder_manifest(folder)
    for m in entries:
        assert (folder / m["file"]).resolve().parent == folder.resolve()  # nothing outside the folder
    return entries, problems


def merge_into(tmp_path: Path):
    def merge(path):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tune_merge.merge([path], tmp_path / "merged_db.json")
    return merge


# (file name inside the work folder, a valid document, how to read it, the error it may raise)
READERS = {
    "manifest": ("m.so.json", lambda f: json.loads(manifest_path(module_files(f)).read_text()),
                 lambda f: read_manifest(f / "m.so"), ManifestError),
    "pack": ("pack.json", pack_doc, read_pack, kernel_pack.PackError),
    "db": ("tuning_db.json", lambda f: db_doc(), lambda f: read_db_strict(f / "tuning_db.json"), RecordError),
    "db_lenient": ("tuning_db.json", lambda f: db_doc(), lambda f: read_db_lenient(f / "tuning_db.json"), None),
    "measurements": ("m.json", lambda f: measurements_doc(), lambda f: merge_into(f)(f / "m.json"), RecordError),
    "run": ("r.json", lambda f: {"format": RUN_FORMAT, "reports": [measurements_doc()]},
            lambda f: merge_into(f)(f / "r.json"), RecordError),
    "folder": ("manifest.json", lambda f: {"modules": [{"file": module_files(f).name}]}, read_folder, None),
}


def _work(tmp_path_factory, name: str) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp(name)
    file, make, _, _ = READERS[name]
    doc = make(folder)
    (folder / file).write_text(json.dumps(doc))
    return folder, doc


def _assert_only_record_errors(name: str, folder: Path):
    """Read with the reader of ``name``: fine, or its error type with a one-line message naming
    the file; nothing else."""
    file, _, read, error = READERS[name]
    try:
        read(folder)
    except RecordError as err:
        assert error is not None and isinstance(err, error), (name, repr(err))
        text = str(err)
        assert "\n" not in text and str(folder) in text, text
        return err
    return None


@pytest.mark.parametrize("name", sorted(READERS))
def test_every_reader_reads_its_valid_document(tmp_path_factory, name):
    folder, _ = _work(tmp_path_factory, name)
    assert _assert_only_record_errors(name, folder) is None


# -- the library ---------------------------------------------------------------------------------
@pytest.mark.parametrize("content, words", [
    (None, "does not exist"),
    ("folder", "is a folder"),
    ("fifo", "not a regular file"),  # reading a pipe would wait for a writer forever
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff", "is not text"),
    (b"{\"a\": \x00}", "NUL byte"),
    (b"", "is empty"),
    (b"{\"modules\": [{\"file\": \"a", "cut short"),
    (b"[" * 100_000 + b"]" * 100_000, "nests deeper than 32 levels"),
    (b"{\"a\": " + b"9" * 5000 + b"}", "not valid JSON"),
])
def test_read_json_refuses_with_one_line_naming_the_file_and_the_fix(tmp_path, content, words):
    path = tmp_path / "x.json"
    if content == "folder":
        path.mkdir()
    elif content == "fifo":
        os.mkfifo(path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(RecordError) as err:
        records.read_json(path, "widget file", "write it again")
    text = str(err.value)
    assert words in text and str(path) in text and text.endswith("write it again") and "\n" not in text
    assert err.value.path == path and err.value.fix == "write it again"


def test_the_depth_counter_skips_brackets_in_strings():
    assert records.depth('{"a": ["[[[[", {"b": "]]]}"}]}') == 3
    assert records.depth('"\\"[[["') == 0


SCHEMA = Obj({"modules": List(Obj({"file": records.FILE_NAME, "m_range": Check(List(Int(lo=1), length=2),
                                                                                 lambda r: "decreases" if r[0] > r[1] else None)},
                                  {"choice": Maybe(Obj(optional={"rule": Str()}))}))},
             {"knobs": Map(records.KNOB_VALUE)})


@pytest.mark.parametrize("doc, field, words", [
    ({}, "modules", "is missing"),
    ({"modules": {}}, "modules", "is an object ({}), not a list"),
    ({"modules": [{"file": "a.so", "m_range": ["a", "b"]}]}, "modules[0].m_range[0]", "is a string ('a'), not an int"),
    ({"modules": [{"file": "a.so", "m_range": [0, 4]}]}, "modules[0].m_range[0]", "is 0, less than 1"),
    ({"modules": [{"file": "a.so", "m_range": [1]}]}, "modules[0].m_range", "has 1 items, not 2"),
    ({"modules": [{"file": "a.so", "m_range": [9, 4]}]}, "modules[0].m_range", "decreases"),
    ({"modules": [{"file": "../a.so", "m_range": [1, 4]}]}, "modules[0].file", "not a plain file name"),
    ({"modules": [{"file": "a.so", "m_range": [1, 4], "choice": "rule"}]}, "modules[0].choice",
     "is a string ('rule'), not an object"),
    ({"modules": [], "knobs": {"x": [1]}}, "knobs.x", "not an int, a bool, a number or a name"),
    ({"modules": [], "knobs": {"x": True, "y": 1.5, "z": "snake"}}, None, None),
])
def test_a_schema_names_the_field_and_what_is_wrong(doc, field, words):
    found = records.problem(doc, SCHEMA)
    if field is None:
        assert found is None
        return
    assert found.startswith(f"field {field!r} ") and words in found, found
    with pytest.raises(RecordError) as err:
        records.validate(doc, SCHEMA, "f.json", "the fix")
    assert err.value.field == field and str(err.value) == f"f.json: {found}: the fix"


def test_ints_are_not_bools_and_numbers_are_finite():
    assert records.problem(True, Int()) == "is a bool (True), not an int"
    assert "not a finite number" in records.problem(float("nan"), records.Num())
    assert "not above 0" in records.problem(0, records.Num(positive=True))
    assert records.problem(3, records.Num(positive=True)) is None


# -- one knob-value parser -----------------------------------------------------------------------
@given(st.one_of(st.sampled_from(["4", "-1", "+7", "true", "FALSE", "True", "snake", "sm_90a", "3.5", "a-b", "",
                                  "9" * 40, "x y", "0x10"]),
                 st.text(alphabet="0123456789truefalsTRUEFALS_.x-+ ", max_size=12)))
@settings(max_examples=150, deadline=None)
def test_one_parser_reads_knob_values_for_the_cli_the_space_and_plans(text):
    """``--knob``, ``tune --space`` and plan files give the same value for the same text, or all
    refuse it (a plan kept 'true' as a string, which every rung refuses)."""
    try:
        want = config.parse_knob_value(text, "k")
    except config.ConfigError:
        want = None
    if "," in text or ";" in text or "#" in text or not text.strip() or any(c.isspace() for c in text):
        return  # separators of a space or a plan, not one value
    try:
        cli = parse_knob(f"k={text}")[1]
    except Exception:  # argparse.ArgumentTypeError
        cli = None
    try:
        sp = tune_space.parse_space([f"k={text}"])["k"][0]
    except ValueError:
        sp = None
    try:
        plan = jobs.parse_line(f"v9 64x64x64 k={text}")[0].space["k"][0]
    except jobs.PlanError:
        plan = None
    assert cli == sp == plan == want and type(cli) is type(sp) is type(plan) is type(want), (text, cli, sp, plan)
    if text.strip().lower() in ("true", "false"):
        assert want is (text.strip().lower() == "true")


def test_a_plan_reads_switches_as_bools():
    job, = jobs.parse_plan("v9 4096x4096x4096 stream_b=true,FALSE epi_under=False pipe_depth=4\n")
    assert job.space == {"stream_b": [True, False], "epi_under": [False], "pipe_depth": [4]}
    assert all(type(v) is bool for v in job.space["stream_b"] + job.space["epi_under"])


@pytest.mark.parametrize("line, words", [
    ("v9 4096x4096x4096 pipe_depth=3.5", "'3.5' is neither an int, true/false nor a name"),
    ("v9 0x4096x4096", "positive ints"),
    ("v9 M=128 NK=0x4096", "positive ints"),
    ("v9 4096x4096x4096 =3", "does not start with a knob name"),
    ("v9 4096x4096x4096 pipe_depth=", "no value"),
])
def test_plan_values_that_no_rung_can_take_are_refused_on_their_line(line, words):
    with pytest.raises(jobs.PlanError, match=words) as err:
        jobs.parse_plan(f"# a plan\n{line}\n", source="p.plan")
    assert "p.plan:2" in str(err.value)


@pytest.mark.parametrize("content, words", [
    (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "is not text"),
    (None, "does not exist"),
])
def test_a_plan_file_that_is_not_text_is_a_plan_error(tmp_path, content, words):
    path = tmp_path / "p.plan"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(jobs.PlanError, match=words):
        jobs.read_plan(path)


def test_a_plan_of_too_many_jobs_is_refused():
    ms = ",".join(str(m) for m in range(1, 101))
    nks = ",".join(f"{n}x64" for n in range(64, 64 * 50, 64))
    with pytest.raises(jobs.PlanError, match=f"more than {jobs.MAX_JOBS} jobs"):
        jobs.parse_plan(f"v9 M={ms} NK={nks}")


# -- wrongly typed fields: refused when read, not an AttributeError later -----------------------------
@pytest.mark.parametrize("field, value, words", [
    ("launch", "grid", "field 'launch' is a string ('grid'), not an object"),
    ("launch", {"workspace": {"m_step": 0, "float32_per_m_step": 1, "int32_per_m_step": 1}},
     "field 'launch.workspace.m_step' is 0, less than 1"),
    ("launch", {"cluster": "2"}, "field 'launch.cluster' is a string"),
    ("watchdog", [1], "field 'watchdog' is a list"),
    ("dtype", "float8", "field 'dtype' is 'float8', not one of float16, bfloat16"),
    ("knobs", {"pipe_depth": [4]}, "field 'knobs.pipe_depth' is a list"),
    ("shape", [64, 0, 512], "field 'shape[1]' is 0, less than 1"),
])
def test_a_module_manifest_with_a_wrongly_typed_field_is_refused(tmp_path, field, value, words):
    so = module_files(tmp_path, **{field: value})
    with pytest.raises(ManifestError) as err:
        read_manifest(so)
    assert words in str(err.value) and "re-export" in str(err.value)


@pytest.mark.parametrize("change, words", [
    ({"m_range": ["a", "b"]}, "field 'modules[0].m_range[0]' is a string ('a'), not an int"),
    ({"m_values": [0, 16]}, "field 'modules[0].m_values[0]' is 0, less than 1"),
    ({"m_range": [0, 64]}, "field 'modules[0].m_range[0]' is 0, less than 1"),
    ({"m_range": [64, 1]}, "the first M is above the last"),
    ({"choice": "rule"}, "field 'modules[0].choice' is a string ('rule'), not an object"),
    ({"shape": [1, 256]}, "field 'modules[0].shape' has 2 items, not 3"),
    ({"file": "../m.so"}, "not a plain file name"),
])
def test_pack_json_fields_the_front_door_reads_are_checked_when_the_pack_is_read(tmp_path, change, words):
    """``pack check`` said ok for these, then the front door died with TypeError or
    ZeroDivisionError (``KernelPack.find``) or AttributeError (``front._from_pack``)."""
    doc = pack_doc(tmp_path)
    doc["modules"][0].update(change)
    (tmp_path / "pack.json").write_text(json.dumps(doc))
    with pytest.raises(kernel_pack.PackError) as err:
        kernel_pack.KernelPack(tmp_path)
    assert words in str(err.value) and "pack build" in str(err.value)


def test_a_pack_module_whose_manifest_has_a_bad_launch_is_a_pack_error(tmp_path):
    doc = pack_doc(tmp_path)
    man = manifest_path(tmp_path / "m.so")
    man.write_text(json.dumps({**json.loads(man.read_text()), "launch": "grid"}))
    (tmp_path / "pack.json").write_text(json.dumps(doc))
    pk = kernel_pack.KernelPack(tmp_path)
    with pytest.raises(kernel_pack.PackError, match="field 'launch' is a string"):
        pk.check_entry(pk.modules[0])


@pytest.mark.parametrize("name", ["manifest", "pack", "db", "measurements", "run"])
def test_deeply_nested_json_is_refused_not_a_recursion_error(tmp_path_factory, name):
    folder, doc = _work(tmp_path_factory, name)
    file = READERS[name][0]
    deep = "[" * 50_000 + "]" * 50_000
    text = json.dumps(doc)
    (folder / file).write_text(text[:-1] + f', "deep": {deep}}}')
    err = _assert_only_record_errors(name, folder)
    assert err is not None and "nests deeper than" in str(err)


def test_the_lenient_database_ignores_a_deeply_nested_file_with_a_warning(tmp_path):
    path = tmp_path / "tuning_db.json"
    path.write_text("[" * 50_000 + "]" * 50_000)
    with pytest.warns(UserWarning, match="nests deeper"):
        assert db.TuningDB(path).entries == []


@pytest.mark.parametrize("listed", ["../outside.so", "/etc/passwd", "sub/m.so", ".."])
def test_a_folder_manifest_lists_only_files_inside_the_folder(tmp_path, listed):
    folder = tmp_path / "f"
    folder.mkdir()
    (tmp_path / "outside.so").write_bytes(b"x")
    (folder / "sub").mkdir()
    (folder / "sub" / "m.so").write_bytes(b"x")
    inside = module_files(folder)
    (folder / batch.FOLDER_MANIFEST).write_text(json.dumps({"modules": [{"file": listed}, {"file": inside.name}]}))
    entries, problems = batch.read_folder_manifest(folder)
    assert [e["file"] for e in entries] == [inside.name]
    assert len(problems) == 1 and "not a plain file name" in problems[0]
    paths, _ = batch.modules_in([folder])
    assert paths == [inside]


# -- random and corrupted documents: only the reader's error type escapes ----------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


def _paths(value, at=()):
    """Every place in a JSON document: a tuple of keys and indices."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, at + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, at + (i,))


def _replace(doc, at, new):
    if not at:
        return new
    out = json.loads(json.dumps(doc))
    target = out
    for part in at[:-1]:
        target = target[part]
    target[at[-1]] = new
    return out


@pytest.mark.parametrize("name", sorted(READERS))
@FAST
@given(data=st.data())
def test_a_field_replaced_by_random_json_gives_only_the_readers_error(tmp_path_factory, name, data):
    folder, doc = _work(tmp_path_factory, name)
    at = data.draw(st.sampled_from(list(_paths(doc))))
    new = data.draw(JSON)
    (folder / READERS[name][0]).write_text(json.dumps(_replace(doc, at, new)))
    _assert_only_record_errors(name, folder)


@pytest.mark.parametrize("name", sorted(READERS))
@FAST
@given(data=st.data())
def test_random_bytes_and_cut_or_flipped_documents_give_only_the_readers_error(tmp_path_factory, name, data):
    folder, doc = _work(tmp_path_factory, name)
    text = json.dumps(doc).encode()
    how = data.draw(st.sampled_from(["cut", "flip", "random_json", "bytes"]))
    if how == "cut":
        text = text[: data.draw(st.integers(0, len(text)))]
    elif how == "flip":
        i = data.draw(st.integers(0, len(text) - 1))
        text = text[:i] + bytes([text[i] ^ data.draw(st.integers(1, 255))]) + text[i + 1:]
    elif how == "random_json":
        text = json.dumps(data.draw(JSON)).encode()
    else:
        text = data.draw(st.binary(max_size=64))
    (folder / READERS[name][0]).write_bytes(text)
    _assert_only_record_errors(name, folder)


@FAST
@given(text=st.text(max_size=200) | st.binary(max_size=100).map(lambda b: b.decode("latin-1")))
def test_a_random_plan_gives_jobs_or_a_plan_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("plan") / "p.plan"
    path.write_text(text, errors="surrogateescape")
    try:
        found = jobs.read_plan(path)
    except jobs.PlanError as err:
        assert "\n" not in str(err)
        return
    assert found and all(min(j.shape) >= 1 for j in found)
