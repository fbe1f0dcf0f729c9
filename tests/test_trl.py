"""BPPO inside TRL (lesson 29_trl): `BPPOTrainer` runs on the tiny policy and trains exactly what the kit's BPPO
trains — two prefix-cut completions per mixed group, none of a group with one reward, the kit's advantages to 1e-6 —
and, for every `loss_type` it accepts (dapo, grpo, dr_grpo), with and without the KL, a step's loss and gradients equal
the kit's `BPPO.prepare` + `update` on the same completions (tolerances below, at `PAT`)."""
import copy, subprocess, sys, tempfile
import pytest, torch

pytest.importorskip("trl", reason="TRL is the optional `trl` extra: pip install bppo_kit[trl]")
pytest.importorskip("datasets", reason="datasets comes with the `trl` extra: pip install bppo_kit[trl]")
from types import SimpleNamespace
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig
from bppo_kit.bppo import BPPO, prefix_lengths, scheduled_ratio
from bppo_kit.config import data_dir, get_config
from bppo_kit.core import Completion, algo_settings
from bppo_kit.data import Example
from bppo_kit.integrations.trl import (KIT_DEFAULTS, LOSS_REDUCTION, BPPOConfig, BPPOTrainer, bppo_targets,
                                       compact_batch, row_scale)
from bppo_kit.policy import load_policy
from bppo_kit.sampler import PromptSource, score_rollout
from bppo_kit.update import update
from bppo_kit.verifier import reward_fn
from conftest import moved_policy

OUT = tempfile.TemporaryDirectory(prefix="bppo_trl_")  # TRL saves nothing here; removed at exit

needs_tiny = pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(),
                                reason="the shipped tiny policy is missing (run `make sft`)")
STEPS, B, G, MAX_NEW = 3, 4, 4, 64
# (BPPOConfig knobs, the same as the kit's overrides)
VARIANTS = {"defaults": ({}, []),
            "ratio-parity": (dict(prefix_mode="ratio", prefix_ratio=0.25, prefix_ratio_end=0.75, loss_scale="grpo"),
                             ["algo.bppo.prefix_mode=ratio", "algo.bppo.prefix_ratio=0.25",
                              "algo.bppo.prefix_ratio_end=0.75", "algo.bppo.loss_scale=grpo"])}


class Recording(BPPOTrainer):
    "`BPPOTrainer` keeping a copy of every micro-batch its loss sees"
    def _compute_loss(self, model, inputs):
        keys = ("bppo_index", "completion_ids", "completion_mask", "advantages", "num_items_in_batch")
        self.seen.append({k: inputs[k].detach().cpu().clone() for k in keys})
        return super()._compute_loss(model, inputs)


