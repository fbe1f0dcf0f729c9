"""Runs that stop on a budget (`train.budget`, `train.budget_unit`) and `bppo compare --budget`: each run stops at the
first step whose running total of the unit reaches the budget, gets its final evaluation and checkpoint there, resumes
to the same step, and a comparison gives every variant the baseline's cost for the same seed."""
import itertools, subprocess
from pathlib import Path
import pytest
from conftest import bppo_cmd, ROOT
from bppo_kit.compare import compare
from bppo_kit.config import ConfigError, data_dir, get_config, load_config
from bppo_kit.runs import load_trainer_state, read_jsonl_rows
from bppo_kit.trainer import train

HAVE_TINY = (data_dir() / "tiny_policy" / "config.json").exists()
needs_tiny = pytest.mark.skipif(not HAVE_TINY, reason="the shipped tiny policy is missing (run `make sft`)")
SMALL = ["train.prompts_per_step=4", "rollout.group_size=4", "data.eval_size=2", "rollout.max_new_tokens=120"]

def totals(run: Path, unit: str) -> list[float]:
    "The running totals of `unit` over a run's metric rows"
    return list(itertools.accumulate(r[unit] for r in read_jsonl_rows(run / "metrics.jsonl")))

def cfg_of(out: Path, *extra: str):
    return get_config("cpu-demo", overrides=SMALL + list(extra) + [f"train.out={out}"])

@needs_tiny
def test_budget_run_ends_at_the_first_step_that_reaches_it(tmp_path):
    "Stops at the first step whose total reached the budget, evaluated in full and checkpointed; resume: nothing"
    run = tmp_path / "b"
    ov = ["train.steps=8", "train.budget=1500", "train.budget_unit=generated_tokens", "train.eval_every=1",
          "train.eval_subset=1"]
    s = train(cfg_of(run, *ov), progress=False)
    spent = totals(run, "generated_tokens")
    assert spent[-1] >= 1500 and all(x < 1500 for x in spent[:-1]) and len(spent) < 8, spent
    assert (s["stopped"], s["steps"], s["spent"]) == ("budget", len(spent), spent[-1])
    evals = read_jsonl_rows(run / "eval.jsonl")
    # the subset (one problem) between, the whole eval set (two) at step 0 and at the step the budget ran out
    assert [(e["step"], e["problems"]) for e in evals] == ([(0, 2)] + [(k, 1) for k in range(1, len(spent))]
                                                           + [(len(spent), 2)])
    state = load_trainer_state(run / "checkpoint")
    assert state["step"] == len(spent)
    rows = read_jsonl_rows(run / "metrics.jsonl")
    again = train(cfg_of(run, *ov), resume=True, progress=False)
    assert (again["stopped"], again["steps"], again["spent"]) == ("budget", len(spent), spent[-1])
    assert read_jsonl_rows(run / "metrics.jsonl") == rows and read_jsonl_rows(run / "eval.jsonl") == evals
    assert load_trainer_state(run / "checkpoint")["save_id"] == state["save_id"]  # not saved again

@needs_tiny
def test_a_resumed_budget_run_stops_where_the_uninterrupted_one_does(tmp_path):
    "The budget counts the rows written before a resume: the two halves end at the uninterrupted run's step"
    ov = ["train.steps=8", "train.budget=200"]  # decode steps: two or three steps of this policy (each at most 120)
    whole = train(cfg_of(tmp_path / "whole", *ov), progress=False, evaluate_every=False)
    half = train(cfg_of(tmp_path / "halves", *ov), progress=False, evaluate_every=False, stop_after=1)
    assert (half["stopped"], half["steps"]) == (None, 1)  # stopped early, not finished
    rest = train(cfg_of(tmp_path / "halves", *ov), resume=True, progress=False, evaluate_every=False)
    assert whole["stopped"] == rest["stopped"] == "budget" and 1 < whole["steps"] < 8
    assert (rest["steps"], rest["spent"]) == (whole["steps"], whole["spent"])
    assert totals(tmp_path / "halves", "decode_steps") == totals(tmp_path / "whole", "decode_steps")

@needs_tiny
def test_a_unit_the_engine_does_not_count_is_one_line(tmp_path):
    "HF's `generate` counts no decode steps: a one-line error before the first step; generated tokens it counts"
    with pytest.raises(ConfigError, match="train.budget_unit: the hf engine does not count decode_steps") as e:
        train(cfg_of(tmp_path / "hf", "rollout.engine=hf", "train.budget=100"), progress=False)
    assert "\n" not in str(e.value) and not (tmp_path / "hf" / "metrics.jsonl").exists()
    s = train(cfg_of(tmp_path / "hf2", "rollout.engine=hf", "train.budget=1", "train.budget_unit=generated_tokens",
                     "train.steps=3"), progress=False, evaluate_every=False)
    assert (s["stopped"], s["steps"]) == ("budget", 1)

