"""How much of the return can T-PPO's critic explain on the CPU demo? An upper bound fitted offline.

    OMP_NUM_THREADS=2 python benchmarks/studies/critic_bound.py --json runs/critic_bound.json

The online critic (the T-PPO lesson's `ValueModel`: a copy of the policy's decoder and a scalar head) sees each step's
finished responses once. This script gives the same architecture far more: it samples `--prompts` training problems x
`--group` completions from the shipped policy with the kit engine (the training sampling parameters), grades them,
and fits a fresh `ValueModel` offline for `--epochs` passes over Monte-Carlo returns (gamma = 1: every token's target
is its response's final reward), then measures explained variance (`egae.explained_variance`, the number T-PPO logs)
on `--heldout` other problems' responses, after each epoch. Three references on the held-out tokens:

- `prompt_mean`: each held-out token predicted by the mean reward of its own group of `--group` completions (an
  oracle that knows the problem's pass rate — optimistic, since the group includes the response itself; a critic
  that reads only the prompt can do no better);
- `constant`: the training set's mean reward (explained variance ~0 by construction);
- the fitted critic at its best epoch, and at the last.

If the fitted critic stays far below the asked-for 0.25, the online one cannot be expected to reach it either.
"""
import argparse, json, random, time
import torch
from bppo_kit.config import get_config
from bppo_kit.core import SamplingParams
from bppo_kit.data import synthetic_example, synthetic_stream
from bppo_kit.egae import explained_variance, mc_returns, terminal_rewards
from bppo_kit.evaluate import grade
from bppo_kit.policy import load_policy, pack
from bppo_kit.rollout import KitEngine
from bppo_kit.tppo import ValueModel

def rollouts(model, tok, n_prompts: int, group: int, seed: int, max_new: int):
    "`n_prompts` fresh synthetic problems x `group` sampled completions, graded: (prompt ids, tokens, reward, prompt)"
    s = synthetic_stream(seed, set())
    ex = [synthetic_example(next(s)) for _ in range(n_prompts)]
    cs = KitEngine(model, tok).generate([e.prompt for e in ex], group,
                                       SamplingParams(1.0, 1.0, 0, max_new, seed=seed, logprobs=False))
    rs = [sc.reward for sc in grade(ex, cs)]
    return [(c.prompt_ids, c.completion_ids, r, c.prompt_index) for c, r in zip(cs, rs) if c.completion_ids]

def targets(rows):
    "Returns [N, T] and the token mask of a list of rollouts (gamma = 1)"
    L = torch.tensor([len(r[1]) for r in rows])
    T = int(L.max())
    mask = torch.arange(T)[None] < L[:, None]
    rew = terminal_rewards(torch.tensor([r[2] for r in rows]), L, torch.ones(len(rows), dtype=torch.bool), T)
    return mc_returns(rew, mask), mask

@torch.no_grad()
def predict(vm, rows, pad_id, mb=64):
    T = max(len(r[1]) for r in rows)
    out = torch.zeros(len(rows), T)
    for i in range(0, len(rows), mb):
        b = pack([r[0] for r in rows[i:i + mb]], [r[1] for r in rows[i:i + mb]], pad_id)
        v = vm(b)
        out[i:i + mb, :v.shape[1]] = v
    return out

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--heldout", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    cfg = get_config("cpu-demo")
    model, tok = load_policy(cfg.model.name_or_path)
    t0 = time.time()
    train = rollouts(model, tok, a.prompts, a.group, a.seed + 1, cfg.rollout.max_new_tokens)
    held = rollouts(model, tok, a.heldout, a.group, a.seed + 2, cfg.rollout.max_new_tokens)
    print(f"{len(train)} training and {len(held)} held-out responses in {time.time() - t0:.0f} s; "
          f"mean reward {sum(r[2] for r in train) / len(train):.3f}", flush=True)
    ret_tr, m_tr = targets(train)
    ret_ho, m_ho = targets(held)
    mean_tr = sum(r[2] for r in train) / len(train)
    group_mean = {}
    for r in held: group_mean.setdefault(r[3], []).append(r[2])
    pm = torch.tensor([sum(group_mean[r[3]]) / len(group_mean[r[3]]) for r in held])[:, None].expand_as(ret_ho)
    refs = dict(prompt_mean=explained_variance(pm, ret_ho, m_ho),
                constant=explained_variance(torch.full_like(ret_ho, mean_tr), ret_ho, m_ho))
    vm = ValueModel(model)
    opt = torch.optim.AdamW(vm.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
    curve = []
    for ep in range(a.epochs):
        vm.train()
        order = torch.randperm(len(train)).tolist()
        for i in range(0, len(order), a.micro_batch):
            idx = order[i:i + a.micro_batch]
            b = pack([train[j][0] for j in idx], [train[j][1] for j in idx], tok.pad_token_id)
            v = vm(b)
            T = v.shape[1]
            m, y = m_tr[idx, :T], ret_tr[idx, :T]
            loss = (0.5 * (v - y) ** 2 * m).sum() / m.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(vm.parameters(), 1.0)
            opt.step()
        vm.eval()
        ev_tr = explained_variance(predict(vm, train, tok.pad_token_id), ret_tr, m_tr)
        ev_ho = explained_variance(predict(vm, held, tok.pad_token_id), ret_ho, m_ho)
        curve.append(dict(epoch=ep + 1, train_ev=round(ev_tr, 4), heldout_ev=round(ev_ho, 4)))
        print(curve[-1], flush=True)
    best = max(curve, key=lambda c: c["heldout_ev"])
    res = dict(args=vars(a), n_train=len(train), n_heldout=len(held), mean_reward=mean_tr, references=refs,
               best=best, last=curve[-1], curve=curve, seconds=round(time.time() - t0, 1))
    print(json.dumps(dict(references=refs, best=best, last=curve[-1]), indent=1))
    if a.json:
        from pathlib import Path
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1))
    return res

if __name__ == "__main__":
    main()
