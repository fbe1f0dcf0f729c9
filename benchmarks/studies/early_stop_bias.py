"""Early stop's bias on BPPO's group statistics, measured on recorded full rollouts.

    python benchmarks/studies/early_stop_bias.py --steps 8 --json runs/early_stop_bias.json [--model tiny]

Samples `--steps` steps of full groups (the cpu-demo preset: 16 prompts x 8 completions, the kit's engine, nothing
cancelled) with a policy, then replays `algo.bppo.schedule=early_stop` on them: `bppo_kit.bppo.early_stop_view` keeps
the members that would have finished before the group was cancelled (members finish in order of length, as in the kit's
engine; cancel once a correct and an incorrect one are done and half the group has finished). For every mixed group it
compares what the kept members imply with what the full group says:
- the implied group accuracy (correct / counted members) against the full group's;
- the class-weighted pair advantages of the two representatives (the shortest correct and incorrect, the same in both
  views) against the full group's;
- the tokens early stop would have saved (a cancelled member has run as long as the last kept one).
Prints a table and writes a JSON result.
"""
import argparse
import json
import statistics
from pathlib import Path

import torch

from bppo_kit.bppo import early_stop_view, pair_advantages, select_binary
from bppo_kit.config import get_config
from bppo_kit.policy import load_policy
from bppo_kit.sampler import Sampler, make_engine


def group_view(rewards: torch.Tensor, correct: torch.Tensor, lengths: torch.Tensor) -> list[dict]:
    "Per mixed group: accuracy and pair advantages of the full group and of early stop's kept members"
    kept = early_stop_view(correct, lengths)
    sel = select_binary(correct, lengths)
    full = pair_advantages(rewards, correct, sel, "class")
    early = pair_advantages(rewards * kept, correct & kept, sel, "class", kept)
    out = []
    for b in range(rewards.shape[0]):
        if not (correct[b].any() and not correct[b].all()): continue
        n = int(kept[b].sum())
        out.append(dict(acc_full=correct[b].float().mean().item(), acc_early=(correct[b] & kept[b]).sum().item() / n,
                        kept=n, adv_full=full[b].tolist(), adv_early=early[b].tolist(),
                        tokens_full=int(lengths[b].sum()),  # a cancelled member ran until the last kept one ended
                        tokens_early=int(lengths[b].clamp(max=int(lengths[b][kept[b]].max())).sum())))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="steps of full rollouts to record")
    ap.add_argument("--model", default="tiny", help="the policy (model.name_or_path)")
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    a = ap.parse_args()
    cfg = get_config("cpu-demo", overrides=[f"model.name_or_path={a.model}"])
    model, tok = load_policy(a.model)
    smp = Sampler(cfg, make_engine(cfg, model, tok), tok)
    groups = []
    for step in range(a.steps):
        ro, _ = smp.groups(step)
        groups += group_view(ro.rewards, ro.correct, ro.lengths)
    if not groups: raise SystemExit("no mixed group in the recorded rollouts")
    med = lambda xs: statistics.median(xs)
    mean = lambda xs: statistics.fmean(xs)
    acc_bias = [g["acc_early"] - g["acc_full"] for g in groups]
    ratio_c = [g["adv_early"][0] / g["adv_full"][0] for g in groups if g["adv_full"][0]]
    ratio_i = [g["adv_early"][1] / g["adv_full"][1] for g in groups if g["adv_full"][1]]
    res = dict(model=a.model, steps=a.steps, mixed_groups=len(groups), group_size=cfg.rollout.group_size,
               kept_mean=mean([g["kept"] for g in groups]),
               acc_full_mean=mean([g["acc_full"] for g in groups]),
               acc_early_mean=mean([g["acc_early"] for g in groups]),
               acc_bias_mean=mean(acc_bias), acc_bias_median=med(acc_bias),
               adv_ratio_correct_median=med(ratio_c), adv_ratio_incorrect_median=med(ratio_i),
               adv_ratio_correct_mean=mean(ratio_c), adv_ratio_incorrect_mean=mean(ratio_i),
               tokens_saved=1 - sum(g["tokens_early"] for g in groups) / sum(g["tokens_full"] for g in groups))
    print(f"{res['mixed_groups']} mixed groups of {res['group_size']} over {a.steps} steps ({a.model})")
    print(f"members counted under early stop: {res['kept_mean']:.2f} of {res['group_size']} (mean)")
    print(f"group accuracy: full {res['acc_full_mean']:.3f}, early stop {res['acc_early_mean']:.3f} "
          f"(bias {res['acc_bias_mean']:+.3f} mean, {res['acc_bias_median']:+.3f} median)")
    print(f"pair advantage, early / full: correct {res['adv_ratio_correct_median']:.2f} (median; mean "
          f"{res['adv_ratio_correct_mean']:.2f}), incorrect {res['adv_ratio_incorrect_median']:.2f} (median; mean "
          f"{res['adv_ratio_incorrect_mean']:.2f})")
    print(f"tokens of mixed groups early stop would not generate: {res['tokens_saved']:.1%}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
