"""A `bppo compare` folder's table with 95% confidence intervals over seeds, paired against the baseline.

`bppo compare`'s report gives every metric with its interval, paired differences and verdicts; this script draws the
results page's compact table and figure of a family of variants: each column as mean ± the half-width of the 95%
Student-t interval over the seeds (`bppo_kit.stats`), and each variant's difference from the baseline *seed by seed*
(the same seed starts from the same policy and draws the same prompts, so the paired difference is the fair one),
with its own interval. Per run the numbers are `bppo_kit.compare.run_summary`'s against the same seed's baseline run;
the time to target is the training wall time until the run's accuracy curve (linear between full evaluations) first
reached its seed's baseline final accuracy less `--tolerance`. The best variant of each column is marked, with its
margin over the runner-up.

    python benchmarks/reports/seed_ci.py runs/family --baseline grpo --out runs/family/ci.md \
        --figure docs/images/family.png
"""
import argparse, json, statistics
from pathlib import Path

from bppo_kit.report import run_summary, runs_of
from bppo_kit.stats import summarize

# (key of run_summary, column title, scale, which way is better: +1 higher, -1 lower)
COLUMNS = [("final_accuracy", "final acc %", 100, +1), ("final_tokens", "response tokens", 1, -1),
           ("update_s", "update s/step", 1, -1), ("step_s", "step s", 1, -1),
           ("decode_per_step", "decode passes/step", 1, -1), ("time_to_target_s", "time to target s", 1, -1)]


def mean_ci(xs: list[float]) -> tuple[float, float]:
    "Mean and the half-width of its 95% Student-t interval (`bppo_kit.stats.summarize`; 0 for one value)"
    s = summarize(xs)
    return s["mean"], (s["ci95"][1] - s["mean"] if s["ci95"] else 0.0)


def summaries(runs: dict[str, dict[int, Path]], baseline: str, tolerance: float) -> dict:
    "variant -> seed -> run_summary against the seed's baseline run, with decode passes per step and time to target"
    key = f"to_target_{100 * tolerance:g}pt_wall_s"
    out = {}
    for name, seeds in runs.items():
        out[name] = {}
        for s, p in seeds.items():
            base = runs[baseline].get(s)
            r = run_summary(p, base, tolerances=(tolerance,))
            r["decode_per_step"] = r["total_decode_steps"] / r["steps"] if "total_decode_steps" in r else None
            ratio, total = r.get(key), (run_summary(base) if base else {}).get("total_wall_s")
            r["time_to_target_s"] = ratio * total if ratio is not None and total else None
            out[name][s] = r
    return out


def cell(xs: list[float], scale: float) -> str:
    if not xs: return "–"
    m, h = mean_ci([scale * x for x in xs])
    return f"{m:.3g} ± {h:.2g}" if len(xs) > 1 else f"{m:.3g}"


def table(per: dict, baseline: str, seeds: list[int]) -> list[str]:
    "Markdown lines: every column as mean ± 95% half-width over `seeds`; then the paired differences from `baseline`"
    head = " | ".join(t for _, t, _, _ in COLUMNS)
    lines = [f"| variant | {head} | seeds reaching target |", "|---" * (len(COLUMNS) + 2) + "|"]
    best = best_of(per, seeds)
    for name, runs in per.items():
        cells = []
        for k, _, scale, _ in COLUMNS:
            xs = [runs[s][k] for s in seeds if s in runs and runs[s].get(k) is not None]
            c = cell(xs, scale)
            cells.append(f"**{c}**" if best.get(k, (None,))[0] == name else c)
        hit = sum(runs[s].get("time_to_target_s") is not None for s in seeds if s in runs)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {hit} of {sum(s in runs for s in seeds)} |")
    lines += ["", f"Paired by seed, variant minus {baseline} (mean ± 95% half-width):", "",
              f"| variant | Δ final acc (points) | Δ response tokens | update s/step ÷ {baseline}'s | "
              f"step s ÷ {baseline}'s |", "|---|---|---|---|---|"]
    b = per[baseline]
    for name, runs in per.items():
        if name == baseline: continue
        common = [s for s in seeds if s in runs and s in b]
        d_acc = [100 * (runs[s]["final_accuracy"] - b[s]["final_accuracy"]) for s in common]
        d_tok = [runs[s]["final_tokens"] - b[s]["final_tokens"] for s in common]
        r_up = [runs[s]["update_s"] / b[s]["update_s"] for s in common]
        r_st = [runs[s]["step_s"] / b[s]["step_s"] for s in common]
        lines.append(f"| {name} | {cell(d_acc, 1)} | {cell(d_tok, 1)} | {cell(r_up, 1)} | {cell(r_st, 1)} |")
    lines += ["", "Best on each column (bold above), and its margin over the runner-up's mean:", ""]
    for k, title, scale, _ in COLUMNS:
        if k in best:
            name, margin = best[k]
            lines.append(f"- {title}: {name}" + (f", by {scale * margin:.3g}" if margin is not None else ""))
    return lines