def run(knobs: dict):
    "STEPS steps of `Recording` on the tiny policy: the trainer, what the reward function graded, the EOS id"
    src = PromptSource(get_config("cpu-demo"))
    exs = [e for k in range(STEPS) for e in src(k)[:B]]
    ds = Dataset.from_dict(dict(prompt=[e.prompt for e in exs], answer=[e.answer for e in exs]))
    model, tok = load_policy("tiny")
    log = []
    def reward(completions, answer, completion_ids, **kw):
        out = reward_fn(completions, answer, task="synthetic")
        log.append(dict(texts=list(completions), answers=list(answer), ids=[list(x) for x in completion_ids],
                        rewards=out))
        return out
    args = BPPOConfig(output_dir=OUT.name, report_to="none", save_strategy="no",
                      logging_steps=1, disable_tqdm=True, use_cpu=True, seed=0, max_steps=STEPS, learning_rate=1e-4,
                      num_generations=G, per_device_train_batch_size=B * G // 2, gradient_accumulation_steps=2,
                      max_completion_length=MAX_NEW, top_k=0, shuffle_dataset=False, activation_checkpointing=False,
                      loss_type="dapo", beta=0.0,
                      generation_kwargs=dict(eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id), **knobs)
    trainer = Recording(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    trainer.seen = []
    trainer.train()
    return trainer, log, tok.eos_token_id


@pytest.fixture(scope="module", params=list(VARIANTS))
def trained(request):
    knobs, overrides = VARIANTS[request.param]
    trainer, log, eos = run(knobs)
    kcfg = get_config("cpu-demo", overrides=["algo.name=bppo", f"train.steps={STEPS}"] + overrides)
    return trainer, log, eos, kcfg


def step_view(trainer, log, eos, kcfg, step: int):
    "The step's rollout as the kit grades it, the kit's BPPO items by completion, and the rows the loss saw"
    c = log[step]
    cs = [Completion(i // G, [], ids, t, [], "eos") for i, (ids, t) in enumerate(zip(c["ids"], c["texts"]))]
    ro = score_rollout([Example("", a, "synthetic") for a in c["answers"][::G]], cs, G, eos)
    items, metrics = BPPO(kcfg).prepare(ro, step)
    where = {id(x.completion_ids): i for i, x in enumerate(cs)}
    kit = {where[id(it.completion_ids)]: it for it in items}  # completion index -> the kit's TrainItem
    per = len(trainer.seen) // len(log)
    rows = {}
    for s in trainer.seen[step * per:(step + 1) * per]:
        for r, i in enumerate(s["bppo_index"].tolist()):
            if i < 0:
                assert s["completion_mask"][r].sum() == 0 and s["advantages"][r] == 0
                continue  # an empty row
            assert i not in rows, f"completion {i} trained twice"
            rows[i] = (s["completion_ids"][r], s["completion_mask"][r], s["advantages"][r].item())
    return ro, kit, metrics, rows


@needs_tiny
def test_one_generation_per_step_two_micro_batches(trained):
    trainer, log, _, _ = trained
    assert len(log) == STEPS and all(len(c["ids"]) == B * G for c in log)
    assert len(trainer.seen) == 2 * STEPS


@needs_tiny
def test_two_prefix_cut_completions_per_mixed_group(trained):
    "Per mixed group: its shortest correct and shortest incorrect completion, each masked to its `prefix_lengths`"
    trainer, log, eos, kcfg = trained
    a, mixed_total = algo_settings(kcfg, "bppo"), 0
    for step in range(STEPS):
        ro, _, _, rows = step_view(trainer, log, eos, kcfg, step)
        ratio = scheduled_ratio(step, STEPS, a.prefix_ratio, a.prefix_ratio_end)
        for b in range(B):
            mine = sorted(i for i in rows if i // G == b)
            ok = ro.correct[b]
            if not (ok.any() and not ok.all()):
                assert mine == [], f"step {step}: group {b} has one reward, yet {mine} were trained"
                continue
            mixed_total += 1
            assert len(mine) == 2 and ok[mine[0] % G] != ok[mine[1] % G]  # one correct, one incorrect
            for i in mine:  # the shortest of its class (response tokens, EOS not counted)
                same = [b * G + j for j in range(G) if ok[j] == ok[i % G]]
                assert ro.lengths.flatten()[i] == min(ro.lengths.flatten()[j] for j in same)
            pair = sorted(mine, key=lambda i: not ok[i % G])  # [correct, incorrect]
            want = prefix_lengths(torch.tensor([[len(log[step]["ids"][i]) for i in pair]]), a.prefix_mode, ratio,
                                  a.prefix_tokens)[0].tolist()
            for i, n in zip(pair, want):
                ids, mask, _ = rows[i]
                assert mask.tolist() == [1] * n + [0] * (len(mask) - n), f"step {step}: row {i} is not its prefix"
                assert ids[:n].tolist() == log[step]["ids"][i][:n]
    assert mixed_total > 0, "no mixed group in the run: nothing was checked"


@needs_tiny
def test_advantages_and_prefixes_equal_the_kits_bppo(trained):
    "The same completions as the kit's `BPPO.prepare`, the same prefix lengths, advantages equal to 1e-6"
    trainer, log, eos, kcfg = trained
    for step in range(STEPS):
        _, kit, metrics, rows = step_view(trainer, log, eos, kcfg, step)
        assert sorted(rows) == sorted(kit)
        for i, (_, mask, adv) in rows.items():
            assert int(mask.sum()) == kit[i].end
            assert abs(adv - kit[i].advantage) <= 1e-6, (step, i, adv, kit[i].advantage)
        n_tok = sum(int(s["completion_mask"].sum()) for s in trainer.seen[2 * step:2 * step + 2])
        assert n_tok == metrics["prefix_tokens"]
        assert all(int(s["num_items_in_batch"]) == n_tok for s in trainer.seen[2 * step:2 * step + 2])
    logged = [h for h in trainer.state.log_history if "bppo/selected_sequences" in h]
    assert [int(h["bppo/selected_sequences"]) for h in logged] == [
        step_view(trainer, log, eos, kcfg, s)[2]["selected_sequences"] for s in range(STEPS)]


def test_gathered_groups_split_over_processes():
    "Two processes of 6 rows, groups of 4: a group straddles them, and their shares train the one-process rows"
    g = torch.Generator().manual_seed(1)
    ok = torch.tensor([[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    n = torch.randint(2, 9, (3, 4), generator=g)
    adv, keep, _ = bppo_targets(ok.float(), ok, n - 1, n, torch.ones(3, 4, dtype=torch.bool))
    batch = lambda rows: dict(prompt_ids=torch.zeros(len(rows), 2, dtype=torch.long),
                              prompt_mask=torch.ones(len(rows), 2, dtype=torch.long),
                              completion_ids=torch.arange(12)[rows, None].expand(-1, 9).clone(),
                              completion_mask=torch.ones(len(rows), 9, dtype=torch.long),
                              advantages=torch.zeros(len(rows)), num_items_in_batch=torch.tensor(0))
    shares = []
    for p in range(2):
        mine = torch.arange(6 * p, 6 * p + 6)
        out = compact_batch(batch(mine), adv.flatten()[mine], keep.flatten()[mine], mine, chunks=2)
        assert out["prompt_ids"].shape[0] % 2 == 0
        shares += [(i, a, int(m.sum())) for i, a, m in zip(out["bppo_index"].tolist(), out["advantages"].tolist(),
                                                            out["completion_mask"]) if i >= 0]
    want = [(i, adv.flatten()[i].item(), int(keep.flatten()[i])) for i in keep.flatten().nonzero().flatten().tolist()]
    assert sorted(shares) == want and len(want) == 4  # groups 0 and 1 mixed (1 straddles), group 2 all correct


def test_plain_grpo_config_gets_the_kits_defaults():
    args = GRPOConfig(output_dir=tempfile.gettempdir(), use_cpu=True, report_to="none", activation_checkpointing=False)
    fake = SimpleNamespace(args=args)
    assert {k: BPPOTrainer._bppo_knob(fake, k) for k in KIT_DEFAULTS} == KIT_DEFAULTS


def test_import_without_trl_names_the_extra():
    "Without TRL the module's import fails with one line that says what to install"
    code = "import sys; sys.modules['trl'] = None; import bppo_kit.integrations.trl"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: bppo_kit.integrations.trl needs TRL: pip install bppo_kit[trl]"), last


# BPPOTrainer's loss and gradients against the kit's BPPO (`BPPO.prepare` + `update`) on the same completions, for every
# loss_type BPPOTrainer accepts, on a tiny random Qwen2 in float32 (TRL's default bf16 autocast turned off). Three
# groups of four; the rewards `PAT` make every group mixed: 6 trained rows, which `compact_batch` pads to 8 for
# steps_per_generation=4, so TRL's grpo and dr_grpo count 2 empty rows (what `row_scale` corrects).
# Tolerances: the gradients relative, max |Δg| <= 1e-6 · the largest |g| of the model (measured <= 5e-7); the loss
# absolute, |Δloss| <= 1e-6 (it is ~1e-3 with the KL and 0 without: on-policy the pair's advantages cancel exactly).
PAT = [1., 0., 0., 0., 0., 1., 1., 0., 1., 1., 1., 0.]
NB, SPG, PAR_NEW = 3, 4, 32


class Stepped(BPPOTrainer):
    "`BPPOTrainer` keeping its cut batch and each micro-batch's loss; `unscaled` drops `row_scale` (the bug it fixes)"
    unscaled = False

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.cut = {k: v.detach().cpu().clone() for k, v in out.items() if torch.is_tensor(v)}
        return out

    def _compute_loss(self, model, inputs):
        if self.unscaled: inputs = inputs | dict(bppo_scale=torch.tensor(1.0))
        loss = super()._compute_loss(model, inputs)
        self.losses.append(loss.item())
        return loss


class Grads(TrainerCallback):
    "The gradient the optimizer is about to apply (accumulated over the step's micro-batches)"
    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}


# TRL passes no position ids: a left-padded prompt's positions start later than the kit's, which is the same in exact
# arithmetic (RoPE is relative) but not in float32 (~1e-5 of the gradient), so the prompts are of one length
def same_length_prompts(n: int) -> list:
    "The first `n` synthetic examples whose prompts have one length"
    by_len = {}
    for e in PromptSource(get_config("cpu-demo"))(0):
        by_len.setdefault(len(e.prompt), []).append(e)
        if len(by_len[len(e.prompt)]) == n: return by_len[len(e.prompt)]
    raise AssertionError(f"no {n} prompts of one length")


def trl_step(folder: str, loss_type: str, beta: float, unscaled: bool = False):
    "One `BPPOTrainer` step: the trainer (cut batch, losses), the gradient, the graded log, the kit's starting model"
    model, tok = moved_policy(folder)
    start = copy.deepcopy(model)  # before TRL patches the model's forward
    exs = same_length_prompts(NB)
    log = []
    def reward(prompts, completions, completion_ids, **kw):
        log.append(dict(prompts=list(prompts), texts=list(completions), ids=[list(x) for x in completion_ids]))
        return PAT[:len(completions)]
    args = BPPOConfig(output_dir=OUT.name, report_to="none", save_strategy="no",
                      disable_tqdm=True, use_cpu=True, bf16=False, seed=0, max_steps=1, learning_rate=1e-4,
                      num_generations=G, per_device_train_batch_size=NB * G // SPG, gradient_accumulation_steps=SPG,
                      max_completion_length=PAR_NEW, top_k=0, shuffle_dataset=False, activation_checkpointing=False,
                      loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=0.28, max_grad_norm=0.0,
                      generation_kwargs=dict(eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id))
    grads = Grads()
    ds = Dataset.from_dict(dict(prompt=[e.prompt for e in exs], answer=[e.answer for e in exs]))
    trainer = Stepped(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                      callbacks=[grads])
    trainer.losses, trainer.unscaled = [], unscaled
    trainer.train()
    return trainer, grads.grads, log[0], start, tok


def kit_step(folder: str, log: dict, start, tok, loss_type: str, beta: float):
    "The kit's BPPO on the completions TRL graded, rewards `PAT`: its items, and `update`'s loss and gradient"
    # TRL's use_bias_correction_kl is on by default: the kit's kl_bias_correction
    kcfg = get_config("cpu-demo", overrides=["algo.name=bppo", f"algo.reduction={LOSS_REDUCTION[loss_type]}",
                                             f"algo.beta={beta}", "algo.kl_bias_correction=true", "train.steps=1",
                                             f"rollout.max_new_tokens={PAR_NEW}", "train.grad_clip=1e9"])
    cs = [Completion(i // G, tok(p)["input_ids"], ids, t, [], "eos")
          for i, (p, ids, t) in enumerate(zip(log["prompts"], log["ids"], log["texts"]))]
    grade = lambda exs, cs: (PAT[:len(cs)], [r > 0 for r in PAT[:len(cs)]])
    ro = score_rollout([Example("", "", "synthetic")] * NB, cs, G, tok.eos_token_id, grade)
    items, _ = BPPO(kcfg).prepare(ro, 0)
    ref = load_policy(folder)[0] if beta else None
    mets = update(start, torch.optim.SGD(start.parameters(), lr=0.0), items, kcfg, tok.pad_token_id, ref_model=ref)
    return items, cs, mets["loss"], {n: p.grad for n, p in start.named_parameters()}


def grad_gap(a: dict, b: dict) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in b) / max(g.abs().max().item() for g in b.values())


@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("loss_type", list(LOSS_REDUCTION))
def test_loss_and_gradients_equal_the_kits_bppo(random_tiny, loss_type, beta):
    "A `BPPOTrainer` step's loss and gradient = the kit's `update` of `BPPO.prepare`'s items, for every loss_type"
    trainer, tgrads, log, start, tok = trl_step(random_tiny, loss_type, beta)
    items, cs, kloss, kgrads = kit_step(random_tiny, log, start, tok, loss_type, beta)
    cut = trainer.cut
    live = cut["bppo_index"] >= 0
    assert int(live.sum()) == len(items) == 6 and len(live) == 8  # 6 trained rows, 2 empty ones
    for r in live.nonzero().flatten().tolist():  # the kit's prompt ids are the ones TRL trained
        prompt = cut["prompt_ids"][r][cut["prompt_mask"][r].bool()].tolist()
        assert prompt == cs[int(cut["bppo_index"][r])].prompt_ids
    want = row_scale(loss_type, 8, 1, 6)
    assert float(cut["bppo_scale"]) == pytest.approx(want) and (want != 1.0) == (loss_type != "dapo")
    dl, dg = abs(sum(trainer.losses) - kloss), grad_gap(kgrads, tgrads)
    print(f"BPPOTrainer {loss_type}, beta {beta}: loss {dl:.1e} (absolute), grad {dg:.1e} (relative)")
    assert len(trainer.losses) == SPG and dl <= 1e-6 and dg <= 1e-6


def test_without_row_scale_grpo_is_three_quarters_of_the_kits(random_tiny):
    "The twin that must not match: TRL's grpo counting the 2 empty rows gives 6/8 of the kit's gradient (KL included)"
    trainer, tgrads, log, start, tok = trl_step(random_tiny, "grpo", 0.05, unscaled=True)
    _, _, kloss, kgrads = kit_step(random_tiny, log, start, tok, "grpo", 0.05)
    assert grad_gap(kgrads, tgrads) > 0.1
    assert grad_gap({n: g * 0.75 for n, g in kgrads.items()}, tgrads) <= 1e-6
    assert abs(sum(trainer.losses) - 0.75 * kloss) <= 1e-6


def test_refused_loss_types_name_the_field(random_tiny):
    "bnpo (per micro-batch tokens) and the other surrogates are refused, from BPPOConfig and from a plain GRPOConfig"
    with pytest.raises(ValueError, match=r"loss_type must be one of \('dapo', 'grpo', 'dr_grpo'\)"):
        BPPOConfig(output_dir=tempfile.gettempdir(), use_cpu=True, report_to="none", loss_type="bnpo")
    model, tok = load_policy(random_tiny)
    args = GRPOConfig(output_dir=tempfile.gettempdir(), use_cpu=True, report_to="none", loss_type="sapo",
                      activation_checkpointing=False, num_generations=G, per_device_train_batch_size=G)
    ds = Dataset.from_dict(dict(prompt=["Q: 1+1"]))
    with pytest.raises(ValueError, match="loss_type must be one of"):
        BPPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                    train_dataset=ds, processing_class=tok)
