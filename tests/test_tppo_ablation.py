"""benchmarks/reports/tppo_ablation.py: the T-PPO ablation table of docs/results/tppo.md, on hand-made run folders."""
import json, sys
from pathlib import Path

import pytest

from bppo_kit.config import Config, apply_overrides, save_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "reports"))
import tppo_ablation as ta  # noqa: E402
from bppo_kit.report import runs_of  # noqa: E402


def fake_run(d: Path, evals: list[tuple], steps: int = 4, ev: float = 0.3, planned: int = 4):
    """A run folder of `planned` steps, `steps` of them done, 10 decode steps each; `evals` are (step, accuracy,
    subset accuracy or None): subset accuracy None makes a subset-only evaluation (5 problems), the subset's accuracy"""
    d.mkdir(parents=True)
    save_config(apply_overrides(Config(), [f"train.steps={planned}"]), d / "config.yaml")
    m = [dict(step=i, wall_s=1.0, rollout_s=0.5, update_s=0.5, trained_tokens=10, generated_tokens=20,
              decode_steps=10, row_steps=40, explained_variance=ev) for i in range(steps)]
    e = [dict(step=s, accuracy=a, problems=10 if sub is not None else 5, subset_accuracy=sub,
              mean_response_tokens=50.0) for s, a, sub in evals]
    (d / "metrics.jsonl").write_text("\n".join(map(json.dumps, m)))
    (d / "eval.jsonl").write_text("\n".join(map(json.dumps, e)))


@pytest.fixture
def folder(tmp_path):
    # the baseline ends at 0.70 on the subset in both seeds: the target is 0.69, its budget 40 decode steps
    for s in (0, 1):
        fake_run(tmp_path / f"ppo-s{s}", [(0, 0.5, 0.5), (2, 0.6, None), (4, 0.7, 0.7)])
    fake_run(tmp_path / "tppo_recipe-s0", [(0, 0.5, 0.5), (2, 0.6, None), (4, 0.70, 0.70)])
    fake_run(tmp_path / "tppo_recipe-s1", [(0, 0.5, 0.5), (2, 0.6, None), (4, 0.70, 0.66)])
    # seed 0 reaches 0.72 on the subset after 2 steps (20 of 40 decode steps); seed 1 never does
    fake_run(tmp_path / "tppo_recipe_nowarm-s0", [(0, 0.5, 0.5), (2, 0.72, None), (4, 0.75, 0.75)], ev=0.5)
    fake_run(tmp_path / "tppo_recipe_nowarm-s1", [(0, 0.5, 0.5), (2, 0.6, None), (4, 0.80, 0.60)], ev=0.1)
    # still running: no full evaluation after its last step
    fake_run(tmp_path / "tppo_recipe_nolm-s0", [(0, 0.5, 0.5), (2, 0.9, None)], steps=3)
    return tmp_path


def test_finished_and_cost_ratio(folder):
    assert ta.finished(folder / "ppo-s0") and not ta.finished(folder / "tppo_recipe_nolm-s0")
    assert ta.cost_ratio(folder / "tppo_recipe_nowarm-s0", folder / "ppo-s0") == pytest.approx(0.5)
    assert ta.cost_ratio(folder / "tppo_recipe_nowarm-s1", folder / "ppo-s1") is None
    # the baseline against itself: its last evaluation, the whole budget
    assert ta.cost_ratio(folder / "ppo-s0", folder / "ppo-s0") == pytest.approx(1.0)


def test_table_rows(folder):
    per = ta.ablation(runs_of(folder), "ppo")
    assert "tppo_recipe_nolm" not in per  # the unfinished run is left out
    assert per["tppo_recipe_nowarm"][0]["ev"] == pytest.approx(0.5)
    lines = ta.table(per, "ppo", "tppo_recipe")
    assert [l.split("|")[1].strip() for l in lines[2:]] == ["`ppo`", "`tppo_recipe`", "`tppo_recipe_nowarm`"]
    row = lines[-1].split("|")
    assert row[2].strip() == "`algo.tppo.value_warmup=0`"  # its overrides beyond the recipe's
    assert row[4].strip() == "77.5 (75.0, 80.0)"
    assert row[6].strip() == "0.50x in 1 of 2 (0.50x, never)"
    # paired with the recipe: +5 and +10 points, mean 7.5, half-width 12.706 * stdev(5, 10) / sqrt(2)
    assert row[9].strip() == "+7.5 ± 31.8"
    assert lines[3].split("|")[9].strip() == "—"  # the reference against itself


def test_figure_has_a_line_per_variant(folder, tmp_path):
    per = ta.ablation(runs_of(folder), "ppo")
    fig = ta.figure(per, "ppo", "tppo_recipe")
    ax1, ax2 = fig.axes
    assert [t.get_text() for t in ax1.get_yticklabels()] == ["tppo_recipe_nowarm", "tppo_recipe", "ppo"]
    fig.savefig(tmp_path / "abl.png")
    assert (tmp_path / "abl.png").stat().st_size > 1000
