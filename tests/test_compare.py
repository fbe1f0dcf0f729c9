"""`bppo compare` as the harness of verdicts: the report's schema on a real comparison over fresh seeds, the one-line
refusals (another config in the same folder, a confirming design on used seeds), the report rebuilt from the folder,
and the order of interleaved runs."""
import json, statistics, subprocess
import pytest
from scipy import stats as sps
from conftest import ROOT, bppo_cmd
from bppo_kit import compare as C
from bppo_kit import report as R
from bppo_kit.config import data_dir, get_config

needs_tiny = pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(),
                                reason="the shipped tiny policy is not in data/")
SMALL = ["train.prompts_per_step=4", "rollout.group_size=4", "data.eval_size=8", "rollout.max_new_tokens=80"]
ARM = {"seeds", "values", "mean", "sd", "ci95", "n"}
CONTRAST = {"diff", "ci95", "p", "p_holm", "verdict", "margin"}
DESIGN = {"baseline", "seeds", "kind", "mde80", "units", "interleaved"}


def bppo(*args, timeout=900):
    return subprocess.run(bppo_cmd() + list(map(str, args)), capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def one_line_exit_2(r, msg):
    assert r.returncode == 2 and msg in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr[-2000:]


@needs_tiny
@pytest.mark.slow
def test_cli_report_schema_and_refusals(tmp_path):
    out = tmp_path / "cmp"
    cmd = ["compare", "--preset", "cpu-demo", "--algos", "grpo,bppo", "--seeds", "100-102", "--steps", "2",
           "--set", "train.eval_every=1", "--out", out, "--quiet", *[x for o in SMALL for x in ("--set", o)]]
    r = bppo(*cmd)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["arms"]) == {"grpo", "bppo"} and DESIGN <= set(rep["design"])
    d = rep["design"]
    assert (d["baseline"], d["seeds"], d["kind"], d["interleaved"]) == ("grpo", [100, 101, 102], "choosing", False)
    for arm in rep["arms"].values():
        for metric, s in arm.items():
            assert set(s) == ARM, metric
            if s["n"] > 1:  # the sample SD and the Student-t interval of `values`
                assert s["sd"] == pytest.approx(statistics.stdev(s["values"]), abs=1e-12), metric
                lo, hi = (sps.t.interval(0.95, s["n"] - 1, loc=s["mean"], scale=s["sd"] / s["n"] ** 0.5)
                          if s["sd"] > 0 else (s["mean"], s["mean"]))
                assert s["ci95"] == pytest.approx([lo, hi], abs=1e-9), metric
    assert rep["arms"]["grpo"]["final_accuracy"]["seeds"] == [100, 101, 102]
    for metric, c in rep["contrasts"]["bppo"].items():
        assert CONTRAST <= set(c) and c["verdict"] in ("better", "worse", "equivalent", "inconclusive"), metric
    assert rep["contrasts"]["bppo"]["final_accuracy"]["margin"] == 0.02
    assert (out / "report.md").read_text().count("95% Student-t interval over seeds") == 1
    # the same command with another setting into the same folder: refused before anything trains
    before = {p: p.stat().st_mtime for p in out.glob("*-s*/metrics.jsonl")}
    one_line_exit_2(bppo(*cmd, "--set", "train.lr=2e-4"), "holds a run of another config (train.lr:")
    one_line_exit_2(bppo(*cmd, "--confirm"), "--confirm: seed(s) 100, 101, 102 were used by a choosing design")
    assert {p: p.stat().st_mtime for p in out.glob("*-s*/metrics.jsonl")} == before
    # the report rebuilt from the folder alone says the same; the same command again trains nothing, marks nothing
    r = bppo("compare", "--out", out, "--report-only")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "report.json").read_text())["arms"] == rep["arms"]
    # the same runs against the other arm: its own folder, each paired difference the other way round
    r = bppo("compare", "--out", out, "--report-only", "--baseline", "bppo")
    assert r.returncode == 0 and "Baseline: bppo." in r.stdout, r.stderr[-2000:]
    back = json.loads((out / "vs-bppo" / "report.json").read_text())
    assert back["design"]["baseline"] == "bppo" and list(back["contrasts"]) == ["grpo"]
    assert back["contrasts"]["grpo"]["final_accuracy"]["diffs"] == pytest.approx(
        [-x for x in rep["contrasts"]["bppo"]["final_accuracy"]["diffs"]], abs=1e-12)
    one_line_exit_2(bppo("compare", "--out", out, "--report-only", "--baseline", "ppo"),
                    "--baseline: 'ppo' is not an arm of the design: grpo, bppo")
    r = bppo(*cmd)
    assert r.returncode == 0 and "†" not in r.stdout, r.stderr[-2000:]
    assert {p: p.stat().st_mtime for p in out.glob("*-s*/metrics.jsonl")} == before
    assert len(json.loads((out / "design.json").read_text())["designs"]) == 1
    # a run cut short: the report refuses to read it as finished
    m = out / "bppo-s102" / "metrics.jsonl"
    m.write_text(m.read_text().splitlines()[0] + "\n")
    one_line_exit_2(bppo("compare", "--out", out, "--report-only"), "1 run(s) of the design did not finish")


