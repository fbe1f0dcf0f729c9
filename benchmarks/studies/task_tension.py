"""Does the synthetic task have the tension BPPO needs? A short GRPO run on the shipped policy, watching style and
length.

The failure this guards against (seen in a pilot of an earlier task design): plain GRPO shortened responses by itself,
collapsing to the concise style, which left BPPO nothing to show. This runs the kit's trainer with GRPO in its original
form (per-sequence mean of token losses, `algo.reduction=seq`) and reports the share of verbose samples, mean response
length and batch accuracy over the first and last steps.

    python benchmarks/studies/task_tension.py --steps 60 --json runs/task_tension.json
"""
import argparse, json
from pathlib import Path
from bppo_kit.config import get_config
from bppo_kit.trainer import read_jsonl_rows, train

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reduction", default="seq", choices=["seq", "token", "constant"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/task_tension")
    ap.add_argument("--json", default="runs/task_tension.json")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--summarize", action="store_true", help="only summarize an existing run in --out")
    a = ap.parse_args()
    cfg = get_config("cpu-demo", overrides=[f"train.steps={a.steps}", f"algo.reduction={a.reduction}",
                                            f"train.seed={a.seed}", f"data.seed={a.seed}", f"train.out={a.out}"]
                     + a.overrides)
    if not a.summarize: train(cfg, evaluate_every=False, overwrite=True)
    rows = read_jsonl_rows(Path(a.out) / "metrics.jsonl")
    k = max(1, min(10, len(rows) // 3))
    def avg(rs, key):  # steps without a sample of a style have no accuracy for it
        xs = [r[key] for r in rs if r.get(key) is not None]
        return round(sum(xs) / len(xs), 4) if xs else None
    keys = ("accuracy", "verbose_frac", "response_tokens_mean", "accuracy_verbose", "accuracy_concise")
    summary = {key: {f"first{k}": avg(rows[:k], key), f"last{k}": avg(rows[-k:], key)} for key in keys}
    res = dict(config=dict(steps=a.steps, reduction=a.reduction, seed=a.seed, overrides=a.overrides), summary=summary,
               collapsed_to_concise=summary["verbose_frac"][f"last{k}"] < 0.5 * summary["verbose_frac"][f"first{k}"])
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))

if __name__ == "__main__": main()
