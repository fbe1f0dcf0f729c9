"""benchmarks/reports/seed_ci.py: a results page's intervals and paired differences, on hand-made run folders."""
import json, math, sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "reports"))
import seed_ci  # noqa: E402


def test_mean_ci_is_students_t():
    m, h = seed_ci.mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)  # stdev 1, t(0.975, 2) = 4.303
    assert seed_ci.mean_ci([5.0]) == (5.0, 0.0)


def fake_run(d: Path, accs: list[float], step_s: float, update_s: float, tokens: float):
    "A run folder: 4 steps, evaluations (full, 10 problems) after 0, 2 and 4 steps"
    d.mkdir(parents=True)
    m = [dict(step=i, wall_s=step_s, rollout_s=step_s - update_s, update_s=update_s, trained_tokens=100,
              generated_tokens=200, decode_steps=10, row_steps=50) for i in range(4)]
    e = [dict(step=s, accuracy=a, problems=10, mean_response_tokens=tokens, subset_accuracy=a)
         for s, a in zip((0, 2, 4), accs)]
    (d / "metrics.jsonl").write_text("\n".join(map(json.dumps, m)))
    (d / "eval.jsonl").write_text("\n".join(map(json.dumps, e)))


def test_table_pairs_seeds_and_marks_the_best(tmp_path):
    fake_run(tmp_path / "grpo-s0", [0.5, 0.6, 0.70], 4.0, 2.0, 100)
    fake_run(tmp_path / "grpo-s1", [0.5, 0.6, 0.80], 4.0, 2.0, 120)
    fake_run(tmp_path / "fast-s0", [0.5, 0.7, 0.72], 2.0, 0.5, 50)
    fake_run(tmp_path / "fast-s1", [0.5, 0.8, 0.84], 2.0, 0.5, 60)
    fake_run(tmp_path / "slow-s0", [0.5, 0.55, 0.60], 4.0, 2.0, 100)  # never reaches seed 0's 0.69
    fake_run(tmp_path / "slow-s1", [0.5, 0.6, 0.85], 4.0, 2.0, 100)
    runs = seed_ci.runs_of(tmp_path)
    assert set(runs) == {"grpo", "fast", "slow"} and set(runs["fast"]) == {0, 1}
    per = seed_ci.summaries(runs, "grpo", 0.01)
    assert per["fast"][0]["decode_per_step"] == 10
    # each seed's target: its grpo final less a point (0.69, 0.79). grpo reaches its own at 3.9 of 4 steps' 16 s:
    # 0.6 -> 0.70 in steps 2..4 (8 s), 0.69 at 9/10 of the way; fast seed 0 from 0.5 -> 0.7 in steps 0..2 (4 s)
    assert per["grpo"][0]["time_to_target_s"] == pytest.approx(8 + 0.9 * 8)
    assert per["fast"][0]["time_to_target_s"] == pytest.approx(4 * 0.19 / 0.2)
    lines = seed_ci.table(per, "grpo", [0, 1])
    text = "\n".join(lines)
    # paired: fast - grpo = +2 and +4 points: mean 3, half-width 12.706 * stdev(2, 4) / sqrt(2) = 12.706
    row = next(l for l in lines if l.startswith("| fast |") and "÷" not in l and l.count("|") == 6)
    assert row.split("|")[2].strip() == "3 ± 13", row
    assert "| fast | **78 ± 76** |" in text  # the better mean final accuracy is bold
    assert "- update s/step: fast, by 1.5" in text
    assert next(l for l in lines if l.startswith("| slow |")).endswith("| 1 of 2 |")  # one seed of two
