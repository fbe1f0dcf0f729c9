"""The response lengths and accuracy of a preset's policy on its eval set: where its window sits among the lengths.

    OMP_NUM_THREADS=2 python benchmarks/studies/tail_lengths.py --preset cpu-tail --json runs/tail_lengths.json

Samples `--samples` completions of every eval problem (`data.eval_size=0`: all of them) from the preset's policy with
the kit engine at the training temperature, grades them with the run's reward, and reports the length percentiles
(tokens, EOS not counted), the percentile the preset's `rollout.window` falls at, and accuracy and length by chain
length (the synthetic task's `n_ops`). The `cpu-tail` preset's window was chosen from this (about 1 minute on 2 cores).
"""
import argparse, json
from pathlib import Path
import numpy as np
from bppo_kit.config import get_config
from bppo_kit.core import SamplingParams
from bppo_kit.evaluate import eval_examples, response_tokens
from bppo_kit.policy import load_policy
from bppo_kit.rewards import Task
from bppo_kit.sampler import make_engine

BINS = ((2, 2), (3, 4), (5, 9), (10, 19), (20, 40))

def measure(preset: str, samples: int, seed: int) -> dict:
    "Length percentiles, the window's place among them, and accuracy by chain length"
    cfg = get_config(preset, overrides=["data.eval_size=0"])
    model, tok = load_policy(cfg.model.name_or_path)
    ev = eval_examples(cfg)
    sp = SamplingParams(temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens, seed=seed,
                        logprobs=False)
    cs = make_engine(cfg, model, tok).generate([e.prompt for e in ev], samples, sp)
    n = np.array([response_tokens(c, tok.eos_token_id) for c in cs])
    ok = np.array(Task().grade(ev, cs)[1])
    ops = np.array([ev[c.prompt_index].meta.get("n_ops", 0) for c in cs])
    by_ops = {f"{lo}-{hi}": dict(problems=int(((ops >= lo) & (ops <= hi)).sum() // samples),
                                 accuracy=float(ok[(ops >= lo) & (ops <= hi)].mean()),
                                 mean_tokens=float(n[(ops >= lo) & (ops <= hi)].mean()))
              for lo, hi in BINS if ((ops >= lo) & (ops <= hi)).any()}
    return dict(preset=preset, problems=len(ev), samples=samples, seed=seed, accuracy=float(ok.mean()),
                percentiles={q: int(np.percentile(n, q)) for q in (50, 80, 85, 90, 99)}, longest=int(n.max()),
                window=cfg.rollout.window, window_percentile=float((n <= cfg.rollout.window).mean() * 100),
                by_ops=by_ops)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu-tail")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    r = measure(a.preset, a.samples, a.seed)
    p = r["percentiles"]
    print(f"{r['problems']} problems x {r['samples']}: accuracy {r['accuracy']:.3f}; tokens p50 {p[50]}, p80 {p[80]}, "
          f"p85 {p[85]}, p90 {p[90]}, p99 {p[99]}, longest {r['longest']}; window {r['window']} = "
          f"p{r['window_percentile']:.0f}")
    print("| operations | problems | accuracy | mean tokens |\n|---|---|---|---|")
    for k, v in r["by_ops"].items(): print(f"| {k} | {v['problems']} | {v['accuracy']:.2f} | {v['mean_tokens']:.0f} |")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(r, indent=1))

if __name__ == "__main__":
    main()
