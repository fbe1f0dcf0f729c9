"""The behaviour log-probs under top-p / top-k are the sampler's (issue 52, item 3).

Every engine records, with each token, its log-prob under the distribution it was drawn from: the logits at the
temperature, cut to top-k then top-p, renormalised over the kept tokens. Checked here on the kit engine, the HF engine
and vLLM's path (the computing stand-in tests/fake_vllm, which truncates as vLLM's sampler does), against a plain
reference written below (the smallest set of the most likely tokens whose probability reaches top-p). The importance
weight w = exp(trainer - behaviour) the update divides by is then the kept mass at each position: below 1 under
truncation, and 1 (to float error) without it; `sampler_kl`, its monitor, moves off 0 with it."""

import pytest
import torch

from conftest import install_fake_vllm
from bppo_kit.config import data_dir
from bppo_kit.policy import completion_logprobs, load_policy, pack, resolve_policy_path
from bppo_kit.rollout import HFEngine, KitEngine, SamplingParams, VLLMEngine
from bppo_kit.update import sampler_kl, tis_weights

pytestmark = pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(),
                                reason="needs the shipped policy in data/tiny_policy")
PROMPTS = ["Q: 1+2\nA:", "Q: (3*4)-5\nA:", "Q: 7\nA:", "Q: 12*(3+4)\nA:"]
TRUNCATED = [dict(temperature=1.0, top_p=0.8), dict(temperature=1.0, top_k=2),
             dict(temperature=1.2, top_k=5, top_p=0.9)]


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny")


@pytest.fixture()
def engines(policy, monkeypatch):
    "The three engines over the shipped policy; vLLM's the stand-in that samples the policy's folder"
    install_fake_vllm(monkeypatch, compute=True)
    m, tok = policy
    return dict(kit=KitEngine(m, tok), hf=HFEngine(m, tok),
                vllm=VLLMEngine(m, tok, resolve_policy_path("tiny"), max_model_len=512))


def truncated_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_k: int = 0,
                       top_p: float = 1.0) -> torch.Tensor:
    "Reference: log-probs of `targets` [N] under `logits` [N, V] at `temperature`, kept to top-k then top-p"
    z = logits.double() / temperature
    keep = torch.ones_like(z, dtype=torch.bool)
    if top_k: keep &= z >= z.topk(top_k, -1).values[:, -1:]
    z = z.masked_fill(~keep, float("-inf"))
    if top_p < 1:
        p, order = z.softmax(-1).sort(-1, descending=True)
        # the most likely tokens until their mass reaches top_p (the token that reaches it included)
        before = p.cumsum(-1) - p
        keep = torch.zeros_like(keep).scatter(-1, order, before < top_p)
        z = z.masked_fill(~keep, float("-inf"))
    return z.log_softmax(-1).gather(-1, targets[:, None])[:, 0]


def recorded_and_reference(m, tok, cs, s: dict):
    "Per-token (behaviour log-probs recorded, the reference's, the trainer's at the temperature) of completions `cs`"
    b = pack([c.prompt_ids for c in cs], [c.completion_ids for c in cs], tok.pad_token_id)
    P, mask = b["prompt_len"], b["completion_mask"][:, b["prompt_len"]:].bool()
    with torch.no_grad():
        logits = m(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                   position_ids=b["position_ids"]).logits[:, P - 1:-1].float()
        trainer = completion_logprobs(m, b, temperature=s["temperature"])[mask]
    ref = truncated_logprobs(logits[mask], b["input_ids"][:, P:][mask], **s).float()
    rec = torch.cat([torch.tensor(c.logprobs) for c in cs])
    return rec, ref, trainer


@pytest.mark.parametrize("name", ["kit", "hf", "vllm"])
@pytest.mark.parametrize("s", TRUNCATED, ids=["top_p", "top_k", "both"])
def test_behaviour_logprobs_are_the_samplers(policy, engines, name, s):
    m, tok = policy
    cs = engines[name].generate(PROMPTS, 4, SamplingParams(max_new_tokens=60, seed=3, **s))
    assert all(len(c.logprobs) == c.n_tokens > 0 for c in cs)
    rec, ref, trainer = recorded_and_reference(m, tok, cs, s)
    assert (rec - ref).abs().max() < 1e-4, (rec - ref).abs().max()
    # the importance weight is the kept mass: never above 1, and off 1 where truncation removed some
    w = tis_weights(trainer, rec, cap=float("inf"))
    # (measured on the shipped policy: 0.012 to 0.023 with these settings; untruncated, below 1e-4)
    assert w.max() < 1 + 1e-4 and (w - 1).abs().mean() > 0.005, ((w - 1).abs().mean(), w.max())
    assert sampler_kl(trainer, rec).mean() > 1e-4


@pytest.mark.parametrize("name", ["kit", "hf", "vllm"])
def test_untruncated_logprobs_are_the_policys(policy, engines, name):
    "top_p = 1, top_k = 0: the behaviour is the policy at the temperature, the weight 1 and sampler_kl 0"
    m, tok = policy
    s = dict(temperature=0.8)
    cs = engines[name].generate(PROMPTS, 4, SamplingParams(max_new_tokens=60, seed=3, **s))
    rec, ref, trainer = recorded_and_reference(m, tok, cs, s)
    assert (rec - ref).abs().max() < 1e-4 and (rec - trainer).abs().max() < 1e-4
    w = tis_weights(trainer, rec, cap=float("inf"))
    assert (w - 1).abs().mean() < 1e-4 and sampler_kl(trainer, rec).abs().mean() < 1e-6


def test_reference_truncation_by_hand():
    "The reference on one row: p = (0.5, 0.3, 0.15, 0.05)"
    lg = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4))
    t = torch.tensor([0, 1, 2, 1])
    got = truncated_logprobs(lg, t, 1.0, top_p=0.7)  # 0.5 < 0.7 <= 0.8: tokens 0 and 1 kept
    assert torch.allclose(got, torch.log(torch.tensor([0.625, 0.375, 0.0, 0.375])).double())
    got = truncated_logprobs(lg, t, 1.0, top_k=3)
    assert torch.allclose(got, torch.log(torch.tensor([0.5, 0.3, 0.15, 0.3]) / 0.95).double())
