"""The T-PPO ablation table (and figure) of docs/results/tppo.md, from a `bppo compare` folder.

One row per variant, each number as a mean over seeds with the seeds in brackets: final accuracy (the full
evaluations), final accuracy on the subset evaluations, the decode steps until the subset evaluations first reached
the baseline's final subset accuracy *for the same seed* less `--tolerance` (`bppo_kit.report.cost_to_target`, here
as a ratio to the baseline's total), the critic's explained variance and the response length (both `run_summary`'s). The
last column pairs each variant's final accuracy with the reference variant's seed by seed (same seed: same starting
policy and prompts) and gives the mean difference with its 95% t-interval (`bppo_kit.stats.paired`). The "changed"
column is the variant's `bppo compare` overrides that the reference does not have. Runs that `bppo compare` would
not skip as finished (still in progress) are left out.

    python benchmarks/reports/tppo_ablation.py runs/tail-abl --baseline ppo --reference tppo_recipe \
        --figure docs/images/tppo-tail-ablation-3seeds.png
"""
import argparse, statistics
from pathlib import Path

from bppo_kit.compare import VARIANTS, run_status
from bppo_kit.config import load_config
from bppo_kit.runs import read_jsonl_rows
from bppo_kit.stats import paired as paired_test
from bppo_kit.report import cost_to_target, run_summary, runs_of


def finished(run: Path) -> bool:
    "Whether `bppo compare` would skip `run` as finished, judged by the run's own config (its steps or budget)"
    return (run / "config.yaml").exists() and run_status(run, load_config(run / "config.yaml")) == "finished"


def cost_ratio(run: Path, base: Path, unit: str = "decode_steps", tolerance: float = 0.01) -> float | None:
    "`unit` spent until `run`'s subset evaluations first reached `base`'s final subset accuracy less `tolerance`"
    _, budget, hit, _, _ = cost_to_target(run, base, unit, tolerance)
    return None if hit is None else hit / budget


def ablation(runs: dict[str, dict[int, Path]], baseline: str, unit: str = "decode_steps",
             tolerance: float = 0.01) -> dict[str, dict[int, dict]]:
    "variant -> seed -> accuracy, subset accuracy, cost ratio, critic EV and response tokens (finished runs only)"
    base = {s: run for s, run in runs[baseline].items() if finished(run)}
    out: dict[str, dict[int, dict]] = {}
    for name, seeds in runs.items():
        for s, run in sorted(seeds.items()):
            if s not in base or not finished(run): continue
            m = run_summary(run)
            sub = read_jsonl_rows(run / "eval.jsonl")[-1].get("subset_accuracy")  # the last (full) evaluation's
            out.setdefault(name, {})[s] = dict(
                acc=100 * m["final_accuracy"], ratio=cost_ratio(run, base[s], unit, tolerance),
                sub=100 * sub if sub is not None else None, ev=m["critic_ev"], tokens=m["final_tokens"])
    return out


def changed(name: str, reference: str) -> str:
    "The `bppo compare` overrides of `name` that `reference` does not have"
    if name == reference: return "—"
    ref = set(VARIANTS.get(reference, []))
    extra = [o for o in VARIANTS.get(name, []) if o not in ref]
    return ", ".join(f"`{o}`" for o in extra) or "(not a variant of the reference)"


def _fmt(xs: list, d: int = 1) -> str:
    "Mean, and each seed's value in brackets when there are several"
    v = [x for x in xs if x is not None]
    if not v: return "–"
    per = f" ({', '.join(f'{x:.{d}f}' for x in v)})" if len(v) > 1 else ""
    return f"{statistics.fmean(v):.{d}f}{per}"


def _fmt_ratio(xs: list) -> str:
    "Mean ratio over the seeds that reached the target, how many did, and each seed's"
    hits = [x for x in xs if x is not None]
    head = f"{statistics.fmean(hits):.2f}x" if hits else "never"
    if hits and len(hits) < len(xs): head += f" in {len(hits)} of {len(xs)}"
    per = f" ({', '.join('never' if x is None else f'{x:.2f}x' for x in xs)})" if len(xs) > 1 else ""
    return head + per


