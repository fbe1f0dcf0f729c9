"REINFORCE with a group-mean baseline: a fourth algorithm for bppo_kit, defined outside the package"
from bppo_kit.core import Algorithm, TrainItem, register


@register("reinforce")
class Reinforce(Algorithm):
    "Every token of every completion; advantage = reward - the mean reward of its group (no std scaling)"

    def prepare(self, rollout, step=0):
        adv = (rollout.rewards - rollout.rewards.mean(1, keepdim=True)).flatten()
        items = [TrainItem(c.prompt_ids, c.completion_ids, adv[i].item(), c.n_tokens)
                 for i, c in enumerate(rollout.completions)]
        return items, dict(baseline_mean=rollout.rewards.mean().item(), selected_sequences=len(items))
