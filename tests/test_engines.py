"""The engine interface from outside: a new engine is one class registered by name, and the loop, the sampler and the
algorithms ask it for capabilities, never for its name."""
import subprocess, sys
import pytest
from bppo_kit.config import ConfigError, data_dir, get_config
from bppo_kit.core import ENGINES, EngineCaps
from bppo_kit.rollout import engine_caps, records_logprobs
from bppo_kit.trainer import train

needs_policy = pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(),
                                  reason="needs the shipped policy in data/tiny_policy")
SMALL = ["train.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=40", "train.steps=2"]

# A new engine in a file of its own, as a user writes one: it wraps KitEngine and counts the calls (under 30 lines)
COUNTING = '''
from bppo_kit.core import Engine, register_engine
from bppo_kit.rollout import KitEngine

@register_engine("counting")
class Counting(Engine):
    caps = KitEngine.caps
    calls = {"generate": 0, "run": 0, "sync_weights": 0, "sleep": 0}
    def __init__(self, model, tok, progress=False): self.kit = KitEngine(model, tok, progress=progress)
    @property
    def stats(self): return self.kit.stats
    def generate(self, prompts, n=1, sampling=None, **kw):
        self.calls["generate"] += 1
        return self.kit.generate(prompts, n, sampling, **kw)
    def run(self, requests, sampling=None, window=None, on_finish=None):
        self.calls["run"] += 1
        return self.kit.run(requests, sampling, window, on_finish)
    def sleep(self): self.calls["sleep"] += 1

@register_engine("plain")
class Plain(Counting):  # the same engine, declaring no windows and no cancelling
    caps = type(KitEngine.caps)()
'''


def test_plugin_engine_is_short():
    assert len(COUNTING.strip().splitlines()) < 30


@pytest.fixture()
def plugin(tmp_path):
    path = tmp_path / "counting_engine.py"
    path.write_text(COUNTING)
    sys.path.insert(0, str(tmp_path))
    import counting_engine
    yield counting_engine
    sys.path.remove(str(tmp_path))
    sys.modules.pop("counting_engine", None)
    ENGINES.pop("counting", None)
    ENGINES.pop("plain", None)


@needs_policy
@pytest.mark.parametrize("algo", ["grpo", "tppo"])
def test_new_engine_trains_two_steps(plugin, tmp_path, algo):
    "GRPO (whole responses through `generate`) and T-PPO (windows through `run`) train on the plugin's engine"
    plugin.Counting.calls.update(generate=0, run=0, sleep=0)
    extra = ["rollout.window=16"] if algo == "tppo" else []
    cfg = get_config("cpu-demo", overrides=SMALL + extra + [f"algo.name={algo}", "rollout.engine=counting",
                                                            f"train.out={tmp_path}/run"])
    out = train(cfg, progress=False, evaluate_every=False)
    assert out["steps"] == 2
    calls = plugin.Counting.calls
    assert calls["sleep"] == 2  # the loop lets the engine free its memory before each update
    if algo == "grpo": assert calls["generate"] == 2 and calls["run"] == 0
    else: assert calls["run"] == 2 and calls["generate"] == 0


@needs_policy
def test_capabilities_not_names(plugin):
    "An engine without windows is refused for T-PPO, without cancelling for BPPO's early stop: one line, the capability"
    assert engine_caps(get_config("cpu-demo", overrides=["rollout.engine=plain"])) == EngineCaps()
    cfg = get_config("cpu-demo", overrides=["algo.name=tppo", "rollout.engine=plain"])
    with pytest.raises(ConfigError) as e: train(cfg, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "EngineCaps.windows" in msg and msg.startswith("rollout.engine")
    cfg = get_config("cpu-demo", overrides=["algo.name=bppo", "algo.bppo.schedule=early_stop", "rollout.engine=plain"])
    with pytest.raises(ConfigError, match=r"algo.bppo.schedule: .*EngineCaps.cancels"): train(cfg, progress=False)
    # the same engine with windows (the plugin's `counting`) is accepted by both checks
    from bppo_kit.tppo import TPPO
    counting = get_config("cpu-demo", overrides=["algo.name=tppo", "rollout.engine=counting"])
    TPPO.check(counting, engine_caps(counting))
    # log-probs are recorded for an engine that is not exact, whatever its name
    assert not records_logprobs(get_config("cpu-demo", overrides=["rollout.engine=plain"]))
    plugin.Plain.caps = EngineCaps(exact=False)
    assert records_logprobs(get_config("cpu-demo", overrides=["rollout.engine=plain"]))


def test_unknown_engine_lists_the_known():
    with pytest.raises(ConfigError, match="rollout.engine: must be one of hf, kit, vllm"):
        train(get_config("cpu-demo", overrides=["rollout.engine=sglang"]), progress=False)


def test_no_engine_names_in_the_package():
    "Nothing outside the engine registry asks an engine's name or probes it with hasattr (the issue's grep)"
    pattern = r'engine ?[!=]= ?"|engine in \(|hasattr\((self\.)?engine|hasattr\(ro, '
    out = subprocess.run(["grep", "-nE", pattern, *map(str, sorted((data_dir().parent / "bppo_kit").glob("*.py")))],
                         capture_output=True, text=True)
    assert out.stdout == "", out.stdout


@needs_policy
def test_plugin_flag_registers_engine(tmp_path):
    "`bppo train --plugin file.py` loads a file that registers an engine, as it does for algorithms"
    path = tmp_path / "eng.py"
    path.write_text(COUNTING)
    from bppo_kit.cli import main
    try:
        main(["train", "--plugin", str(path), "--preset", "cpu-demo", "--quiet", "--steps", "1",
              "--out", str(tmp_path / "run"), *[a for o in SMALL[:3] + ["data.eval_size=2"] for a in ("--set", o)],
              "--set", "rollout.engine=counting"])
        assert ENGINES["counting"].calls["sleep"] == 1 and ENGINES["counting"].calls["generate"] >= 1
    finally:
        ENGINES.pop("counting", None)
        ENGINES.pop("plain", None)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA device")
def test_gpu_preset_without_cuda_is_one_line(tmp_path):
    "A GPU preset on a machine without CUDA stops before anything loads, naming train.device"
    cfg = get_config("gsm8k-qwen2.5-0.5b", overrides=[f"train.out={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as e: train(cfg, progress=False)
    assert str(e.value).startswith("train.device: cuda") and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()
