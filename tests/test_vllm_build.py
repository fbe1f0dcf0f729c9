"""How the trainer builds and drives vLLM, with `vllm.LLM` replaced by a recorder (tests/fake_vllm): no GPU and no vLLM
needed. For each GPU preset (its model, data and batch swapped for the tiny ones, its engine settings kept): the
compute dtype, the configured memory share and context, TRL's sleep/wake discipline (level 2; `empty_cache` before
every wake; the weights pushed again after the update), the weights pushed before the first `generate` of a resumed
run and of an `RLTrainer` given a loaded model; under two DDP processes, vLLM's external launcher on each process's own
device. (FSDP2: `tests/fsdp2_check.py` checks that the engine is synced from the gathered weights.)"""
import copy, json, os, weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen2ForCausalLM

from conftest import install_fake_vllm
from bppo_kit.config import get_config
from bppo_kit.policy import chat_tokenizer, merged_state_dict, tiny_config
from bppo_kit.rollout import VLLMCompat
from bppo_kit.trainer import train
from procs import accelerate_launch, run_or_dump

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_vllm"
PRESETS = ["gsm8k-qwen2.5-0.5b", "math-qwen2.5-1.5b"]
SMALL = ["train.device=cpu", "data.task=synthetic", "data.eval_size=2", "train.prompts_per_step=2",
         "rollout.group_size=2", "train.micro_batch=2", "rollout.max_new_tokens=24", "rollout.max_prompt_tokens=200",
         "train.eval_every=0", "train.save_every=0"]


