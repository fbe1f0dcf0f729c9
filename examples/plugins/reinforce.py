"REINFORCE with a group-mean baseline: a fourth algorithm for bppo_kit, defined outside the package, with its settings"
from dataclasses import dataclass
from bppo_kit.config import param
from bppo_kit.core import Algorithm, TrainItem, register


@dataclass
class ReinforceSettings:
    # group: reward minus its group's mean reward; none: the raw reward (plain REINFORCE)
    baseline: str = param("group", choices=["group", "none"])


# `--set algo.reinforce.baseline=none` sets it: config.py never learns the field
@register("reinforce", settings=ReinforceSettings)
class Reinforce(Algorithm):
    "Every token of every completion; advantage = reward - the baseline (no std scaling)"

    def prepare(self, rollout, step=0):
        base = rollout.rewards.mean(1, keepdim=True) if self.settings.baseline == "group" else 0.0
        adv = (rollout.rewards - base).flatten()
        items = [TrainItem(c.prompt_ids, c.completion_ids, adv[i].item(), c.n_tokens)
                 for i, c in enumerate(rollout.completions)]
        return items, dict(baseline_mean=rollout.rewards.mean().item(), selected_sequences=len(items))
