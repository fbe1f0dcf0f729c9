"""The kit's GRPO against TRL's own (issue 30): TRL's `GRPOTrainer._compute_loss` and `_generate_and_score_completions`
(`trl/trainer/grpo_trainer.py`) on one batch — prompts, completions, advantages, old and reference log-probs — and a
tiny random Qwen2 in float32 on the CPU.

- Loss and gradients: the kit's update path (`bppo_kit.update.update`, as the trainer calls it, on-policy with a
  reference model; `update_epoch`, which `update` calls, with given off-policy old and reference log-probs, so the clip
  acts) against a real `GRPOTrainer`'s `_compute_loss`, for each reduction the two share — kit `algo.reduction`
  token / seq / constant = TRL `loss_type` dapo / grpo / dr_grpo (TRL's constant is `max_completion_length`, the
  kit's `rollout.max_new_tokens`) — without KL, with the k3 KL (`beta` > 0), and with TRL's bias-corrected KL
  (`use_bias_correction_kl` = the kit's `algo.kl_bias_correction`).
- Advantages: TRL's (Bessel std, eps 1e-4) equal the kit's `GRPO.prepare` with `algo.adv_std=bessel` and
  `algo.adv_eps=1e-4`, for each `scale_rewards` (= `algo.adv_scale`); with the kit's defaults they do not.
- `TRL_DEFAULTS` (the GRPO lesson) is `GRPOConfig()`'s defaults in the kit's terms.

Tolerances, relative: the loss |Δ| <= 1e-6·|loss_TRL|; the gradients max |Δg| over every entry of every parameter
<= 1e-6 · the largest |g_TRL| of the model (measured ~1e-7 and ~4e-7: float32 summation order). The advantages,
which are O(1), within 1e-6 absolute. TRL runs with `bf16=False`: its default autocasts to bfloat16 even on the CPU.
Each comparison has a twin that must not match (another reduction, the other KL, the kit's default advantages)."""
import tempfile
from functools import partial
import pytest, torch

pytest.importorskip("trl", reason="TRL is the optional `trl` extra: pip install bppo_kit[trl]")
pytest.importorskip("datasets", reason="datasets comes with the `trl` extra: pip install bppo_kit[trl]")
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from bppo_kit.config import get_config
from bppo_kit.core import Completion, Rollout, TrainItem, clipped_surrogate
from bppo_kit.data import Example
from bppo_kit.grpo import GRPO, TRL_DEFAULTS
from bppo_kit.policy import char_tokenizer, load_policy
from conftest import moved_policy
from bppo_kit.update import UpdateContext, micro_batch_tensors, policy_logprobs, update, update_epoch

OUT = tempfile.TemporaryDirectory(prefix="trl_parity_")  # TRL saves nothing here; removed at exit

B, G, P, C = 8, 4, 5, 8  # completions (two groups), group size, prompt tokens, max_completion_length
PAIRS = {"token": "dapo", "seq": "grpo", "constant": "dr_grpo"}  # kit reduction -> TRL loss_type
KL = {"none": (0.0, False), "k3": (0.1, False), "k3*ratio": (0.1, True)}  # (beta, bias-corrected)
REL = 1e-6


