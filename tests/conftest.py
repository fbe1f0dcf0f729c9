import os, sys, pytest, torch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
torch.set_num_threads(min(2, os.cpu_count() or 1))

def bppo_cmd():
    "The installed `bppo` entry point beside this interpreter"
    exe = Path(sys.executable).parent / "bppo"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "bppo_kit.cli"]

@pytest.fixture(scope="session")
def shipped():
    from bppo_kit.policy import load_policy
    return load_policy("tiny")


@pytest.fixture(scope="module")
def random_tiny(tmp_path_factory) -> str:
    "A folder holding a tiny random Qwen2 and the char tokenizer (TRL loads its reference model from the policy's)"
    from transformers import Qwen2ForCausalLM
    from bppo_kit.policy import char_tokenizer, tiny_config
    tok = char_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_config(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64))
    folder = tmp_path_factory.mktemp("random_tiny")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def moved_policy(folder: str):
    "The saved model, its weights moved a little (seeded) so that it is not its own reference"
    from bppo_kit.policy import load_policy
    model, tok = load_policy(folder)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
    return model, tok