def best_of(per: dict, seeds: list[int]) -> dict:
    "column key -> (best variant by mean, its margin over the second best) where at least one variant has the column"
    out = {}
    for k, _, _, way in COLUMNS:
        means = {}
        for name, runs in per.items():
            xs = [runs[s][k] for s in seeds if s in runs and runs[s].get(k) is not None]
            # time to target counts only for variants whose every seed reached it
            if xs and len(xs) == sum(s in runs for s in seeds): means[name] = statistics.fmean(xs)
        if not means: continue
        ranked = sorted(means, key=lambda n: -way * means[n])
        margin = abs(means[ranked[0]] - means[ranked[1]]) if len(ranked) > 1 else None
        out[k] = (ranked[0], margin)
    return out


def figure(per: dict, seeds: list[int], path: Path, baseline: str):
    "Final accuracy (mean and 95% interval) against response tokens, and step seconds split into rollout and update"
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 4))
    ax = fig.subplots(1, 2)
    names = list(per)
    for i, name in enumerate(names):
        runs = [per[name][s] for s in seeds if s in per[name]]
        acc = mean_ci([100 * r["final_accuracy"] for r in runs])
        tok = mean_ci([r["final_tokens"] for r in runs])
        ax[0].errorbar(tok[0], acc[0], xerr=tok[1], yerr=acc[1], fmt="o", color=f"C{i}", capsize=3, label=name)
        roll = statistics.fmean(r["rollout_s"] for r in runs)
        upd = statistics.fmean(r["update_s"] for r in runs)
        ax[1].barh(i, roll, color=f"C{i}", alpha=.45)
        ax[1].barh(i, upd, left=roll, color=f"C{i}")
    ax[0].set_xlabel("eval response tokens (final)")
    ax[0].set_ylabel("final eval accuracy %")
    ax[0].set_title(f"accuracy vs length, mean and 95% interval over {len(seeds)} seeds", fontsize=9)
    ax[0].grid(alpha=.3)
    ax[0].legend(fontsize=7)
    ax[1].set_yticks(range(len(names)), names, fontsize=8)
    ax[1].invert_yaxis()
    ax[1].set_xlabel("s per step: rollout (light) + update (dark); medians, mean of seeds")
    ax[1].grid(alpha=.3, axis="x")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--baseline", default="grpo")
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--out", type=Path, help="write the markdown here (default: print)")
    ap.add_argument("--figure", type=Path, help="write the figure here")
    a = ap.parse_args()
    runs = runs_of(a.folder)
    if a.baseline not in runs: raise SystemExit(f"no {a.baseline}-sN runs in {a.folder}")
    seeds = sorted(runs[a.baseline])
    per = summaries(runs, a.baseline, a.tolerance)
    lines = [f"Seeds {seeds}; target: each seed's {a.baseline} final accuracy less {100 * a.tolerance:g} "
             "point(s); ± is the half-width of the 95% Student-t interval over seeds.", ""]
    lines += table(per, a.baseline, seeds)
    text = "\n".join(lines) + "\n"
    if a.out:
        a.out.write_text(text)
        runs_json = {n: {str(s): r for s, r in v.items()} for n, v in per.items()}
        a.out.with_suffix(".json").write_text(json.dumps(runs_json, indent=1))
    print(text)
    if a.figure: figure(per, seeds, a.figure, a.baseline)


if __name__ == "__main__":
    main()
