"T-PPO through the real loop: every generated token is trained exactly once, with the right old log-probs."
import json, subprocess
import pytest, torch
import bppo_kit.update as upd
from conftest import bppo_cmd, ROOT
from bppo_kit.config import data_dir, get_config
from bppo_kit.tppo import TPPO
from bppo_kit.core import TrainItem
from bppo_kit.trainer import train

pytestmark = pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(),
                                reason="needs the shipped policy in data/tiny_policy")

@pytest.mark.parametrize("window,exclude_last,group_filter,mode,oversample", [
    (12, 8, "none", "defer", 1), (6, 8, "none", "defer", 1), (12, 8, "mixed", "defer", 1), (12, 8, "none", "mask", 1),
    (12, 8, "mixed", "mask", 2)])
def test_every_token_trained_once_with_its_old_logprobs(tmp_path, monkeypatch, window, exclude_last, group_filter,
                                                        mode, oversample):
    """Position by position over a multi-window run: each token trained, filtered, masked or left out once; carried
    tokens' old log-probs are their sampling log-probs"""
    ranges, finished, olds = {}, {}, []
    item = TPPO._item
    def spy_item(self, e, s, k, g, adv, upto=None, lm=0.0):
        it = item(self, e, s, k, g, adv, upto, lm)
        ranges.setdefault(e.uid, []).append((s, s + k, e.trained, it.carried, g))
        return it
    monkeypatch.setattr(TPPO, "_item", spy_item)
    after = TPPO.after_update
    def spy_after(self, pad_id):
        for e in self._finished[0]: finished[e.uid] = (len(e.tokens), e.trained)
        return after(self, pad_id)
    monkeypatch.setattr(TPPO, "after_update", spy_after)
    loss = upd.micro_batch_loss
    def spy_loss(model, mb, weights, ctx):
        out = loss(model, mb, weights, ctx)
        olds.append((mb.mask, mb.sample, mb.carried, out[4].detach()))
        return out
    monkeypatch.setattr(upd, "micro_batch_loss", spy_loss)
    cfg = get_config("cpu-demo", overrides=[
        "algo.name=tppo", f"rollout.window={window}", f"algo.tppo.exclude_last={exclude_last}",
        "rollout.max_new_tokens=60",
        f"algo.tppo.group_filter={group_filter}", f"algo.tppo.filter_mode={mode}", f"algo.tppo.oversample={oversample}",
        "train.prompts_per_step=4", "rollout.group_size=2", "train.steps=12", f"train.out={tmp_path}/run"])
    train(cfg, progress=False, evaluate_every=False)
    assert len(finished) >= 8, finished
    multi = 0
    for uid, (n, t) in finished.items():
        rs = [r for r in ranges.get(uid, []) if r[2] > r[0]]  # steps that trained (or masked) some of its tokens
        if group_filter == "none" and oversample == 1: assert t == n
        # trained ranges s…end-1 and masked ranges end…upto-1 tile 0…t-1; the rest (t…n-1) was filtered or left out
        tiles = [0] + [r[2] for r in rs[:-1]] if rs else []  # each range starts where the one before ended
        assert [r[0] for r in rs] == tiles and (rs[-1][2] if rs else 0) == t, (uid, n, rs)
        for s, end, upto, carried, g in rs:
            assert carried == max(0, min(end, g) - s)
            if mode == "defer": assert upto == end
        multi += len(rs) > 1
    masked = sum(upto - end for rs in ranges.values() for _, end, upto, _, _ in rs)  # unfinished responses' too
    assert (masked > 0) == (mode == "mask")
    assert multi >= 4  # responses trained over several steps, carried tokens among them
    n_carried = 0
    for mask, sample, carried, old in olds:
        assert sample is not None
        if carried is not None:
            assert torch.equal(old[carried], sample[carried])
            n_carried += int(carried.sum())
            fresh = mask & ~carried
        else: fresh = mask
        # this step's tokens: the current policy is the sampling one (the float32 kit engine computes what it computes)
        if fresh.any(): assert (old[fresh] - sample[fresh]).abs().max() < 1e-4
    assert n_carried > 0 or mode == "mask"  # masked: nothing is held back to a later step (unless left out)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    filtered = sum(r["filtered_tokens"] + r["unselected_tokens"] for r in rows)
    assert filtered == sum(n - t for n, t in finished.values())  # what the filter and the subset dropped, once
    assert sum(r["masked_tokens"] for r in rows) == masked
    if group_filter == "mixed": assert filtered > 0

