"""Coin-flip rewards for GRPO and BPPO: the training path measured on a model that never answers right.

A random-weight model (bppo_kit.shapes) gets reward 0 on every completion, so every group advantage is 0, GRPO skips
every sequence and BPPO finds no correct representative: the update would do nothing and measure nothing. These two
algorithms are the kit's GRPO and BPPO with each completion's reward replaced by a seeded coin flip (correct with
probability 1/2, a function of `train.seed` and the step), after the real grading; selection, prefixes, advantages,
the update and the loop are unchanged. The step's logged accuracy is still the real one (0).

    bppo train --plugin examples/plugins/coin_rewards.py --algo bppo_coin --set model.name_or_path=FOLDER ...
"""
from dataclasses import replace
import torch
from bppo_kit.bppo import BPPO
from bppo_kit.core import register
from bppo_kit.grpo import GRPO

def coin_flips(shape, seed: int, step: int) -> torch.Tensor:
    "A [B, G] bool tensor of fair coin flips, a pure function of (seed, step)"
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.rand(shape, generator=g) < 0.5

class CoinRewards:
    "Mixin: the rollout's rewards and correctness replaced by coin flips before the algorithm prepares its items"
    def prepare(self, r, step=0):
        ok = coin_flips(r.rewards.shape, self.cfg.train.seed, step)
        if r.valid is not None: ok &= r.valid  # a cancelled completion stays unscored
        return super().prepare(replace(r, rewards=ok.float(), correct=ok), step)

@register("grpo_coin")
class GRPOCoin(CoinRewards, GRPO):
    "GRPO on coin-flip rewards"

@register("bppo_coin")
class BPPOCoin(CoinRewards, BPPO):
    "BPPO on coin-flip rewards"
