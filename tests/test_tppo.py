"T-PPO through the real loop: every generated token is trained exactly once, with the right old log-probs."
import json, subprocess
import pytest, torch
import bppo_kit.update as upd
from conftest import bppo_cmd, ROOT
from bppo_kit.config import data_dir, get_config
from bppo_kit.tppo import TPPO
from bppo_kit.trainer import train

pytestmark = pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(),
                                reason="needs the shipped policy in data/tiny_policy")

@pytest.mark.parametrize("window,exclude_last,group_filter", [(12, 8, "none"), (6, 8, "none"), (12, 8, "mixed")])
def test_every_token_trained_once_with_its_old_logprobs(tmp_path, monkeypatch, window, exclude_last, group_filter):
    "Position by position over a multi-window run; carried tokens' old log-probs are their sampling log-probs"
    ranges, finished, olds = {}, {}, []
    item = TPPO._item
    def spy_item(e, s, k, g, adv):
        it = item(e, s, k, g, adv)
        ranges.setdefault(e.uid, []).append((s, s + k, it.carried, g))
        return it
    monkeypatch.setattr(TPPO, "_item", staticmethod(spy_item))
    after = TPPO.after_update
    def spy_after(self, pad_id):
        for e in self._finished[0]: finished[e.uid] = (len(e.tokens), e.trained)
        return after(self, pad_id)
    monkeypatch.setattr(TPPO, "after_update", spy_after)
    loss = upd.micro_batch_loss
    def spy_loss(model, batch, mask, adv, weights, old_logp, ref_logp, cfg, surrogate, sample=None, carried=None):
        out = loss(model, batch, mask, adv, weights, old_logp, ref_logp, cfg, surrogate, sample, carried)
        olds.append((mask, sample, carried, out[4].detach()))
        return out
    monkeypatch.setattr(upd, "micro_batch_loss", spy_loss)
    cfg = get_config("cpu-demo", overrides=[
        "algo.name=tppo", f"rollout.window={window}", f"algo.exclude_last={exclude_last}", "rollout.max_new_tokens=60",
        f"algo.group_filter={group_filter}",
        "train.prompts_per_step=4", "rollout.group_size=2", "train.steps=12", f"train.out={tmp_path}/run"])
    train(cfg, progress=False, evaluate_every=False)
    assert len(finished) >= 8, finished
    multi = 0
    for uid, (n, t) in finished.items():
        rs = [r for r in ranges[uid] if r[1] > r[0]]
        if group_filter == "none": assert t == n
        # tiles 0…t-1; the rest (t…n-1, none without the filter) was filtered
        assert [r[0] for r in rs] == [0] + [r[1] for r in rs[:-1]] and (rs[-1][1] if rs else 0) == t, (uid, n, rs)
        for s, end, carried, g in rs: assert carried == max(0, min(end, g) - s)
        multi += len(rs) > 1
    assert multi >= 4  # responses trained over several steps, carried tokens among them
    n_carried = 0
    for mask, sample, carried, old in olds:
        assert sample is not None
        if carried is not None:
            assert torch.equal(old[carried], sample[carried]); n_carried += int(carried.sum())
            fresh = mask & ~carried
        else: fresh = mask
        # this step's tokens: the current policy is the sampling one (the float32 kit engine computes what it computes)
        if fresh.any(): assert (old[fresh] - sample[fresh]).abs().max() < 1e-4
    assert n_carried > 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    filtered = sum(r["filtered_tokens"] for r in rows)
    assert filtered == sum(n - t for n, t in finished.values())  # what the filter dropped, counted once
    if group_filter == "mixed": assert filtered > 0

@pytest.mark.parametrize("algo", ["tppo", "ppo"])
def test_tppo_and_ppo_run_on_the_demo_preset_without_a_window_flag(tmp_path, algo):
    r = subprocess.run(bppo_cmd() + ["train", "--preset", "cpu-demo", "--algo", algo, "--steps", "2", "--out",
                                     str(tmp_path / algo), "--set", "train.prompts_per_step=2",
                                     "--set", "data.eval_size=2", "--quiet"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len((tmp_path / algo / "metrics.jsonl").read_text().splitlines()) == 2