@needs_tiny
def test_compare_gives_every_variant_the_baselines_cost_of_its_seed(tmp_path):
    "Each seed's BPPO run gets that seed's GRPO total of generated tokens; the report has the table and the figure"
    base = get_config("cpu-demo", overrides=SMALL + ["train.steps=2"])
    rep = compare(base, ["grpo", "bppo"], [0, 1], tmp_path, progress=False, budget="generated_tokens", max_steps=5)
    spent = [totals(tmp_path / f"grpo-s{s}", "generated_tokens")[-1] for s in (0, 1)]
    assert spent[0] != spent[1] and rep["budget"] == dict(unit="generated_tokens", baseline_totals=spent)
    for s in (0, 1):
        c = load_config(tmp_path / f"bppo-s{s}" / "config.yaml")
        assert (c.train.budget, c.train.budget_unit, c.train.steps) == (spent[s], "generated_tokens", 5)
        mine = totals(tmp_path / f"bppo-s{s}", "generated_tokens")
        assert mine[-1] >= spent[s] > max(mine[:-1], default=0) or len(mine) == 5, (mine, spent[s])
        assert read_jsonl_rows(tmp_path / f"bppo-s{s}" / "eval.jsonl")[-1]["step"] == len(mine)
    md = (tmp_path / "report.md").read_text()
    verdicts = md[md.index("## Verdicts"):md.index("## Equal cost: generated tokens")]
    assert "| grpo |" in verdicts and "| bppo |" in verdicts and "(baseline)" in verdicts
    # the others' final accuracy is their accuracy at grpo's cost: the per-seed values the report pairs
    finals = {s: read_jsonl_rows(tmp_path / f"bppo-s{s}" / "eval.jsonl")[-1]["accuracy"] for s in (0, 1)}
    assert rep["arms"]["bppo"]["final_accuracy"]["values"] == [finals[0], finals[1]]
    assert (tmp_path / "equal_cost.png").stat().st_size > 1000
    rows = {p: p.read_text() for p in sorted(tmp_path.glob("*-s*/metrics.jsonl"))}
    compare(base, ["grpo", "bppo"], [0, 1], tmp_path, progress=False, budget="generated_tokens", max_steps=5)
    assert {p: p.read_text() for p in rows} == rows  # every run finished: none trained again

def test_cli_budget_flag_errors_are_one_line():
    for args, msg in [(["--budget", "tokens"], "--budget: must be one of decode_steps, generated_tokens"),
                      (["--max-steps", "9"], "--max-steps: caps the runs on a budget")]:
        r = subprocess.run(bppo_cmd() + ["compare", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert r.returncode == 2 and msg in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr

@needs_tiny
def test_a_budget_in_predicted_gpu_seconds(tmp_path):
    "Each row priced as it is written (what `bppo cost` says of that step in turn); the run ends where the sum does"
    from bppo_kit.cost import predict_run
    run = tmp_path / "g"
    probe = train(cfg_of(tmp_path / "probe", "train.steps=3", "train.budget_unit=gpu_s", "train.price_gpu=A100"),
                  progress=False, evaluate_every=False)
    per_step = [r["gpu_s"] for r in read_jsonl_rows(tmp_path / "probe" / "metrics.jsonl")]
    assert probe["steps"] == 3 and all(g > 0 for g in per_step)
    # the same steps priced afterwards by the cost model, in turn, for the same model and GPU
    after = predict_run(tmp_path / "probe", model="Qwen/Qwen2.5-1.5B-Instruct", gpu="A100")["steps"]
    assert per_step == pytest.approx([s["gpu_s"] for s in after], rel=1e-12)
    budget = per_step[0] + per_step[1] / 2  # reached during the second step
    s = train(cfg_of(run, "train.steps=3", "train.budget_unit=gpu_s", "train.price_gpu=A100",
                     f"train.budget={budget!r}"), progress=False, evaluate_every=False)
    assert (s["stopped"], s["steps"]) == ("budget", 2) and s["spent"] == pytest.approx(sum(per_step[:2]))


def test_a_price_model_without_a_shape_is_one_line(tmp_path):
    r = subprocess.run(bppo_cmd() + ["train", "--preset", "cpu-demo", "--set", "train.budget_unit=gpu_s", "--set",
                                     "train.price_model=nowhere/none", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2 and "train.price_model: no config for 'nowhere/none'" in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().count("\n") == 0, r.stderr


@needs_tiny
@pytest.mark.parametrize("unit,heading", [("decode_steps", "## Equal cost: decoding passes"),
                                          ("gpu_s", "## Equal cost: GPU s (predicted)")])
def test_cli_compare_at_equal_cost(tmp_path, unit, heading):
    "The others run until they have spent the baseline's total of the unit (predicted GPU s: priced as they run)"
    sets = [x for o in SMALL for x in ("--set", o)]
    r = subprocess.run(bppo_cmd() + ["compare", "--algos", "grpo,bppo", "--seeds", "1", "--steps", "1", "--budget",
                                     unit, "--max-steps", "3", "--out", str(tmp_path), "--quiet", *sets],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert heading in r.stdout and ("predicted, not measured" in r.stdout) == (unit == "gpu_s")
    c = load_config(tmp_path / "bppo-s0" / "config.yaml")
    assert c.train.budget == pytest.approx(totals(tmp_path / "grpo-s0", unit)[-1]) and c.train.steps == 3
    spent = totals(tmp_path / "bppo-s0", unit)
    assert (spent[-1] >= c.train.budget or len(spent) == 3) and all(x < c.train.budget for x in spent[:-1])
