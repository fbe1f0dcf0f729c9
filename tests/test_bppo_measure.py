"""BPPO measured the paper's way: the loss scale GRPO trains at, the progress budget, early stop's statistics, and the
comparison's target and extra steps — on the shipped policy, through the real loop."""
import importlib.util
from pathlib import Path
import pytest, torch
from conftest import ROOT
from bppo_kit.bppo import progress_length_cap
from bppo_kit.compare import compare
from bppo_kit.report import accuracy_curve, crossing, subset_curve
from bppo_kit.config import data_dir, get_config
from bppo_kit.runs import read_jsonl_rows
from bppo_kit.trainer import train

HAVE_TINY = (data_dir() / "tiny_policy" / "config.json").exists()
needs_tiny = pytest.mark.skipif(not HAVE_TINY, reason="the shipped tiny policy is missing (run `make sft`)")
SMALL = ["train.prompts_per_step=8", "rollout.group_size=8", "data.eval_size=4"]

def _bias_module():
    study = ROOT / "benchmarks" / "studies" / "early_stop_bias.py"
    spec = importlib.util.spec_from_file_location("early_stop_bias", study)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

def test_early_stop_statistics_against_the_full_group():
    "The issue's example: 3 of 8 correct; three correct and one incorrect finish first"
    rw = torch.tensor([[1., 1., 1., 0., 0., 0., 0., 0.], [1., 1., 1., 1., 1., 1., 1., 1.]])
    ln = torch.tensor([[3, 4, 5, 6, 20, 21, 22, 23], [5] * 8])
    (g,) = _bias_module().group_view(rw, rw.bool(), ln)  # the all-correct group is no mixed group
    assert (g["acc_full"], g["acc_early"], g["kept"]) == (0.375, 0.75, 4)
    assert g["adv_full"] == pytest.approx([3.873, -3.873], abs=1e-3)
    assert g["adv_early"] == pytest.approx([1.732, -1.732], abs=1e-3)
    assert (g["tokens_full"], g["tokens_early"]) == (104, 18 + 4 * 6)  # the cancelled four ran 6 tokens each

def _first_row(tmp_path: Path, name: str, extra: list[str]) -> dict:
    cfg = get_config("cpu-demo", overrides=SMALL + extra + ["train.steps=1", f"train.out={tmp_path / name}"])
    train(cfg, progress=False, evaluate_every=False)
    return read_jsonl_rows(tmp_path / name / "metrics.jsonl")[0]

@needs_tiny
def test_parity_gives_grpo_gradient_scale(tmp_path):
    "Step 0 of GRPO and BPPO samples one rollout: with `algo.bppo.loss_scale=grpo` their pre-clip norms are alike"
    grpo = _first_row(tmp_path, "grpo", ["algo.name=grpo"])
    own = _first_row(tmp_path, "own", ["algo.name=bppo"])
    par = _first_row(tmp_path, "parity", ["algo.name=bppo", "algo.bppo.loss_scale=grpo"])
    assert grpo["generated_tokens"] == own["generated_tokens"] == par["generated_tokens"]  # the same rollout
    assert own["trained_tokens"] == par["trained_tokens"] > 0 and 0 < par["parity_factor"] < 1
    assert 1 / 3 < par["grad_norm"] / grpo["grad_norm"] < 3
    assert own["grad_norm"] > par["grad_norm"]  # the own scale is the larger one
    assert {r["grad_clipped"] for r in (grpo, own, par)} <= {0.0, 1.0}

@needs_tiny
def test_progress_length_cap_in_the_loop(tmp_path):
    "With no exploration and no slack, step 1's budget is ~ step 0's correct lengths, and it is logged"
    ov = SMALL + ["algo.name=bppo", "algo.bppo.length_cap=progress", "algo.bppo.length_explore=0",
                  "algo.bppo.length_slack=0", "train.steps=2", f"train.out={tmp_path / 'p'}"]
    train(get_config("cpu-demo", overrides=ov), progress=False, evaluate_every=False)
    rows = read_jsonl_rows(tmp_path / "p" / "metrics.jsonl")
    assert rows[0]["max_new_tokens"] == 160  # nothing seen yet: the configured budget
    assert rows[0]["accuracy"] > 0 and rows[1]["max_new_tokens"] < 160
    assert progress_length_cap(1, 2, [10] * 3, 160, 0.0, 0.0) == 16  # (the rule's floor)

@needs_tiny
def test_compare_target_is_the_baselines_final_accuracy(tmp_path):
    "`bppo@3` runs more steps than the baseline; the target is the same seed's baseline final accuracy less 5 points"
    base = get_config("cpu-demo", overrides=["train.steps=2", "train.prompts_per_step=4", "rollout.group_size=4",
                                             "data.eval_size=4", "train.eval_every=1", "train.eval_subset=2"])
    rep = compare(base, ["grpo_seq", "bppo@3"], [0], tmp_path, progress=False, tolerance=0.05)
    assert rep["arms"]["bppo@3"]["steps"]["mean"] == 3 and rep["design"]["tolerance"] == 0.05
    run = rep["per_run"]["bppo@3"]["0"]
    # full evaluations at steps 0 and 3 only; the subset ones (every step) make the longer curve
    assert len(accuracy_curve(tmp_path / "bppo@3-s0", "wall_s")) == 2
    assert (run["curve"], run["curve_points"]) == ("subset", 4)
    mine, base = subset_curve(tmp_path / "bppo@3-s0", "wall_s"), subset_curve(tmp_path / "grpo_seq-s0", "wall_s")
    want = crossing(mine, base[-1][1] - 0.05)  # the baseline's final accuracy on the same subset, less 5 points
    assert run["to_target_5pt_wall_s"] == (None if want is None else pytest.approx(want / base[-1][0]))
    evs = read_jsonl_rows(tmp_path / "bppo@3-s0" / "eval.jsonl")
    assert [(e["step"], e["problems"]) for e in evs] == [(0, 4), (1, 2), (2, 2), (3, 4)]
