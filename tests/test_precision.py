"The real-model path's precision: bf16 trains like fp32, the first epoch's ratio is 1, odd heads are refused, TIS."
import copy, json
import pytest, torch
from transformers import AutoModelForCausalLM, PhiConfig, Qwen2ForCausalLM
import bppo_kit.update as upd
from bppo_kit.config import ConfigError, data_dir, get_config
from bppo_kit.core import TrainItem, clipped_surrogate
from bppo_kit.policy import DTYPES, char_tokenizer, tiny_config
from bppo_kit.runs import open_run
from bppo_kit.trainer import setup, train
from bppo_kit.update import update

pytestmark = pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(),
                                reason="needs the shipped policy in data/tiny_policy")
SMALL = ["train.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=120", "data.eval_size=4"]

def moved(model, w0) -> torch.Tensor:
    return torch.cat([(p.detach() - w).flatten() for p, w in zip(model.parameters(), w0)])

def test_bf16_update_agrees_with_fp32(tmp_path):
    "2 GRPO steps at lr 1e-6 on the same rollouts: bf16 autocast over fp32 masters moves what fp32 moves, the same way"
    ov = SMALL + ["train.lr=1e-6", f"train.out={tmp_path}/a"]
    cfg, c16 = get_config("cpu-demo", overrides=ov), get_config("cpu-demo", overrides=ov + ["model.dtype=bfloat16"])
    s = setup(cfg, open_run(cfg))
    w0 = [p.detach().clone() for p in s.model.parameters()]
    m16, old = copy.deepcopy(s.model), copy.deepcopy(s.model).bfloat16()  # old: the weights themselves in bf16
    opt = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-6, betas=(0.9, 0.99), weight_decay=0.0)
    o16, o_old = opt(m16), opt(old)
    for step in range(2):
        items, _ = s.algo.collect(step, s.sampler)
        for m, o, c in ((s.model, s.opt, cfg), (m16, o16, c16), (old, o_old, cfg)):
            update(m, o, items, c, s.tok.pad_token_id)
    d32, d16 = moved(s.model, w0), moved(m16, w0)
    d_old = torch.cat([(p.detach().float() - w.bfloat16().float()).flatten() for p, w in zip(old.parameters(), w0)])
    both = ((d32 != 0) & (d16 != 0)).sum() / (d32 != 0).sum()
    cos = torch.nn.functional.cosine_similarity(d32, d16, 0)
    print(f"moved: fp32 {(d32 != 0).float().mean():.6f}, bf16 autocast {(d16 != 0).float().mean():.6f} "
          f"(of fp32's: {both:.6f}), bf16 weights {(d_old != 0).float().mean():.6f}; cos {cos:.4f}, "
          f"norm ratio {d16.norm() / d32.norm():.4f}")
    assert (d32 != 0).float().mean() > 0.999 and both > 0.9999  # all but elements of one-ulp fp32 moves
    assert all((p.detach() != w).any() for p, w in zip(m16.parameters(), w0))  # every tensor moved
    assert cos >= 0.99 and 0.9 <= d16.norm() / d32.norm() <= 1.1
    assert (d_old != 0).float().mean() < 0.1  # the fault this replaces: bf16 weights keep almost none of it