@pytest.fixture()
def vllm(monkeypatch):
    "The recorder as `vllm`, sleep mode on, `empty_cache` logged (what tests/fake_vllm/gpu_on_cpu.py does by plugin)"
    fake = install_fake_vllm(monkeypatch)
    monkeypatch.setattr(VLLMCompat, "sleeps", staticmethod(lambda device: True))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: fake.record("empty_cache"))
    return fake


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    "A tiny Qwen2 with a chat template, as a checkpoint folder (the GSM8K preset formats prompts with it)"
    tok = chat_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_config(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    path = tmp_path_factory.mktemp("ckpt")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def kinds(events) -> list[str]: return [e["kind"] for e in events]


def check_discipline(events):
    "Level-2 sleeps; `empty_cache` right before every wake; weights woken to be pushed, the KV cache to generate"
    for i, e in enumerate(events):
        if e["kind"] == "sleep": assert e["level"] == 2, e
        if e["kind"] == "wake_up":
            assert events[i - 1]["kind"] == "empty_cache", kinds(events)[:i + 1]
            nxt = events[i + 1]["kind"]
            assert (e["tags"], nxt) in ((["weights"], "reload_weights"), (["kv_cache"], "generate")), (e, nxt)


@pytest.mark.parametrize("preset,lora", [(p, 0) for p in PRESETS] + [(PRESETS[1], 4)])
def test_gpu_preset_builds_and_drives_vllm_like_trl(vllm, ckpt, tmp_path, preset, lora):
    cfg = get_config(preset, overrides=SMALL + [f"model.name_or_path={ckpt}", "train.steps=2",
                                                f"model.lora_r={lora}", f"train.out={tmp_path / 'run'}"])
    train(cfg, progress=False, evaluate_every=False)
    built = vllm.EVENTS[0]
    assert built["kind"] == "LLM" and built["model"] == str(ckpt)
    assert built["dtype"] == "bfloat16" == cfg.model.dtype  # the compute dtype, not the float32 master weights
    assert built["gpu_memory_utilization"] == cfg.rollout.gpu_memory_utilization
    assert built["max_model_len"] == cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens == 224
    assert built["enable_sleep_mode"] is True and "distributed_executor_backend" not in built
    assert kinds(vllm.EVENTS) == ["LLM",
                                  "generate", "sleep", "empty_cache", "wake_up", "reload_weights", "reset_prefix_cache",
                                  "empty_cache", "wake_up",
                                  "generate", "sleep", "empty_cache", "wake_up", "reload_weights", "reset_prefix_cache",
                                  "shutdown", "empty_cache"]  # `train` closes its engine when it returns
    check_discipline(vllm.EVENTS)
    pushed = vllm.WEIGHTS[-1]  # the trained policy, LoRA merged: plain names only
    assert "model.embed_tokens.weight" in pushed and not any("lora_" in k or "base_layer" in k for k in pushed)
    if not lora:  # the last push is the checkpoint the run wrote
        saved = load_file(str(tmp_path / "run" / "checkpoint" / "model.safetensors"))
        assert all(torch.equal(pushed[k], saved[k]) for k in saved)


def test_resumed_run_pushes_its_checkpoint_before_generating(vllm, ckpt, tmp_path):
    over = SMALL + [f"model.name_or_path={ckpt}", f"train.out={tmp_path / 'run'}"]
    train(get_config(PRESETS[1], overrides=over + ["train.steps=1"]), progress=False, evaluate_every=False)
    # a step of training moved the checkpoint away from the folder vLLM loads (make sure of it: perturb it)
    path = tmp_path / "run" / "checkpoint" / "model.safetensors"
    saved = load_file(str(path))
    saved = {k: v + 0.01 for k, v in saved.items()}
    from safetensors.torch import save_file
    save_file(saved, str(path), metadata={"format": "pt"})
    vllm.EVENTS.clear()
    vllm.WEIGHTS.clear()
    train(get_config(PRESETS[1], overrides=over + ["train.steps=2"]), resume=True, progress=False,
          evaluate_every=False)
    k = kinds(vllm.EVENTS)
    assert k.index("reload_weights") < k.index("generate"), k
    first = vllm.WEIGHTS[0]
    assert all(torch.equal(first[n], saved[n]) for n in saved)
    check_discipline(vllm.EVENTS)


def test_rltrainer_given_a_loaded_model_pushes_it_before_generating(vllm, ckpt, tmp_path):
    from bppo_kit.api import RLTrainer
    from bppo_kit.policy import load_tokenizer
    model, tok = Qwen2ForCausalLM.from_pretrained(ckpt), load_tokenizer(str(ckpt))
    with torch.no_grad():
        for p in model.parameters(): p.add_(0.01)  # not what is on disk
    given = copy.deepcopy(merged_state_dict(model))
    settings = dict(train=dict(device="cpu", steps=1, out=str(tmp_path / "run"), prompts_per_step=2, micro_batch=2,
                               eval_every=0), data=dict(task="synthetic", eval_size=2),
                    rollout=dict(group_size=2, max_new_tokens=24, max_prompt_tokens=200))
    RLTrainer(model=model, processing_class=tok, args=settings, preset=PRESETS[0]).train(progress=False, evaluate=False)
    k = kinds(vllm.EVENTS)
    assert k.index("reload_weights") < k.index("generate"), k
    assert all(torch.equal(vllm.WEIGHTS[0][n], given[n].float()) for n in given)


def test_a_second_engine_is_built_after_the_first_is_gone(vllm, ckpt, tmp_path, monkeypatch):
    "Two runs in one process (a tutorial, the widget panel, compare): vLLM's sleep mode refuses a second engine while"
    "any tensor of the first lives, so the first must be closed and unreferenced (a dead weak reference) (issue 43)"
    refs, init = [], vllm.LLM.__init__
    def tracked(self, model, **kw):
        vllm.record("build", alive=sum(r() is not None for r in refs))
        init(self, model, **kw)
        refs.append(weakref.ref(self))
        self.cycle = self  # as the real engine's objects refer to each other: only a collection frees it
    monkeypatch.setattr(vllm.LLM, "__init__", tracked)
    for i in range(2):
        cfg = get_config(PRESETS[0], overrides=SMALL + [f"model.name_or_path={ckpt}", "train.steps=1",
                                                        f"train.out={tmp_path / f'run{i}'}"])
        train(cfg, progress=False, evaluate_every=False)
    assert [e["alive"] for e in vllm.EVENTS if e["kind"] == "build"] == [0, 0]
    assert all(r() is None for r in refs)  # after the last run too, without a collection of the caller's


def test_fresh_run_does_not_push_before_generating(vllm, ckpt, tmp_path):
    "vLLM loaded the folder's weights itself: a fresh run's first push is after its first update"
    cfg = get_config(PRESETS[1], overrides=SMALL + [f"model.name_or_path={ckpt}", "train.steps=1",
                                                    f"train.out={tmp_path / 'run'}"])
    train(cfg, progress=False, evaluate_every=False)
    k = kinds(vllm.EVENTS)
    assert k.index("generate") < k.index("reload_weights"), k


@pytest.mark.slow
def test_ddp_one_engine_per_process_on_its_own_device(ckpt, tmp_path):
    "`accelerate launch` with 2 processes: each builds vLLM with the external launcher and its own local rank"
    sets = [a for o in SMALL + [f"model.name_or_path={ckpt}", "rollout.engine=vllm", "model.dtype=bfloat16"]
            for a in ("--set", o)]
    log = tmp_path / "vllm"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAKE_VLLM_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(FAKE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = accelerate_launch(2) + ["-m", "bppo_kit.cli", "train", "--preset", "cpu-demo", "--steps", "1",
                                  "--out", str(tmp_path / "run"), "--quiet", "--plugin", str(FAKE / "gpu_on_cpu.py"),
                                  *sets]
    p = run_or_dump(cmd, 600, env=env, cwd=ROOT)  # 12 s on 2 cores; past 600 s, where each process waits
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    built = {}
    for rank in (0, 1):
        events = [json.loads(l) for l in Path(f"{log}.{rank}").read_text().splitlines()]
        llm = events[0]
        assert llm["kind"] == "LLM" and llm["distributed_executor_backend"] == "external_launcher", llm
        built[rank] = llm["env"]
        check_discipline(events)
    assert built == {r: dict(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2") for r in (0, 1)}


def test_context_never_past_the_models(vllm, ckpt, tmp_path):
    "rollout.max_prompt_tokens + max_new_tokens past the model's context: vLLM gets the model's (it refuses more)"
    over = [x for x in SMALL if not x.startswith("rollout.max_prompt_tokens")] + ["rollout.max_prompt_tokens=4096"]
    cfg = get_config(PRESETS[1], overrides=over + [f"model.name_or_path={ckpt}", "train.steps=1",
                                                   f"train.out={tmp_path / 'run'}"])
    train(cfg, progress=False, evaluate_every=False)
    ctx = Qwen2ForCausalLM.config_class.from_pretrained(ckpt).max_position_embeddings
    assert vllm.EVENTS[0]["max_model_len"] == ctx < 4096 + cfg.rollout.max_new_tokens
