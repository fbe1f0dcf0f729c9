"""Cost to the baseline's accuracy, seed by seed, from a `bppo compare` folder.

`bppo compare` sets one target for all seeds (the baseline's mean final accuracy less a tolerance). When the baseline
moves little, that target can sit below some seeds' starting accuracy and every "cost to target" is 0. This script
gives each seed its own target: the baseline's final accuracy *for that seed* on the cheap subset evaluations
(`train.eval_subset`, the same problems every time) less `--tolerance`, and reports each variant's cost until its
subset evaluations first reached it, and until they reached it twice in a row (held).

    python benchmarks/reports/seed_targets.py runs/tail-e2 --baseline ppo --unit decode_steps
"""
import argparse, statistics
from pathlib import Path
from bppo_kit.report import cost_to_target, runs_of


def folder_args(doc: str) -> argparse.ArgumentParser:
    "The arguments of a script that reads a compare folder against a baseline: folder, --baseline, --unit, --tolerance"
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--baseline", default="ppo")
    ap.add_argument("--unit", default="decode_steps")
    ap.add_argument("--tolerance", type=float, default=0.01)
    return ap


def main():
    a = folder_args(__doc__).parse_args()
    runs = runs_of(a.folder)
    base = runs.pop(a.baseline)
    print(f"| variant | seed | target (baseline's final subset acc - {a.tolerance:g}) | baseline's {a.unit} "
          f"| final subset acc | {a.unit} to target | vs baseline | {a.unit} to held target | vs baseline |")
    print("|---" * 9 + "|")
    ratios: dict[str, list] = {}
    for name, seeds in [(a.baseline, base), *runs.items()]:
        for s, run in sorted(seeds.items()):
            if s not in base: continue
            target, budget, hit, held, c = cost_to_target(run, base[s], a.unit, a.tolerance)
            f = lambda v: "never" if v is None else f"{v:.0f}"
            r = lambda v, b=budget: "–" if v is None else f"{v / b:.2f}x"
            ratios.setdefault(name, []).append((hit, held, budget))
            print(f"| {name} | {s} | {100 * target:.1f} | {budget:.0f} | {100 * c[-1][1]:.1f} | {f(hit)} | {r(hit)} "
                  f"| {f(held)} | {r(held)} |")
    for name, xs in ratios.items():
        hits = [h / b for h, _, b in xs if h is not None]
        helds = [h / b for _, h, b in xs if h is not None]
        mean = lambda v: f"{statistics.fmean(v):.2f}x" if v else "–"
        print(f"{name}: to target {mean(hits)} ({len(hits)} of {len(xs)} seeds), held {mean(helds)} "
              f"({len(helds)} of {len(xs)} seeds)")


if __name__ == "__main__":
    main()
