import os, random, sys, pytest, torch
from pathlib import Path
from bppo_kit.config import data_dir
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
# `make test` runs the tests not marked `serial` in 2 pytest-xdist workers: each worker (and every process it starts,
# through OMP_NUM_THREADS) gets its share of the cores, so two workers never fight over both
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1: os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))

# Modules whose tests run alone, after the parallel ones (marked `serial`): several processes on the cores
# (distributed, vLLM's DDP build), a browser with a JupyterLab server, and vLLM itself
SERIAL_MODULES = {"test_distributed", "test_vllm_build", "test_browser", "test_vllm"}

def pytest_collection_modifyitems(config, items):
    for item in items:
        if getattr(item.module, "__name__", None) in SERIAL_MODULES: item.add_marker(pytest.mark.serial)
    # the tests marked slow first, so that two workers start on them and none is left to run alone at the end
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)

# Property tests. `make test` and CI: the same draws on every run and no example database, so a commit's result never
# depends on the draw or on a `.hypothesis` folder. `--hypothesis-seed N`: the same tests under seed N's draws.
# `make test-explore`: 20x the examples, fresh draws every run (what it finds becomes an @example with its fix).
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("seeded", derandomize=False, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", max_examples=2000, derandomize=False, database=None, deadline=None,
                          print_blob=True)
settings.load_profile("ci")

def pytest_configure(config):
    # a seed under the derandomized profile would be ignored (derandomize wins), so a seed switches to "seeded"
    if config.getoption("--hypothesis-seed") is not None and not config.getoption("--hypothesis-profile"):
        settings.load_profile("seeded")

def examples(n: int) -> int:
    "A property test's number of examples: `n` under the ci profile (100 examples), 20x under explore's 2000"
    return max(1, n * settings.default.max_examples // 100)

def exploring() -> bool:
    "Under `make test-explore`: the seeded fuzz loops (marked `fuzz`) draw fresh seeds and more cases"
    return settings.get_current_profile_name() == "explore"

def fuzz_seed(seed: int = 0) -> int:
    "A seeded fuzz loop's seed: `seed` under make test, a fresh one under explore (printed, so a failure shows it)"
    if not exploring(): return seed
    fresh = random.randrange(2**31)
    print(f"fuzz seed {fresh} (was {seed})")
    return fresh

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


# a test that trains the shipped tiny policy: skipped, with the reason, on a clone without it
needs_tiny = pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(),
                                reason="the shipped tiny policy is not in data/")


def install_fake_vllm(monkeypatch, compute: bool = False):
    ("tests/fake_vllm's stand-in imported as `vllm` (and `vllm.inputs`) for one test, the engine's CUDA demand "
     "lifted; `compute`: it samples the model it was built from (else it only records)")
    import dataclasses, importlib.util
    from bppo_kit.vllm_engine import VLLMEngine
    fake_dir = Path(__file__).resolve().parent / "fake_vllm" / "vllm"
    def load(name: str, path: Path):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    fake = load("vllm", fake_dir / "__init__.py")
    if compute: fake.COMPUTE = True
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", load("vllm.inputs", fake_dir / "inputs.py"))
    monkeypatch.setattr(VLLMEngine, "caps", dataclasses.replace(VLLMEngine.caps, device=None))  # on this CPU
    return fake