def test_interleaved_runs_go_seed_by_seed(tmp_path, monkeypatch):
    "With `interleave`, every arm of a seed runs before the next seed; the baseline first within each seed"
    order = []
    monkeypatch.setattr(C, "_train_one", lambda c, first, name, *a: order.append((name, c.train.seed)))
    monkeypatch.setattr(C, "write_report", lambda *a: None)
    base = get_config("cpu-demo")
    C.compare(base, ["grpo", "bppo", "cppo"], [7, 3], tmp_path, interleave=True)
    assert order == [("grpo", 7), ("bppo", 7), ("cppo", 7), ("grpo", 3), ("bppo", 3), ("cppo", 3)]
    order.clear()
    C.compare(base, ["grpo", "bppo"], [7, 3], tmp_path / "b")
    assert order == [("grpo", 7), ("grpo", 3), ("bppo", 7), ("bppo", 3)]
    assert json.loads((tmp_path / "design.json").read_text())["designs"][0]["interleaved"] is True


def test_confirm_names_other_folders(tmp_path, monkeypatch):
    "A confirming design refuses seeds a choosing design used in a folder it names; fresh seeds pass"
    monkeypatch.setattr(C, "_train_one", lambda *a: None)
    monkeypatch.setattr(C, "write_report", lambda *a: None)
    base = get_config("cpu-demo")
    C.compare(base, ["grpo", "bppo_focus"], [0, 1, 2], tmp_path / "choose")
    with pytest.raises(C.ConfigError, match=r"seed\(s\) 2 were used by a choosing design in .*choose"):
        C.compare(base, ["grpo", "bppo_focus"], [2, 3], tmp_path / "confirm", confirm=True,
                  chosen_in=(tmp_path / "choose",))
    C.compare(base, ["grpo", "bppo_focus"], [100, 101], tmp_path / "confirm", confirm=True,
              chosen_in=(tmp_path / "choose",))
    assert C.read_designs(tmp_path / "confirm")[-1]["kind"] == "confirming"


def test_every_recorded_accuracy_has_a_higher_is_better_verdict():
    "Each accuracy a run records (the curve's last point too) gets `worse` when it falls for every seed, never `better`"
    seeds = range(6)
    fall = {"final_accuracy": 0.05, "final_curve_accuracy": 0.05, "final_greedy_accuracy": 0.04,
            "final_pass_at_k": 0.03, "total_wall_s": 10.0}
    base = {s: {k: 0.8 - 0.01 * s if k != "total_wall_s" else 100.0 + s for k in fall} for s in seeds}
    other = {s: {k: v - fall[k] * (1 + 0.1 * s) for k, v in base[s].items()} for s in seeds}
    _, contrasts, _ = R.arms_and_contrasts({"base": base, "other": other}, "base")
    said = {k: contrasts["other"][k]["verdict"] for k in fall}
    assert said == {"final_accuracy": "worse", "final_curve_accuracy": "worse", "final_greedy_accuracy": "worse",
                    "final_pass_at_k": "worse", "total_wall_s": "better"}, said
