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
