"""`bppo eval --checkpoint` evaluates the checkpoint, whatever the engine (issue 52, item 2).

The checkpoint is the shipped tiny policy with its digits' embeddings rotated (0 reads and writes as 1, 1 as 2, ...):
it answers at the usual lengths and is always wrong, where the base gets about 0.7 of the same prompts. Each engine
(kit, HF; vLLM through the computing stand-in tests/fake_vllm, and vLLM's CPU build where it is installed) must give
the checkpoint's accuracy, equal to evaluating the checkpoint's own engine here, not the base model's. vLLM built from
the config's model and never given the checkpoint's weights (the bug) scores the base."""
import dataclasses, json
from pathlib import Path

import pytest
import torch

from conftest import install_fake_vllm
from bppo_kit.cli import main
from bppo_kit.config import data_dir, get_config
from bppo_kit.evaluate import eval_examples, evaluate
from bppo_kit.policy import load_policy, resolve_policy_path
from bppo_kit.rollout import HFEngine, KitEngine, SamplingParams, VLLMEngine, vllm_available
from bppo_kit.runs import save_checkpoint

pytestmark = pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(),
                                reason="needs the shipped policy in data/tiny_policy")
EVAL = ["--samples", "2", "--set", "data.eval_size=8", "--set", "rollout.max_new_tokens=120", "--quiet"]


@pytest.fixture()
def fake_vllm(monkeypatch):
    "The stand-in for vLLM as `vllm`, computing: it samples the model it was built from, pushed weights loaded"
    return install_fake_vllm(monkeypatch, compute=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    "A run's checkpoint (the kit's save path) of the tiny policy with its digits rotated: always wrong"
    model, tok = load_policy("tiny")
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    with torch.no_grad():
        emb = model.get_input_embeddings().weight  # tied: the rows the model reads and writes
        emb[digits] = emb[digits[1:] + digits[:1]].clone()
    run = tmp_path_factory.mktemp("run")
    return save_checkpoint(run, model, tok, torch.optim.SGD(model.parameters(), lr=0.1), step=1)


def eval_json(tmp_path, *args) -> dict:
    out = tmp_path / "eval.json"
    assert main(["eval", *args, *EVAL, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def reference(path: str, engine: str) -> dict:
    "The accuracy of the policy at `path` evaluated here, with an engine built on it directly"
    cfg = get_config("cpu-demo", overrides=["data.eval_size=8", "rollout.max_new_tokens=120"])
    model, tok = load_policy(path)
    eng = {"kit": lambda: KitEngine(model, tok), "hf": lambda: HFEngine(model, tok),
           "vllm": lambda: VLLMEngine(model, tok, resolve_policy_path(path), max_model_len=512)}[engine]()
    torch.manual_seed(cfg.train.seed)
    sp = SamplingParams(max_new_tokens=120, seed=cfg.train.seed, logprobs=False)
    r = evaluate(model, tok, eval_examples(cfg), samples=2, sampling=sp, engine=eng, data=cfg.data)
    return {k: r[k] for k in ("accuracy", "greedy_accuracy")}


def check_scores_the_checkpoint(tmp_path, ckpt, engine):
    got = eval_json(tmp_path, "--checkpoint", str(ckpt), "--set", f"rollout.engine={engine}")
    want, base = reference(str(ckpt), engine), reference("tiny", engine)
    assert base["accuracy"] >= 0.4 and want["accuracy"] <= 0.1, (base, want)  # the test can tell them apart
    assert {k: got[k] for k in want} == want, (got, want, base)
    assert got["checkpoint"] == str(ckpt)


@pytest.mark.parametrize("engine", ["kit", "hf"])
def test_eval_checkpoint_in_process_engines(tmp_path, ckpt, engine):
    check_scores_the_checkpoint(tmp_path, ckpt, engine)


def test_eval_checkpoint_on_vllm(tmp_path, ckpt, fake_vllm):
    "vLLM is built for the checkpoint and given the weights loaded here (a push before the first generate)"
    check_scores_the_checkpoint(tmp_path, ckpt, "vllm")
    built = [e for e in fake_vllm.EVENTS if e["kind"] == "LLM"]
    assert built[0]["model"] == str(ckpt), built[0]
    kinds = [e["kind"] for e in fake_vllm.EVENTS]
    assert kinds.index("reload_weights") < kinds.index("generate"), kinds


def test_vllm_left_with_the_base_scores_the_base(tmp_path, ckpt, fake_vllm, monkeypatch):
    "The bug, kept alive here to show the test above can fail: vLLM built from the base and never pushed to"
    monkeypatch.setattr("bppo_kit.vllm_engine.engine_path", lambda name: resolve_policy_path("tiny"))
    monkeypatch.setattr(VLLMEngine, "sync_weights", lambda self, model=None: None)
    got = eval_json(tmp_path, "--checkpoint", str(ckpt), "--set", "rollout.engine=vllm")
    assert got["accuracy"] == reference("tiny", "vllm")["accuracy"] >= 0.4


def test_eval_lora_checkpoint_on_vllm(tmp_path, fake_vllm):
    "A LoRA adapter folder: vLLM loads its base (it loads whole models) and samples the merged weights pushed to it"
    from peft import LoraConfig, get_peft_model
    model, tok = load_policy("tiny")
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n: p.normal_(0, 0.5)  # an adapter that breaks the policy
    peft.save_pretrained(tmp_path / "adapter")
    tok.save_pretrained(tmp_path / "adapter")  # as the kit's checkpoints hold it
    merged = {k: v.clone() for k, v in peft.merge_and_unload().state_dict().items()}
    got = eval_json(tmp_path, "--checkpoint", str(tmp_path / "adapter"), "--set", "rollout.engine=vllm")
    assert fake_vllm.EVENTS[0]["model"] == resolve_policy_path("tiny")
    assert all(torch.allclose(fake_vllm.WEIGHTS[0][k], merged[k], atol=1e-6) for k in merged)
    assert got["accuracy"] <= 0.1 < reference("tiny", "vllm")["accuracy"], got


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vllm is not importable here")
def test_eval_checkpoint_on_real_vllm(tmp_path, ckpt, monkeypatch):
    "vLLM's CPU build (tests/test_vllm.py says how to install it): the checkpoint's accuracy, not the base's"
    monkeypatch.setattr(VLLMEngine, "caps", dataclasses.replace(VLLMEngine.caps, device=None))
    got = eval_json(tmp_path, "--checkpoint", str(ckpt), "--set", "rollout.engine=vllm")
    assert got["accuracy"] <= 0.1 and got["greedy_accuracy"] <= 0.1, got


@pytest.mark.skipif(vllm_available(), reason="vllm is installed here")
def test_gpu_preset_eval_without_vllm_is_one_line(ckpt, capsys):
    "The GPU guide's eval command where vLLM is not installed: one line naming the engines to use, exit 2"
    assert main(["eval", "--preset", "gsm8k-qwen2.5-0.5b", "--checkpoint", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vllm is not installed" in err and "--set rollout.engine=kit" in err, err
