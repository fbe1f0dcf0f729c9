"LoRA through peft: only the adapter trains, the kit engine decodes the adapted weights, checkpoints resume exactly."
import pytest, torch
from bppo_kit.config import get_config, data_dir
from bppo_kit.core import SamplingParams
from bppo_kit.data import load_synthetic_eval
from bppo_kit.policy import generation_copy, is_peft, load_policy
from bppo_kit.rollout import HFEngine, KitEngine
from bppo_kit.trainer import train

pytestmark = pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(),
                                reason="needs the shipped policy in data/tiny_policy")
LORA = ["model.lora_r=8", "model.lora_alpha=16", "train.lr=2e-3", "train.steps=3", "train.prompts_per_step=4",
        "rollout.group_size=4", "rollout.max_new_tokens=120"]

def lora_run(out, stop_after=None, resume=False, extra=()):
    cfg = get_config("cpu-demo", overrides=LORA + [f"train.out={out}", *extra])
    train(cfg, resume=resume, progress=False, evaluate_every=False, stop_after=stop_after)
    return out / "checkpoint"

def greedy(engine, prompts):
    sp = SamplingParams(temperature=0.0, max_new_tokens=60, seed=0, logprobs=False)
    return [c.completion_ids for c in engine.generate(prompts, 1, sp)]

def test_lora_trains_only_the_adapter_and_the_engine_follows(tmp_path):
    ckpt = lora_run(tmp_path / "run")
    assert (ckpt / "adapter_config.json").is_file() and (ckpt / "adapter_model.safetensors").is_file()
    assert not (ckpt / "model.safetensors").exists()  # an adapter, not a copy of the model
    base, tok = load_policy("tiny")
    adapted, _ = load_policy(str(ckpt), merge=False)
    assert is_peft(adapted)
    plain = {k.replace("base_model.model.", "").replace(".base_layer.", "."): v
             for k, v in adapted.state_dict().items() if ".lora_" not in k}
    for k, v in base.state_dict().items(): assert torch.equal(plain[k], v), k  # the base weights are untouched
    assert any(v.abs().max() > 0 for k, v in adapted.state_dict().items() if "lora_B" in k)  # B left zero: trained
    prompts = [e.prompt for e in load_synthetic_eval()[:8]]
    kit = greedy(KitEngine(generation_copy(adapted, "float32"), tok), prompts)
    assert kit == greedy(HFEngine(adapted, tok), prompts)  # the kit engine decodes what the adapter computes
    assert kit == greedy(KitEngine(load_policy(str(ckpt))[0], tok), prompts)  # = the merged checkpoint
    assert kit != greedy(KitEngine(base, tok), prompts)  # ... which is not what the base model says

@pytest.mark.slow  # three LoRA runs (about 50 s on 2 busy cores)
def test_lora_resume_is_exact(tmp_path):
    full = lora_run(tmp_path / "full")
    lora_run(tmp_path / "cut", stop_after=2)
    cut = lora_run(tmp_path / "cut", resume=True)
    a, _ = load_policy(str(full), merge=False)
    b, _ = load_policy(str(cut), merge=False)
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-6, rtol=0), k

def test_lora_with_the_fused_loss_and_checkpointing(tmp_path):
    "The frozen head works with the fused loss; gradient checkpointing with frozen embeddings still trains"
    ckpt = lora_run(tmp_path / "f", extra=["train.loss_kernel=chunked", "model.gradient_checkpointing=true",
                                           "model.dtype=bfloat16", "train.steps=1"])
    a, _ = load_policy(str(ckpt), merge=False)
    assert any(v.abs().max() > 0 for k, v in a.state_dict().items() if "lora_B" in k)


def test_merged_weights_keep_one_merged_copy_alive():
    "A LoRA model's weights handed to an engine one at a time hold one merged matrix, not all of them (issue 43)"
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from bppo_kit.plan import LiveBytes
    from bppo_kit.policy import add_lora, merged_state_dict, merged_weights
    cfg = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    lm = add_lora(Qwen2ForCausalLM(cfg), r=4, alpha=8)
    for n, p in lm.named_parameters():
        if "lora_B" in n: torch.nn.init.normal_(p, std=0.02)
    keep = [t for t in lm.state_dict().values()]
    with LiveBytes(keep=keep) as whole: merged = merged_state_dict(lm)
    with LiveBytes(keep=keep) as stream:
        for k, v in merged_weights(lm):
            assert torch.equal(v, merged[k])
            del v
    from bppo_kit.plan import MERGE_COPIES
    planned = MERGE_COPIES * 4 * cfg.hidden_size * cfg.intermediate_size  # the planner's row (engine_rows)
    assert abs(stream.peaks["update"] / planned - 1) <= 0.15, (stream.peaks, planned)
    assert stream.peaks["update"] < whole.peaks["update"] / 4, (stream.peaks, whole.peaks)