def paired(per: dict[str, dict[int, dict]], name: str, reference: str) -> str:
    "Mean seed-by-seed difference of final accuracy from `reference`, ± its 95% half-width"
    if name == reference or not set(per[name]) & set(per.get(reference, {})): return "—"
    c = paired_test({s: r["acc"] for s, r in per[reference].items()}, {s: r["acc"] for s, r in per[name].items()})
    return f"{c['diff']:+.1f} ± {c['ci95'][1] - c['diff']:.1f}" if c["ci95"] else f"{c['diff']:+.1f}"


def _order(per: dict, baseline: str, reference: str) -> list[str]:
    "The variants of `per`: the baseline, the reference, then the rest by name"
    return [n for n in [baseline, reference, *sorted(n for n in per if n not in (baseline, reference))] if n in per]


def table(per: dict[str, dict[int, dict]], baseline: str, reference: str) -> list[str]:
    "The results page's ablation table, the baseline and the reference first"
    lines = ["| variant | changed | seeds | final accuracy % | on the subset % | decode steps to the baseline's "
             "accuracy | critic EV | response tokens | final accuracy vs the reference, paired (95% CI) |",
             "|---" * 9 + "|"]
    for n in _order(per, baseline, reference):
        col = lambda k, n=n: [r[k] for _, r in sorted(per[n].items())]
        what = "(the baseline)" if n == baseline else changed(n, reference)
        lines.append(f"| `{n}` | {what} | {len(per[n])} | {_fmt(col('acc'))} | {_fmt(col('sub'))} | "
                     f"{_fmt_ratio(col('ratio'))} | {_fmt(col('ev'), 2)} | {_fmt(col('tokens'))} | "
                     f"{paired(per, n, reference)} |")
    return lines


def figure(per: dict[str, dict[int, dict]], baseline: str, reference: str):
    "Each seed's final accuracy and cost ratio, one line per variant (a cross: the target never reached)"
    from matplotlib.figure import Figure
    names = _order(per, baseline, reference)[::-1]
    fig = Figure(figsize=(9, 0.45 * len(names) + 1.2))
    ax1, ax2 = fig.subplots(1, 2, sharey=True)
    for y, n in enumerate(names):
        rs = list(per[n].values())
        acc, ratio = [r["acc"] for r in rs], [r["ratio"] for r in rs]
        ax1.plot(acc, [y] * len(acc), "o", mfc="none", color="C0")
        ax1.plot([statistics.fmean(acc)], [y], "|", ms=14, mew=2, color="C0")
        hits = [x for x in ratio if x is not None]
        ax2.plot(hits, [y] * len(hits), "o", mfc="none", color="C1")
        ax2.plot([1.05] * (len(ratio) - len(hits)), [y] * (len(ratio) - len(hits)), "x", color="C3")
        if hits: ax2.plot([statistics.fmean(hits)], [y], "|", ms=14, mew=2, color="C1")
    ref = [r["acc"] for r in per.get(reference, {}).values()]
    if ref: ax1.axvline(statistics.fmean(ref), ls=":", color="grey", lw=1)
    ax2.axvline(0.6, ls="--", color="k", lw=1, label="0.6x")
    ax1.set_yticks(range(len(names)), names, fontsize=8)
    ax1.set_xlabel("final accuracy % (o: a seed, |: the mean)")
    ax2.set_xlabel(f"decode steps to {baseline}'s accuracy, x {baseline}'s (x: never)")
    ax2.legend(fontsize=7)
    for a in (ax1, ax2): a.grid(alpha=.3)
    fig.tight_layout()
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--baseline", default="ppo")
    ap.add_argument("--unit", default="decode_steps")
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--reference", default="tppo_recipe")
    ap.add_argument("--figure", type=Path, help="where to save the figure (png)")
    a = ap.parse_args()
    runs = runs_of(a.folder)
    if a.baseline not in runs: raise SystemExit(f"no {a.baseline}-sN runs in {a.folder}")
    per = ablation(runs, a.baseline, a.unit, a.tolerance)
    print("\n".join(table(per, a.baseline, a.reference)))
    if a.figure: figure(per, a.baseline, a.reference).savefig(a.figure, dpi=80)


if __name__ == "__main__":
    main()
