"""Every copy the kit makes in the compute dtype keeps the rotary frequencies the trainer computes with (float32), so a
bf16 copy's log-probs stay as close to the float32 trainer's at position 4,000 as at position 0 (issue 52, item 1)."""
import copy, types
import pytest, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from bppo_kit.config import get_config
from bppo_kit.core import Engine, EngineCaps, register_engine
from bppo_kit.policy import char_tokenizer, completion_logprobs, generation_copy, pack, to_compute_dtype
from bppo_kit.shapes import bpe_tokenizer, real_shaped
from bppo_kit.trainer import build_engine, start_policy


def long_model(std: float = 0.2):
    ("A small Qwen2 with a real context (4,096) and Qwen2.5's rope_theta (1e6); its weights wide enough that attention "
     "is sharp and depends on position, as a trained model's does (at std 0.02 attention is nearly uniform)")
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=128, max_position_embeddings=4096, rope_theta=1e6,
                      initializer_range=std)
    return Qwen2ForCausalLM(cfg).eval()


def rotary(model) -> dict:
    "The rotary buffers by their last two name parts (a peft model's names carry a prefix): inv_freq, original_inv_freq"
    return {tuple(n.split(".")[-2:]): b for n, b in model.named_buffers() if n.endswith("inv_freq")}


def assert_trainers_rotary(copy_, trainer):
    want, got = rotary(trainer), rotary(copy_)
    assert want and set(got) == set(want), (set(got), set(want))
    for k, b in want.items():
        assert b.dtype == got[k].dtype == torch.float32 and torch.equal(got[k].cpu(), b.cpu()), k


@register_engine("rope-probe")
class OwnWeights(Engine):
    "An engine with weights of its own (as vLLM's): under FSDP2 `build_engine` makes it a whole copy to gather into"
    caps = EngineCaps(own_weights=True)
    def __init__(self, model, tok, progress=False): self.model = model


def test_every_copy_keeps_the_trainers_rotary_buffers():
    m, tok = long_model(), char_tokenizer()
    assert_trainers_rotary(generation_copy(m, "bfloat16"), m)  # the kit and HF engines' copy
    pytest.importorskip("peft")
    from bppo_kit.policy import add_lora
    lora = add_lora(copy.deepcopy(m), r=4, alpha=8)
    assert_trainers_rotary(generation_copy(lora, "bfloat16"), lora)  # a LoRA run's merged copy
    cfg = get_config("cpu-demo", overrides=["model.dtype=bfloat16", "algo.beta=0.1"])
    cfg.rollout.engine = "rope-probe"
    _, gen = build_engine(cfg, m, tok, types.SimpleNamespace(kind="fsdp"))  # the FSDP2 copy to gather into
    assert gen is not m and next(gen.parameters()).dtype == torch.bfloat16
    assert_trainers_rotary(gen, m)
    _, _, ref = start_policy(cfg, None, None, (m, tok), "cpu")  # the reference model of a given policy
    assert next(ref.parameters()).dtype == torch.bfloat16
    assert_trainers_rotary(ref, m)
    shaped, _ = real_shaped("tiny", bpe_tokenizer(["Q: 1+2\nA: 3"] * 4, vocab_size=300), "bfloat16")
    assert next(shaped.parameters()).dtype == torch.bfloat16
    assert_trainers_rotary(shaped, real_shaped("tiny", bpe_tokenizer(["Q: 1+2\nA: 3"] * 4, vocab_size=300),
                                               "float32")[0])


def test_the_gap_to_the_trainer_does_not_grow_with_position():
    "The old `.to(bfloat16)` copy's gap grows along 4,096 positions; the copy that keeps float32 rotary's does not"
    m = long_model()
    ids = torch.randint(0, 128, (4096,), generator=torch.Generator().manual_seed(1)).tolist()
    # one prompt token, then 4,095 teacher-forced tokens: their log-probs by position
    batch = pack([ids[:1]], [ids[1:]], pad_id=0)
    old = copy.deepcopy(m).to(torch.bfloat16)
    assert rotary(old)[("rotary_emb", "inv_freq")].dtype == torch.bfloat16  # what the old cast did
    with torch.no_grad():
        trainer = completion_logprobs(m, batch)[0]
        gaps = {name: (completion_logprobs(c, batch)[0] - trainer).abs()
                for name, c in (("old", old), ("kept", to_compute_dtype(copy.deepcopy(m), "bfloat16")))}
    first, last = {k: g[:512].mean().item() for k, g in gaps.items()}, {k: g[-512:].mean().item()
                                                                         for k, g in gaps.items()}
    print(f"mean |log-prob gap| to the float32 trainer, positions 1-512 -> 3,584-4,095: old cast "
          f"{first['old']:.4f} -> {last['old']:.4f}; float32 rotary {first['kept']:.4f} -> {last['kept']:.4f}")
    assert last["old"] > 3 * first["old"]  # the old copy drifts away from the trainer along the sequence
    assert last["kept"] < 1.5 * first["kept"]  # the fixed copy's gap is bf16 rounding, the same everywhere
    assert last["kept"] < last["old"] / 3
