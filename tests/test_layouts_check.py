"""``benchmarks/layouts_check.py`` on the CPU: its cases, the pack that serves them, the items of
its isolated checks, and the arithmetic of its summary on made-up rows. (Running it is a GPU
benchmark: ``python3 benchmarks/layouts_check.py run``.)"""


import pytest

from gemm_ladder.core.spec import GemmSpec

from .conftest import benchmark_script


@pytest.fixture(scope="module")
def lc():
    return benchmark_script("layouts_check")


def test_the_checks_cover_every_layout_and_dtype_at_odd_shapes(lc):
    doc = lc.plan()
    got = {(c["layout"], c["dtype"]) for c in doc["checks"]}
    assert got == {(lay, d) for lay in ("KK", "KN", "MK", "MN") for d in ("float16", "bfloat16")}
    for c in doc["checks"]:
        assert all(c[x] % 8 == 0 for x in "MNK")  # what TMA reads an MN-major operand at
        assert c["M"] % 128 and c["N"] % 64 and c["K"] % 64  # partial tiles in every dimension


def test_the_backward_shapes_are_dx_and_dw_of_a_training_step(lc):
    """dX = dY . W: [tokens, k_in] from dY [tokens, n_out] and W [n_out, k_in] (reduced over n_out);
    dW = dY^T . X: [n_out, k_in], reduced over the tokens."""
    assert lc.backward_shapes(14336, 4096, 2048) == {"dX_NN": (2048, 4096, 14336), "dW_TN": (14336, 4096, 2048)}
    doc = lc.plan()
    assert len(doc["timing"]) == len(lc.WEIGHTS) * len(lc.TOKENS) * 2
    assert {t["layout"] for t in doc["timing"] if t["op"] == "dX_NN"} == {"KN"}
    assert {t["layout"] for t in doc["timing"] if t["op"] == "dW_TN"} == {"MN"}


def test_the_pack_requests_build_a_module_for_every_case(lc):
    doc = lc.plan()
    built = {(req["layouts"][0], req["dtypes"][0], req["epilogues"][0], shape)
             for req in lc.pack_requests(doc) for shape in req["shapes"]}
    for c in doc["checks"] + doc["timing"]:
        assert (lc.LAYOUTS[c["layout"]], c["dtype"], "none", (c["M"], c["N"], c["K"])) in built
    g = doc["grad"]
    rows = g["batch"] * g["seq"]
    assert (("K", "K"), g["dtype"], "bias", (rows, g["n_out"], g["k_in"])) in built  # the forward, with its bias
    assert (("K", "N"), g["dtype"], "none", (rows, g["k_in"], g["n_out"])) in built  # dX
    assert (("M", "N"), g["dtype"], "none", (g["n_out"], g["k_in"], rows)) in built  # dW


def test_items_round_trip_and_specs(lc):
    case = {"layout": "MN", "dtype": "bfloat16", "M": 384, "N": 512, "K": 272}
    assert lc.parse_item(lc.item_of("check", case)) == ("check", "MN", "bfloat16", (384, 512, 272))
    assert lc.spec_of_case("KN", "float16") == GemmSpec(b_major="N")
    assert lc.spec_of_case("KK", "bfloat16", bias=True) == GemmSpec.with_bias("bfloat16")


def test_the_summary_counts_shapes_below_the_bar(lc):
    rows = [{"op": "dX_NN", "kernel_ratio": 1.1, "call_ratio": 1.0},
            {"op": "dX_NN", "kernel_ratio": 0.85, "call_ratio": 0.9},
            {"op": "dW_TN", "kernel_ratio": None, "call_ratio": None}]  # a wrong module: not timed
    s = lc.summary(rows, [{"status": "ok"}, {"status": "wrong"}], {"status": "ok"})
    assert (s["checks_ok"], s["checks"], s["grad_ok"]) == (1, 2, True)
    assert s["dX_NN"]["below_bar"] == 1 and s["dX_NN"]["min_kernel_ratio"] == 0.85
    assert abs(s["dX_NN"]["geomean_kernel_ratio"] - (1.1 * 0.85) ** 0.5) < 1e-12
    assert s["dW_TN"]["below_bar"] == 1 and s["dW_TN"]["geomean_kernel_ratio"] is None


def test_run_names_its_results_file_for_the_issue(lc, tmp_path):
    with pytest.raises(SystemExit):
        lc.main(["run", str(tmp_path), "--out", str(tmp_path / "backward.json")])


def test_run_without_a_gpu_says_so_and_writes_nothing(lc, tmp_path, capsys):
    out = tmp_path / "layouts_check.json"
    assert lc.run(tmp_path, out) == 2
    assert "no GPU" in capsys.readouterr().err and not out.exists()
