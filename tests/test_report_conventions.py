"""Issue 55's one statistics convention in a comparison's report (bppo_kit.report): both tests Holm-adjusted, the
secondary endpoints labelled, the baseline's plateau in one line, and predicted GPU seconds as a prediction with a
band over the cost model's assumptions, not a t-interval."""
import json
import pytest
from bppo_kit.report import gpu_prediction, write_report

GRID = (0.0, 1e-3, 2.5e-3, 5e-3)


def _run(folder, costs: list[int], evals: list[tuple], gpu: tuple | None = None):
    "A finished run: each step's cost (every unit alike), its full evaluations and, priced, a `cost.json`"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(dict(
        step=s, wall_s=d / 100, rollout_s=d / 200, update_s=d / 200, trained_tokens=50, generated_tokens=10 * d,
        decode_steps=d, row_steps=4 * d)) + "\n" for s, d in enumerate(costs)))
    (folder / "eval.jsonl").write_text("".join(json.dumps(dict(
        step=s, accuracy=a, problems=8, samples=4, mean_response_tokens=40)) + "\n" for s, a in evals))
    if gpu:  # (seconds a step, seconds a pass): the band's grid adds each overhead to every pass
        step_s, passes = gpu[0], sum(costs)
        grid = [dict(pass_overhead_s=o, sleep_s=sl, total_s=step_s * len(costs) + o * passes + sl * len(costs))
                for o in GRID for sl in (0.0, 0.1)]
        (folder / "cost.json").write_text(json.dumps(dict(
            steps=[dict(step=s, gpu_s=step_s) for s in range(len(costs))], token_unit="characters",
            band=dict(default=step_s * len(costs), grid=grid, low=grid[0]["total_s"], high=grid[-1]["total_s"]))))
    return folder


def _comparison(tmp_path, priced: bool = True) -> dict:
    "GRPO and a BPPO of as many passes at half GRPO's seconds a step, 3 seeds each"
    runs = {"grpo": {}, "bppo": {}}
    for s, e in enumerate((-0.01, 0.0, 0.012)):
        evals = [(0, 0.2), (2, 0.5), (4, 0.6), (6, 0.65), (8, 0.66 + e)]
        runs["grpo"][s] = _run(tmp_path / f"grpo-s{s}", [100] * 8, evals, (1.0,) if priced else None)
        runs["bppo"][s] = _run(tmp_path / f"bppo-s{s}", [100] * 8, [(r, a - 0.02) for r, a in evals],
                               (0.5,) if priced else None)
    return runs


DESIGN = dict(baseline="grpo", seeds=[0, 1, 2], kind="confirming", interleaved=True, unit="decode_steps",
              margin=0.02, tolerance=0.01)


def test_the_predicted_gpu_contrast_is_a_band_not_an_interval(tmp_path):
    runs = _comparison(tmp_path)
    g = gpu_prediction(runs, "grpo")["arms"]["bppo"]
    # 4 s against 8 s at the default; at 5 ms a pass and 0.1 s a step: (4 + 4 + 0.8) / (8 + 4 + 0.8)
    assert g["ratio"] == pytest.approx(0.5) and g["low"] == pytest.approx(0.5)
    assert g["high"] == pytest.approx(8.8 / 12.8) and g["seeds"] == [0, 1, 2]
    rep = write_report(tmp_path, runs, DESIGN)
    md = (tmp_path / "report.md").read_text()
    row = next(x for x in md.splitlines() if x.startswith("| bppo |") and "band" in x)
    assert row.endswith("| 4 (0.50x, band 0.50–0.69x) |"), row
    assert "| GPU s, predicted (band over cost-model assumptions) |" in md
    assert "overhead of 0, 1, 2.5 or 5 ms and a step's sleep and wake of 0 or 0.1 s" in md
    assert "tiny policy's characters, priced one for one" in md
    # the JSON keeps its keys (the committed reports' readers), and adds the prediction
    assert {"ci95", "verdict"} <= set(rep["contrasts"]["bppo"]["total_gpu_s"])
    assert rep["gpu_prediction"]["arms"]["bppo"]["high"] == pytest.approx(8.8 / 12.8)


def test_the_report_labels_its_endpoints_and_states_one_convention(tmp_path):
    rep = write_report(tmp_path, _comparison(tmp_path, priced=False), DESIGN)
    md = (tmp_path / "report.md").read_text()
    head = next(x for x in md.splitlines() if x.startswith("| arm | primary: final accuracy %"))
    assert head.count("| secondary: ") == 2
    assert "both tests' p-values are Holm-adjusted over the arms" in md and "is the primary endpoint" in md
    assert md.count("## Secondary: ") == 2 and md.count("95% Student-t interval over seeds") == 1
    c = rep["contrasts"]["bppo"]["final_accuracy"]
    assert {"p", "p_holm", "p_tost", "p_tost_holm"} <= set(c) and rep["gpu_prediction"] is None
    assert "GPU s is predicted" not in md  # nothing priced: no note


@pytest.mark.parametrize("margin,said", [(0.01, "unclear"), (0.05, "plateaued")])
def test_the_baseline_plateau_line(tmp_path, margin, said):
    "The baseline's last quarter (600 to 800 passes) gains 0, +1 and +2.2 points over its 3 seeds"
    rep = write_report(tmp_path, _comparison(tmp_path, priced=False), DESIGN, plateau_margin=margin)
    p = rep["plateau"]
    assert p["values"] == pytest.approx([0.0, 0.01, 0.022]) and p["verdict"] == said and p["margin"] == margin
    line = next(x for x in (tmp_path / "report.md").read_text().splitlines() if x.startswith("The baseline's plateau"))
    assert f"**{said}**" in line and "over the last 25% of its decoding passes (3 seed(s))" in line


@pytest.mark.parametrize("goal,said", [(None, "shorter"), ("shorter", "better"), ("longer", "worse")])
def test_a_shorter_response_is_a_measurement_not_better(tmp_path, goal, said):
    "Issue 55's words: a length verdict says shorter or longer, better or worse only where the design wants one"
    runs = _comparison(tmp_path, priced=False)
    for s, run in runs["bppo"].items():  # BPPO's answers about a third shorter than GRPO's 40 tokens
        e = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
        (run / "eval.jsonl").write_text("".join(json.dumps(r | dict(mean_response_tokens=27 + s)) + "\n" for r in e))
    rep = write_report(tmp_path, runs, DESIGN | ({"length_goal": goal} if goal else {}))
    assert rep["contrasts"]["bppo"]["final_tokens"]["verdict"] == said
    md = (tmp_path / "report.md").read_text()
    assert ("Response length is a measurement, not a goal" in md) == (goal is None)
    assert (f"this design wants it {goal}" in md) == (goal is not None)


def test_one_seed_shows_no_spread_rather_than_zero(tmp_path):
    runs = {n: {0: r[0]} for n, r in _comparison(tmp_path, priced=False).items()}
    write_report(tmp_path, runs, DESIGN | dict(seeds=[0]))
    md = (tmp_path / "report.md").read_text()
    assert "final accuracy has no spread to show on one seed" in md and "0.0 points (SD) over seeds" not in md
    full = _comparison(tmp_path / "three", priced=False)
    write_report(tmp_path / "three", full, DESIGN)
    assert "final accuracy varies by 1.1 points (SD) over seeds" in (tmp_path / "three" / "report.md").read_text()
