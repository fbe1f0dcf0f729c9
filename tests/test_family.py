"""BPPO's peers (lesson 15): CPPO's rule against its public code, each class small and outside the loop, and every
method trained by the same `train()` from its name alone."""
import inspect, re
import pytest, torch
from conftest import ROOT, examples, fuzz_seed
from bppo_kit.config import ConfigError, get_config
from bppo_kit.core import make_algorithm
from bppo_kit.family import CPPO, GFPO, NAT, NATPrefix, PODS, cppo_keep, gfpo_keep, max_variance_subset
from bppo_kit.runs import read_jsonl_rows
from bppo_kit.trainer import train

SMALL = ["train.prompts_per_step=4", "rollout.group_size=4", "data.eval_size=4", "rollout.max_new_tokens=120"]
FAMILY = {"cppo": CPPO, "pods": PODS, "gfpo": GFPO, "nat": NAT, "nat_rpc": NATPrefix}


def cppo_public_rule(advantages: torch.Tensor, pruning: float) -> torch.Tensor:
    """CPPO's pruning, transcribed from its public code: lzhxmu/CPPO, `src/open_r1/grpo_trainer_gsm.py`
    (commit 69ded0fd), `GRPOTrainer._generate_and_score_completions`, the block under `if self.args.pruning != 0 and
    mode == 'train':` with `metric == 'smallest'` (the setting of `scripts/CPPO.sh`: `--metric='smallest'
    --pruning=0.5`): `k = int(advantages.shape[0] * pruning_rate)`; `_, min_indices = torch.topk(abs_advantages, k=k,
    largest=False)`; `mask = torch.ones_like(advantages, dtype=torch.bool)`; `mask[min_indices] = False`. Its
    advantages are over the process's whole flattened batch, with its own normalization a few lines above:
    `(rewards - mean_grouped) / (std_grouped + 1e-4)` (Bessel-corrected std)."""
    k = int(advantages.shape[0] * pruning)
    _, min_indices = torch.topk(torch.abs(advantages), k=k, largest=False)
    mask = torch.ones_like(advantages, dtype=torch.bool)
    mask[min_indices] = False
    return mask


def cppo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    "CPPO's advantages [B, G] (the same file, a few lines above the pruning): Bessel std, eps 1e-4"
    return (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)


@pytest.mark.fuzz
@pytest.mark.parametrize("G,keep", [(16, 1), (16, 2), (8, 2), (8, 4), (4, 1)])
def test_cppo_selection_equals_its_public_rule(G, keep):
    "Same rewards, same advantages: the kit's `cppo_keep` keeps exactly the completions CPPO's code keeps (ties too)"
    gen = torch.Generator().manual_seed(fuzz_seed(G * 10 + keep))
    for trial in range(examples(20)):
        B = 1 + trial % 7
        # 0/1 rewards (many ties in |A|), sometimes with a format bonus of 0.1 (fewer ties)
        rewards = (torch.rand(B, G, generator=gen) < 0.6).float()
        if trial % 2: rewards = rewards + 0.1 * (torch.rand(B, G, generator=gen) < 0.5).float()
        adv = cppo_advantages(rewards)
        pruning = 1 - keep / G
        assert int(B * G * pruning) == B * (G - keep)
        theirs = cppo_public_rule(adv.flatten(), pruning).view(B, G)
        assert torch.equal(cppo_keep(adv, keep), theirs), (rewards, adv)


def test_cppo_rule_is_not_per_group():
    "The test above can fail: a per-group top-k (the rule one might guess) keeps other completions than CPPO's"
    rewards = torch.tensor([[1., 1., 1., 0.], [1., 1., 1., 1.]])
    adv = cppo_advantages(rewards)
    per_group = torch.zeros(2, 4, dtype=torch.bool)
    per_group.scatter_(1, adv.abs().topk(2, 1).indices, True)
    theirs = cppo_public_rule(adv.flatten(), 0.5).view(2, 4)
    assert torch.equal(cppo_keep(adv, 2), theirs) and not torch.equal(per_group, theirs)
    assert theirs[0].all() and not theirs[1].any()  # the uniform group gives its whole share to the mixed one


def test_rules_refuse_bad_sizes():
    with pytest.raises(ValueError, match="group size"): cppo_keep(torch.zeros(2, 4), 0)
    with pytest.raises(ValueError, match="group size"): max_variance_subset(torch.zeros(2, 4), 5)
    with pytest.raises(ValueError, match="rule"): gfpo_keep(torch.zeros(1, 4), torch.ones(1, 4), 2, "longest")
    with pytest.raises(ConfigError, match="algo.pods.keep: pods keeps at most"):
        make_algorithm(get_config("cpu-demo", overrides=["algo.name=pods", "algo.pods.keep=9"]))


def test_each_class_is_small_and_the_loop_does_not_know_them():
    "The issue's bound: a class at most 40 lines beyond its rule; trainer.py and update.py never name them"
    for cls in FAMILY.values(): assert len(inspect.getsource(cls).splitlines()) <= 40, cls
    for f in ("trainer.py", "update.py"):
        src = (ROOT / "bppo_kit" / f).read_text()
        assert not re.search(r"\b(cppo|pods|gfpo|nat|family|CPPO|PODS|GFPO|NAT)\b", src), f


@pytest.mark.fuzz
def test_max_variance_subset_is_the_brute_force_optimum():
    "PODS's rule: the sorted-extremes search finds a subset of maximal variance, checked against every subset"
    from itertools import combinations
    gen = torch.Generator().manual_seed(fuzz_seed(0))
    for _ in range(examples(30)):
        rw = torch.randint(0, 5, (1, 6), generator=gen).float() / 4
        for m in (2, 3, 4):
            got = rw[0, max_variance_subset(rw, m)[0]].var(unbiased=False).item()
            best = max(rw[0, list(c)].var(unbiased=False).item() for c in combinations(range(6), m))
            assert got == pytest.approx(best, abs=1e-6)


@pytest.mark.parametrize("algo", sorted(FAMILY))
def test_train_runs_each_method_by_name(tmp_path, algo, shipped):
    "`algo.name=cppo` etc. through the same `train()`: registered on first lookup, trains fewer sequences than GRPO"
    cfg = get_config("cpu-demo", overrides=SMALL + [f"algo.name={algo}", "train.steps=2",
                                                    f"train.out={tmp_path / algo}"])
    train(cfg, progress=False, evaluate_every=False)
    rows = read_jsonl_rows(tmp_path / algo / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r["selected_sequences"] <= 16 for r in rows)
    # 4 prompts, 2 kept of each 4; NAT keeps every completion and a part of its tokens
    if not algo.startswith("nat"): assert all(r["kept_completions"] == 4 * 2 for r in rows)
    else: assert all(r["kept_tokens"] <= r["trained_tokens"] for r in rows)