@pytest.mark.parametrize("algo", ["tppo", "ppo"])
def test_tppo_and_ppo_run_on_the_demo_preset_without_a_window_flag(tmp_path, algo):
    r = subprocess.run(bppo_cmd() + ["train", "--preset", "cpu-demo", "--algo", algo, "--steps", "2", "--out",
                                     str(tmp_path / algo), "--set", "train.prompts_per_step=2",
                                     "--set", "data.eval_size=2", "--quiet"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len((tmp_path / algo / "metrics.jsonl").read_text().splitlines()) == 2


def _tiny_run_cfg(tmp_path, *more):
    return get_config("cpu-demo", overrides=[
        "algo.name=tppo", "rollout.window=12", "rollout.max_new_tokens=60", "train.prompts_per_step=4",
        "rollout.group_size=2", f"train.out={tmp_path}/run", *more])

@pytest.mark.parametrize("steps,moves", [(3, False), (4, True)])
def test_actor_frozen_during_critic_warmup(tmp_path, steps, moves):
    "3 warm-up steps: the policy's weights are exactly the loaded ones while the critic has moved; a 4th step moves it"
    from bppo_kit.policy import load_policy
    model, tok = load_policy("tiny")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = _tiny_run_cfg(tmp_path, "algo.tppo.value_warmup=3", f"train.steps={steps}")
    out = train(cfg, progress=False, evaluate_every=False, policy=(model, tok))
    assert out["steps"] == steps
    same = all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert same != moves
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["trained_tokens"] > 0 for r in rows] == [False] * 3 + [True] * (steps - 3)
    assert all(r["value_loss"] is not None for r in rows if r["finished"])  # the critic trained meanwhile

def test_lm_loss_touches_only_finished_correct_tokens(tmp_path, monkeypatch):
    """Items carry the LM term exactly for finished responses the verifier grades right, over all their tokens, and the
    update's gradient with every advantage 0 is the gradient of 0.1 x the mean NLL of exactly those tokens"""
    from bppo_kit.policy import load_policy
    from bppo_kit.rollout import KitEngine
    from bppo_kit.sampler import Sampler
    from bppo_kit.update import update, forward_logprobs
    from bppo_kit.policy import pack
    from bppo_kit.verifier import score
    model, tok = load_policy("tiny")
    cfg = _tiny_run_cfg(tmp_path, "algo.tppo.lm_loss_weight=0.1", "train.prompts_per_step=8", "rollout.group_size=4")
    algo, smp = TPPO(cfg, model), Sampler(cfg, KitEngine(model, tok), tok)
    seen = 0
    for step in range(4):
        items, _ = algo.collect(step, smp)
        done = {tuple(e.tokens): e for e in algo._finished[0]}
        for it in items:
            e = done.get(tuple(it.completion_ids))
            right = e is not None and score(tok.decode(e.tokens, skip_special_tokens=True), e.example.answer).correct
            assert (it.lm_weight > 0) == right, (it.lm_weight, right)
        lm_items = [it for it in items if it.lm_weight > 0]
        seen += len(lm_items)
        algo.after_update(tok.pad_token_id)
    assert seen > 0
    zero = [TrainItem(it.prompt_ids, it.completion_ids, 0.0, it.end, it.start, [0.0] * (it.end - it.start),
                      lm_weight=it.lm_weight) for it in items]
    lm_items = [it for it in zero if it.lm_weight > 0]
    assert lm_items and len(lm_items) < len(zero)
    model.zero_grad()
    c = get_config("cpu-demo", overrides=["train.grad_clip=1e9"])
    update(model, torch.optim.SGD(model.parameters(), lr=0.0), zero, c, tok.pad_token_id)
    g_upd = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    n = sum(len(it.completion_ids) for it in lm_items)
    b = pack([it.prompt_ids for it in lm_items], [it.completion_ids for it in lm_items], tok.pad_token_id)
    (-0.1 * forward_logprobs(model, b)[0].sum() / n).backward()
    for a, h in zip(g_upd, [p.grad for p in model.parameters()]): assert torch.allclose(a, h, atol=1e-6)

def test_prioritized_subset_in_the_recipes_order():
    "A hand-made pool: mixed groups first, then groups with unfinished members, then uniform ones; old before new"
    from bppo_kit.batching import Entry
    from bppo_kit.data import Example
    from bppo_kit.tppo import group_priority, select_subset
    algo = TPPO(get_config("cpu-demo", overrides=["algo.name=tppo", "rollout.group_size=3", "train.prompts_per_step=2",
                                                   "algo.tppo.oversample=3"]))
    ex = Example("Q: 1+1\nA:", "2")
    groups = [4, 4, 4, 2, 2, 2, 6, 6, 6, 3, 3, 3, 1, 1, 1, 5, 5, 5]
    algo.groups = {4: [1.0, 1.0, 1.0], 2: [0.0], 6: [0.0, 1.0], 3: [], 1: [1.0, 1.0, 1.0], 5: [1.0, 0.0, 0.0]}
    pool = [Entry(ex, [5], u, g) for u, g in enumerate(groups)]
    assert [group_priority(algo.groups[g], 3) for g in (4, 2, 6, 3, 1, 5)] == [2, 1, 0, 1, 2, 0]
    chosen = algo._choose(pool)  # trains 2 prompts x 3 = 6 of 18
    assert [pool[i].group for i in chosen.nonzero().flatten()] == [6, 6, 6, 5, 5, 5]  # the two mixed groups
    order = [groups[i] for i in select_subset(groups, [group_priority(algo.groups[g], 3) for g in groups], 18)
             .nonzero().flatten()]
    assert sorted(order) == sorted(groups)
    k12 = select_subset(groups, [group_priority(algo.groups[g], 3) for g in groups], 12)
    assert sorted({groups[i] for i in k12.nonzero().flatten()}) == [2, 3, 5, 6]  # then the open groups, 2 before 3
    k13 = select_subset(groups, [group_priority(algo.groups[g], 3) for g in groups], 13)
    assert [i for i in k13.nonzero().flatten().tolist() if groups[i] == 1] == [12]  # then uniform: the older, 1


@pytest.mark.parametrize("truncation", [["rollout.top_p=0.9"], ["rollout.top_k=20"]])
def test_tppo_refuses_truncated_sampling_in_one_line(truncation):
    "Carried tokens take the sampler's log-probs as the old policy's: under top-p/top-k those are truncated, so refused"
    from bppo_kit.config import ConfigError
    from bppo_kit.trainer import check_run
    with pytest.raises(ConfigError, match="T-PPO's carried tokens need untruncated"):
        check_run(get_config("cpu-demo", overrides=["algo.name=tppo", *truncation]))
    check_run(get_config("cpu-demo", overrides=["algo.name=ppo", *truncation]))  # PPO carries no tokens: runs
