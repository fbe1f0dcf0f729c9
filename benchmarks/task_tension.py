"""Does the synthetic task have the tension BPPO needs? A short GRPO run on the shipped policy, watching style and length.

The failure this guards against (seen in a pilot of an earlier task design): plain GRPO shortened responses by itself,
collapsing to the concise style, which left BPPO nothing to show. Here GRPO runs in its original form (per-sequence
mean of token losses, group-std advantages, on-policy, no KL) for a few dozen steps; the script records, per step, the
share of verbose samples, mean response length and accuracy, and writes them to JSON.

    python benchmarks/task_tension.py --steps 60 --json runs/task_tension.json

This is a pilot built from the package's pieces (engine, verifier, grpo maths); the trainer lesson's loop supersedes it.
"""
import argparse, json, random, time
from pathlib import Path
import torch
from bppo_kit.data import synthetic_stream, synthetic_example, style_of
from bppo_kit.evaluate import response_tokens
from bppo_kit.grpo import group_advantages, grpo_loss
from bppo_kit.policy import completion_logprobs, load_policy, pack
from bppo_kit.rollout import HFEngine, SamplingParams
from bppo_kit.verifier import score

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--reduction", default="seq", choices=["seq", "token", "constant"])
    ap.add_argument("--checkpoint", default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="runs/task_tension.json")
    a = ap.parse_args()
    torch.manual_seed(a.seed); random.seed(a.seed)
    model, tok = load_policy(a.checkpoint)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
    eng, stream, log = HFEngine(model, tok), synthetic_stream(a.seed + 1), []
    t0 = time.time()
    for step in range(a.steps):
        ex = [synthetic_example(next(stream)) for _ in range(a.prompts)]
        model.eval()
        cs = eng.generate([e.prompt for e in ex], a.group, SamplingParams(seed=a.seed * 100_000 + step))
        ok = torch.tensor([float(score(c.text, ex[c.prompt_index].answer, "synthetic").correct) for c in cs])
        adv = group_advantages(ok.view(a.prompts, a.group)).flatten()
        model.train()
        b = pack([c.prompt_ids for c in cs], [c.completion_ids for c in cs], tok.pad_token_id)
        lp = completion_logprobs(model, b)
        mask = b["completion_mask"][:, b["prompt_len"]:]
        loss, _ = grpo_loss(lp, lp.detach(), adv, mask, reduction=a.reduction)
        opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
        verbose = [style_of(c.text) == "verbose" for c in cs]
        n = [response_tokens(c, tok.eos_token_id) for c in cs]
        row = dict(step=step, accuracy=ok.mean().item(), verbose_frac=sum(verbose) / len(cs), tokens=sum(n) / len(n),
                   acc_concise=(sum(o for o, v in zip(ok.tolist(), verbose) if not v) / max(1, verbose.count(False))),
                   acc_verbose=(sum(o for o, v in zip(ok.tolist(), verbose) if v) / max(1, verbose.count(True))),
                   wall_s=round(time.time() - t0, 1))
        log.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    first, last = log[:10], log[-10:]
    avg = lambda rows, k: round(sum(r[k] for r in rows) / len(rows), 4)
    summary = {k: {"first10": avg(first, k), "last10": avg(last, k)} for k in ("accuracy", "verbose_frac", "tokens")}
    out = dict(args=vars(a), summary=summary, steps=log)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True); Path(a.json).write_text(json.dumps(out, indent=1))
    print(json.dumps(summary))

if __name__ == "__main__": main()