@pytest.mark.parametrize("kernel", ["naive", "chunked"])
def test_first_epoch_ratio_is_one_in_bf16(tmp_path, kernel, monkeypatch):
    "mu = 2 in bf16: the ratio of the first epoch is exactly 1 (old log-probs from the loss path's own computation)"
    cfg = get_config("cpu-demo", overrides=SMALL + ["model.dtype=bfloat16", "train.mu=2",
                                                    f"train.loss_kernel={kernel}", f"train.out={tmp_path}/r"])
    s = setup(cfg, open_run(cfg))
    items, _ = s.algo.collect(0, s.sampler)
    ratios = []
    def record_surrogate(logp, old_logp, adv):
        ratios.append(torch.exp(logp - old_logp).detach()[adv != 0])
        return clipped_surrogate(logp, old_logp, adv)
    real = upd.prefix_policy_loss
    def record_kernel(h, W, targets, old, adv, m, *a, **kw):
        out = real(h, W, targets, old, adv, m, *a, **kw)
        if h.requires_grad: ratios.append(out[1]["ratio"][m.bool()])
        return out
    monkeypatch.setattr(upd, "prefix_policy_loss", record_kernel)
    n_batches = -(-len(upd.trainable(items)) // cfg.train.micro_batch)
    update(s.model, s.opt, items, cfg, s.tok.pad_token_id, surrogate=record_surrogate)
    first = torch.cat(ratios[:n_batches])
    assert first.numel() > 0 and (first - 1).abs().max() <= 1e-6, (first - 1).abs().max()

def test_fused_loss_refuses_a_head_with_a_bias(tmp_path):
    "A Phi model (LM head with a bias) and a fused loss: a one-line ConfigError naming the model type and the fix"
    tok = char_tokenizer()
    phi = AutoModelForCausalLM.from_config(PhiConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                                     num_hidden_layers=1, num_attention_heads=2,
                                                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
    phi.save_pretrained(tmp_path / "phi")
    tok.save_pretrained(tmp_path / "phi")
    ov = [f"model.name_or_path={tmp_path / 'phi'}", "rollout.engine=hf", f"train.out={tmp_path}/run"]
    with pytest.raises(ConfigError) as e:
        train(get_config("cpu-demo", overrides=ov + ["train.loss_kernel=chunked"]), progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "phi" in msg and "bias" in msg and "train.loss_kernel=naive" in msg

def test_bf16_run_logs_the_sampler_mismatch(tmp_path):
    "A bf16 run decodes from a bf16 copy: TIS is applied and each step logs sampler_kl and tis_capped; fp32 logs none"
    rows = {}
    for dt in ("float32", "bfloat16"):
        ov = SMALL + [f"model.dtype={dt}", "train.steps=2", f"train.out={tmp_path}/{dt}"]
        cfg = get_config("cpu-demo", overrides=ov)
        train(cfg, progress=False, evaluate_every=False)
        rows[dt] = [json.loads(l) for l in (tmp_path / dt / "metrics.jsonl").read_text().splitlines()]
    assert all("sampler_kl" not in r for r in rows["float32"])
    assert len(rows["bfloat16"]) == 2
    for r in rows["bfloat16"]:
        assert 0 < r["sampler_kl"] < 0.1 and 0 <= r["tis_capped"] < 0.05, r

def _small_qwen(tok):
    "A random one-layer Qwen2 with an untied head: the head's gradient comes only through the fused loss's weight"
    c = tiny_config(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    c.tie_word_embeddings = False
    torch.manual_seed(0)
    return Qwen2ForCausalLM(c)

def _head_grad(dtype, kernel, monkeypatch=None):
    "Run one `update` (mu = 2, lr 0) on fixed items; the calls the fused loss got, and the head's gradient"
    tok = char_tokenizer()
    model = _small_qwen(tok)
    items = [TrainItem(tok("Q: 1+2\nA:")["input_ids"], tok(s)["input_ids"] + [tok.eos_token_id], a, end=n)
             for s, a, n in (("3 #### 3", 1.0, 5), ("4", -1.0, 2), ("12", 0.5, 3))]
    cfg = get_config("cpu-demo", overrides=[f"model.dtype={dtype}", f"train.loss_kernel={kernel}", "train.mu=2",
                                            "train.micro_batch=2"])
    calls, real = [], upd.prefix_policy_loss
    def spy(h, W, *a, **kw):
        calls.append((h.dtype, W.dtype, h.requires_grad))
        return real(h, W, *a, **kw)
    if monkeypatch is not None: monkeypatch.setattr(upd, "prefix_policy_loss", spy)
    mets = update(model, torch.optim.SGD(model.parameters(), lr=0.0), items, cfg, tok.pad_token_id)
    assert mets["skipped"] == 0 and mets["trained_tokens"] == 2 * 10, mets
    return calls, model.get_output_embeddings().weight

@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fused_loss_runs_in_the_compute_dtype(dtype, monkeypatch):
    "The fused loss gets hidden states and the head weight in model.dtype; the float32 master head gets its gradient"
    calls, head = _head_grad(dtype, "chunked", monkeypatch)
    want = DTYPES[dtype]
    # per micro-batch: the old log-probs (mu = 2, no gradient), then one loss per epoch
    assert len(calls) == 2 * 3 and all(c[:2] == (want, want) for c in calls), calls
    assert sum(c[2] for c in calls) == 4
    assert head.dtype == torch.float32 and head.grad is not None and head.grad.dtype == torch.float32
    assert head.grad.isfinite().all() and head.grad.abs().max() > 0

def test_bf16_fused_head_gradient_matches_full_logits():
    "bf16 autocast: the head gradient through the bf16 fused loss points where the full-logits path's does"
    _, fused = _head_grad("bfloat16", "chunked")
    _, full = _head_grad("bfloat16", "naive")
    cos = torch.nn.functional.cosine_similarity(fused.grad.flatten(), full.grad.flatten(), 0)
    ratio = fused.grad.norm() / full.grad.norm()
    assert cos > 0.999 and 0.98 < ratio < 1.02, (cos, ratio)
