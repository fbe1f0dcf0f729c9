"""Behaviour check for refactors: the same seeded runs must log the same numbers before and after a change.

    python tools/behaviour_check.py --write runs/behaviour_before.json    # on the old code
    python tools/behaviour_check.py --check runs/behaviour_before.json    # on the new code: exit 1 on any difference

Each variant is a short seeded `train()` run (seed 0) of the cpu-demo preset; every per-step metric except wall-clock
times is recorded (rewards, accuracies, losses, token counts, clip fractions, value losses …), with a checksum of the
final weights. `bppo eval` on the shipped policy is run as a user runs it (a subprocess) and its numbers recorded too.
Numbers must agree to 1e-6 (relative to max(1, |x|)). A key the reference lacks is reported but is not a difference;
a key the new run lacks is one.
"""
import argparse, json, math, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMES = {"wall_s", "rollout_s", "reward_s", "update_s", "seconds"}

# name -> overrides of the cpu-demo preset (5 steps, seed 0). The first four are the acceptance's runs; the rest cover
# the loop's other paths: PPO epochs with a reference model, the fused loss, early stop with resampling, ratio prefixes.
VARIANTS = {
    "grpo": [],
    "bppo": ["algo.name=bppo"],
    "ppo": ["algo.name=ppo"],
    "tppo": ["algo.name=tppo", "rollout.window=32"],
    "grpo_mu2_kl_seq": ["train.mu=2", "algo.beta=0.04", "algo.reduction=seq", "train.micro_batch=16",
                        "train.prompts_per_step=8", "train.warmup_steps=3"],
    "bppo_sched_resample_chunked": ["algo.name=bppo", "algo.schedule=early_stop", "algo.resample=1",
                                    "train.loss_kernel=chunked", "train.prompts_per_step=8"],
    "bppo_ratio_all": ["algo.name=bppo", "algo.prefix_mode=ratio", "algo.prefix_ratio=0.3", "algo.prefix_ratio_end=0.8",
                       "algo.select=all", "train.prompts_per_step=8"],
    "tppo_adaptive_lam": ["algo.name=tppo", "rollout.window=12", "algo.lam_alpha=0.05", "train.prompts_per_step=4",
                          "rollout.max_slots=16"],
}

def run_variant(name: str, overrides: list[str], out: Path, steps: int) -> dict:
    import torch
    from bppo_kit.config import get_config
    from bppo_kit.policy import load_policy
    from bppo_kit.trainer import read_jsonl_rows, train
    cfg = get_config("cpu-demo", overrides=[f"train.steps={steps}", "train.seed=0", "data.seed=0", "data.eval_size=8",
                                            f"train.out={out / name}"] + overrides)
    t0 = time.time()
    train(cfg, progress=False, evaluate_every=(name == "grpo"), overwrite=True)
    rows = [{k: v for k, v in r.items() if k not in TIMES} for r in read_jsonl_rows(out / name / "metrics.jsonl")]
    evals = [{k: v for k, v in r.items() if k not in TIMES} for r in read_jsonl_rows(out / name / "eval.jsonl")]
    model, _ = load_policy(str(out / name / "checkpoint"))
    with torch.no_grad():
        ps = [p.double() for p in model.parameters()]
        weights = dict(sum=sum(p.sum().item() for p in ps), sq=sum((p * p).sum().item() for p in ps))
    print(f"{name:>30}: {len(rows)} steps in {time.time() - t0:.1f} s", flush=True)
    return dict(steps=rows, evals=evals, weights=weights)

def run_eval(out: Path) -> dict:
    js = out / "eval.json"
    exe = Path(sys.executable).parent / "bppo"  # the installed command, as a user runs it
    cmd = (([str(exe)] if exe.exists() else [sys.executable, "-m", "bppo_kit.cli"])
           + ["eval", "--preset", "cpu-demo", "--samples", "8", "--json", str(js), "--quiet"])
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return {k: v for k, v in json.loads(js.read_text()).items() if k not in TIMES}

def collect(steps: int, only: list[str] | None) -> dict:
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for name, ov in VARIANTS.items():
            if not only or name in only: res[name] = run_variant(name, ov, Path(d), steps)
        if not only or "eval" in only: res["eval"] = run_eval(Path(d))
    return res

def diffs(ref, new, path="", tol=1e-6) -> tuple[list[str], list[str]]:
    "(differences, keys only the new result has) between two nested results"
    bad, extra = [], []
    if isinstance(ref, dict) and isinstance(new, dict):
        for k in ref:
            if k not in new:
                bad.append(f"{path}.{k}: missing")
                continue
            b, e = diffs(ref[k], new[k], f"{path}.{k}", tol)
            bad += b
            extra += e
        extra += [f"{path}.{k}" for k in new if k not in ref]
    elif isinstance(ref, list) and isinstance(new, list):
        if len(ref) != len(new): bad.append(f"{path}: {len(ref)} entries, now {len(new)}")
        for i, (a, b) in enumerate(zip(ref, new)):
            b_, e = diffs(a, b, f"{path}[{i}]", tol)
            bad += b_
            extra += e
    elif isinstance(ref, (int, float)) and isinstance(new, (int, float)) and not isinstance(ref, bool):
        if not (math.isnan(ref) and math.isnan(new)) and abs(ref - new) > tol * max(1.0, abs(ref)):
            bad.append(f"{path}: {ref!r} -> {new!r}")
    elif ref != new: bad.append(f"{path}: {ref!r} -> {new!r}")
    return bad, extra

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", help="record the current code's numbers into this JSON file")
    g.add_argument("--check", help="compare the current code's numbers with this JSON file")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", nargs="*", help=f"a subset of: {', '.join(VARIANTS)}, eval")
    a = ap.parse_args(argv)
    res = collect(a.steps, a.only)
    if a.write:
        if a.only and Path(a.write).exists(): res = {**json.loads(Path(a.write).read_text()), **res}  # update a subset
        Path(a.write).parent.mkdir(parents=True, exist_ok=True)
        Path(a.write).write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {a.write}")
        return 0
    ref = json.loads(Path(a.check).read_text())
    if a.only: ref = {k: v for k, v in ref.items() if k in a.only}
    bad, extra = diffs(ref, res)
    for e in extra: print(f"new key (not compared): {e}")
    for b in bad: print(f"DIFFERENT {b}")
    n = sum(len(v["steps"]) for k, v in res.items() if k != "eval")
    print(f"{'SAME' if not bad else 'CHANGED'}: {len(res)} runs, {n} logged steps compared to 1e-6; "
          f"{len(bad)} differences")
    return 0 if not bad else 1

if __name__ == "__main__":
    sys.exit(main())