@pytest.fixture(scope="module")
def batch(random_tiny):
    "One batch: equal-length prompts (no left padding: both sides see the same positions), completions of 1..C tokens"
    g = torch.Generator().manual_seed(1)
    V = len(char_tokenizer())
    lens = torch.randint(1, C + 1, (B,), generator=g)
    lens[0] = C  # the widest completion sets both sides' width
    cmask = (torch.arange(C)[None] < lens[:, None]).long()
    adv = GRPO(get_config("cpu-demo")).prepare(rollout(torch.rand(B // G, G, generator=g)))[0]
    adv = torch.tensor([it.advantage for it in adv])
    adv[3] = 0.0  # a row with nothing to train still counts in every denominator
    return dict(prompt_ids=torch.randint(3, V, (B, P), generator=g), prompt_mask=torch.ones(B, P, dtype=torch.long),
                completion_ids=torch.randint(3, V, (B, C), generator=g) * cmask, completion_mask=cmask,
                advantages=adv, num_items_in_batch=cmask.sum())


def rollout(rewards: torch.Tensor) -> Rollout:
    "A `Rollout` of `rewards` [B, G] (completions of one token: only the rewards matter here)"
    n, G_ = rewards.shape
    cs = [Completion(i // G_, [5], [6], "", [], "eos") for i in range(n * G_)]
    return Rollout([Example("q", "1")] * n, cs, rewards, rewards > 0.5, torch.ones(n, G_, dtype=torch.long))


def items_of(b: dict) -> list[TrainItem]:
    lens = b["completion_mask"].sum(1).tolist()
    return [TrainItem(b["prompt_ids"][i].tolist(), b["completion_ids"][i, :n].tolist(), b["advantages"][i].item(), n)
            for i, n in enumerate(lens)]


def kit_cfg(reduction: str, beta: float, corrected: bool):
    return get_config("cpu-demo", overrides=[f"algo.reduction={reduction}", f"algo.beta={beta}",
                                             f"algo.kl_bias_correction={corrected}", f"rollout.max_new_tokens={C}",
                                             "algo.eps_low=0.2", "algo.eps_high=0.28", "train.grad_clip=1e9"])


def trl_trainer(model, tok, loss_type: str, beta: float, corrected: bool, **kw) -> GRPOTrainer:
    "A real `GRPOTrainer` on `model`, as one optimizer step over one micro-batch of the batch sees it"
    args = GRPOConfig(output_dir=OUT.name, report_to="none", use_cpu=True, bf16=False,
                      num_generations=G, per_device_train_batch_size=B, max_completion_length=C, loss_type=loss_type,
                      beta=beta, use_bias_correction_kl=corrected, epsilon=0.2, epsilon_high=0.28,
                      activation_checkpointing=False, disable_tqdm=True, save_strategy="no", **kw)
    ds = Dataset.from_dict(dict(prompt=["Q: 1+1"] * (B // G)))
    tr = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [0.0] * len(completions), args=args,
                     train_dataset=ds, processing_class=tok)
    tr.current_gradient_accumulation_steps = 1  # what Trainer's loop sets for a window of one micro-batch
    return tr


def trl_ref_logps(tr: GRPOTrainer, b: dict) -> torch.Tensor:
    "The reference log-probs as `_generate_and_score_completions` computes them (TRL's reference model)"
    with torch.no_grad():
        return tr._get_per_token_logps_and_entropies(
            tr.ref_model, torch.cat([b["prompt_ids"], b["completion_ids"]], 1),
            torch.cat([b["prompt_mask"], b["completion_mask"]], 1), C)[0]


def trl_loss_grads(tr: GRPOTrainer, b: dict) -> tuple[float, dict]:
    "TRL's `_compute_loss` of the batch `b` (a dict as TRL's own batches), backward: the loss and the gradients"
    tr.model.train()
    tr.model.zero_grad(set_to_none=True)
    loss = tr._compute_loss(tr.model, b)
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in tr.model.named_parameters()}


def grads_of(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def gap(kit: tuple, trl: tuple) -> tuple[float, float]:
    "(relative loss gap, largest gradient gap over the largest TRL gradient entry)"
    (kl, kg), (tl, tg) = kit, trl
    scale = max(g.abs().max().item() for g in tg.values())
    return abs(kl - tl) / abs(tl), max((kg[n] - tg[n]).abs().max().item() for n in tg) / scale


def kit_update(folder: str, b: dict, reduction: str, beta: float, corrected: bool) -> tuple[float, dict]:
    "The kit's `update` (as the trainer calls it), on-policy, with the saved model as reference: loss and gradients"
    model, tok = moved_policy(folder)
    ref = load_policy(folder)[0] if beta else None
    mets = update(model, torch.optim.SGD(model.parameters(), lr=0.0), items_of(b), kit_cfg(reduction, beta, corrected),
                  tok.pad_token_id, ref_model=ref)
    return mets["loss"], grads_of(model)


def kit_epoch(folder: str, b: dict, old: torch.Tensor, ref: torch.Tensor, reduction: str, beta: float,
              corrected: bool) -> tuple[float, dict, float]:
    "The kit's `update_epoch` with given old and reference log-probs [B, C]: loss, gradients and clipped tokens"
    model, tok = moved_policy(folder)
    cfg, items = kit_cfg(reduction, beta, corrected), items_of(b)
    mb = micro_batch_tensors(items, tok.pad_token_id)
    assert mb.mask.shape == (B, C)
    # `update`'s denominators and surrogate
    n_tokens, n_seqs = sum(it.end for it in items), sum(it.end > 0 for it in items)
    surrogate = partial(clipped_surrogate, eps_low=cfg.algo.eps_low, eps_high=cfg.algo.eps_high)
    mb.old, mb.ref = old, ref if beta else None
    model.train()
    model.zero_grad(set_to_none=True)
    tot = update_epoch(model, [mb], UpdateContext(cfg, surrogate, n_seqs, n_tokens, tok.pad_token_id))
    return tot["loss"], grads_of(model), tot["clip"]


@pytest.mark.parametrize("kl", list(KL))
@pytest.mark.parametrize("reduction", list(PAIRS))
def test_update_equals_trl_compute_loss(random_tiny, batch, reduction, kl):
    "On-policy (TRL's `num_iterations=1`: old = the current log-probs), the reference model's log-probs by each side"
    beta, corrected = KL[kl]
    model, tok = moved_policy(random_tiny)
    tr = trl_trainer(model, tok, PAIRS[reduction], beta, corrected)
    b = dict(batch, ref_per_token_logps=trl_ref_logps(tr, batch)) if beta else batch
    trl = trl_loss_grads(tr, b)
    dl, dg = gap(kit_update(random_tiny, batch, reduction, beta, corrected), trl)
    print(f"update vs TRL {PAIRS[reduction]}, KL {kl}: loss {dl:.1e}, grad {dg:.1e} (relative)")
    assert dl <= REL and dg <= REL
    # the twin that must not match: the same batch under another reduction
    other = {"token": "seq", "seq": "constant", "constant": "token"}[reduction]
    assert gap(kit_update(random_tiny, batch, other, beta, corrected), trl)[1] > 1e-3


@pytest.fixture(scope="module")
def off_policy(random_tiny, batch):
    "Old and reference log-probs [B, C] away from the policy's: ratios of ~0.6 to 1.7, so the clip acts both ways"
    model, tok = moved_policy(random_tiny)
    mb = micro_batch_tensors(items_of(batch), tok.pad_token_id)
    lp = policy_logprobs(model, mb.batch, mb.mask, kit_cfg("token", 0.0, False))
    g = torch.Generator().manual_seed(2)
    return lp + 0.25 * torch.randn(B, C, generator=g), lp + 0.5 * torch.randn(B, C, generator=g)


@pytest.mark.parametrize("kl", list(KL))
@pytest.mark.parametrize("reduction", list(PAIRS))
def test_update_epoch_equals_trl_off_policy(random_tiny, batch, off_policy, reduction, kl):
    "Given old and reference log-probs (TRL's `old_per_token_logps`, `ref_per_token_logps`): the clip, the KL's ratio"
    beta, corrected = KL[kl]
    old, ref = off_policy
    model, tok = moved_policy(random_tiny)
    tr = trl_trainer(model, tok, PAIRS[reduction], beta, corrected)
    trl = trl_loss_grads(tr, dict(batch, old_per_token_logps=old, ref_per_token_logps=ref))
    loss, grads, clipped = kit_epoch(random_tiny, batch, old, ref, reduction, beta, corrected)
    dl, dg = gap((loss, grads), trl)
    print(f"update_epoch vs TRL {PAIRS[reduction]} off-policy, KL {kl}: loss {dl:.1e}, grad {dg:.1e} (relative)")
    assert clipped > 0  # the clip acted on some tokens
    assert dl <= REL and dg <= REL
    if beta:  # the twin: the other KL (plain k3 for corrected, and back) does not match off-policy
        loss2, grads2, _ = kit_epoch(random_tiny, batch, old, ref, reduction, beta, not corrected)
        assert max(gap((loss2, grads2), trl)) > 1e-3


class Scored(GRPOTrainer):
    "`GRPOTrainer` keeping the advantages `_generate_and_score_completions` computes"
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.advantages.append(out["advantages"].detach().cpu().clone())
        return out


# binary, real-valued, all equal (exactly: no rounding noise), and a group with one odd member
REWARDS = torch.tensor([[1., 0., 0., 1.], [.3, .9, .1, .5], [1., 1., 1., 1.], [.2, .7, .7, .7]])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_equal_trl(random_tiny, scale):
    "TRL's advantages of a generation batch (a real step, rewards given) = `GRPO.prepare` with TRL's std and eps"
    model, tok = load_policy(random_tiny)
    rewards = REWARDS.flatten().tolist()
    nB = REWARDS.shape[0]
    args = GRPOConfig(output_dir=OUT.name, report_to="none", use_cpu=True, bf16=False,
                      num_generations=G, per_device_train_batch_size=nB * G, max_completion_length=4, max_steps=1,
                      scale_rewards=scale, shuffle_dataset=False, activation_checkpointing=False, disable_tqdm=True,
                      save_strategy="no", logging_steps=1, seed=0)
    ds = Dataset.from_dict(dict(prompt=[f"Q: {k}+1" for k in range(nB)]))
    tr = Scored(model=model, reward_funcs=lambda completions, **k: rewards[:len(completions)], args=args,
                train_dataset=ds, processing_class=tok)
    tr.advantages = []
    tr.train()
    (trl,) = tr.advantages
    ro = rollout(REWARDS)
    kit = lambda over: torch.tensor([it.advantage for it in GRPO(get_config("cpu-demo", overrides=[
        f"algo.adv_scale={scale}", *over])).prepare(ro)[0]])
    got = kit(["algo.adv_std=bessel", "algo.adv_eps=1e-4"])
    print(f"advantages vs TRL scale_rewards={scale}: max |diff| {(got - trl).abs().max().item():.1e}")
    assert (got - trl).abs().max() <= 1e-6
    assert trl.abs().max() >= 0.5  # something to compare
    if scale != "none":  # the kit's defaults (population std, 1e-6) are not TRL's
        assert (kit([]) - trl).abs().max() > 1e-2


def test_trl_defaults_are_grpo_configs():
    "`TRL_DEFAULTS` in the kit's terms is a default `GRPOConfig`; the two agree on what the list leaves alone"
    a = GRPOConfig(output_dir=tempfile.gettempdir(), use_cpu=True, report_to="none", activation_checkpointing=False)
    c, kit = get_config("cpu-demo", overrides=TRL_DEFAULTS), get_config("cpu-demo")
    reduction = {v: k for k, v in PAIRS.items()}[a.loss_type]
    eps_high = a.epsilon if a.epsilon_high is None else a.epsilon_high  # as GRPOTrainer reads it
    assert (c.algo.reduction, c.algo.adv_scale, c.algo.eps_low, c.algo.eps_high, c.algo.kl_bias_correction) == (
        reduction, a.scale_rewards, a.epsilon, eps_high, a.use_bias_correction_kl)
    # TRL's advantage std and eps are in its code, not its config: test_advantages_equal_trl checks them
    assert (c.algo.adv_std, c.algo.adv_eps) == ("bessel", 1e-4)
    assert (kit.algo.beta, kit.train.mu, kit.rollout.temperature) == (a.beta, a.num_iterations, a.temperature)
    assert c.algo.eps_high != kit.algo.eps_high  # (the list does change something)
