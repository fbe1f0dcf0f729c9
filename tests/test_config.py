"Config: every ranged field rejects out-of-range values by name; YAML round-trips every preset."
import math
from dataclasses import fields
import pytest, yaml
from hypothesis import given, strategies as st, settings
from conftest import examples
from bppo_kit.core import check_settings
from bppo_kit.config import (PRESETS, Config, ConfigError, apply_overrides, get_config, load_config, save_config,
                             set_value)

def ranged_fields():
    "`section.field` of the config, and `algo.NAME.FIELD` of every built-in algorithm's own settings"
    import bppo_kit.algorithms  # noqa: F401  (registers the built-ins and their settings)
    from bppo_kit.core import SETTINGS
    c = Config()
    parts = ([(sec.name, getattr(c, sec.name)) for sec in fields(c)]
             + [(f"algo.{n}", cls) for n, cls in SETTINGS.items()])
    for name, part in parts:
        for f in fields(part):
            m = f.metadata
            if any(m.get(k) is not None for k in ("gt", "ge", "lt", "le", "choices")): yield f"{name}.{f.name}", f

@pytest.mark.parametrize("key,f", list(ranged_fields()), ids=lambda x: x if isinstance(x, str) else "")
def test_out_of_range_names_field(key, f):
    m = f.metadata
    if m["choices"]: bad = "not-a-choice"
    elif m["gt"] is not None: bad = m["gt"]
    elif m["ge"] is not None: bad = m["ge"] - 1
    elif m["lt"] is not None: bad = m["lt"]
    else: bad = m["le"] + 1
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        if key.count(".") == 1: apply_overrides(Config(), [f"{key}={bad}"])
        else: check_settings(apply_overrides(Config(), [f"{key}={bad}"]))  # an algorithm's own: when the run starts

@pytest.mark.parametrize("preset", list(PRESETS))
def test_yaml_roundtrip(preset, tmp_path):
    c = get_config(preset)
    assert load_config(save_config(c, tmp_path / "c.yaml")) == c

def test_unknown_section_and_key(tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"rollout": {"temperatur": 1.0}}))
    with pytest.raises(ConfigError, match="did you mean rollout.temperature"): load_config(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("rollout: 3\n")
    with pytest.raises(ConfigError, match="must be a mapping"): load_config(tmp_path / "d.yaml")
    (tmp_path / "e.yaml").write_text("rollout: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"): load_config(tmp_path / "e.yaml")

@settings(max_examples=examples(200))
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_temperature_accepts_exactly_positive_finite(t):
    c = Config()
    if t > 0 and math.isfinite(t): assert set_value(c, "rollout.temperature", t).rollout.temperature == t
    else:
        with pytest.raises(ConfigError, match="rollout.temperature"): set_value(c, "rollout.temperature", t)

def test_bool_is_not_int():
    with pytest.raises(ConfigError, match="train.steps: expected int"): set_value(Config(), "train.steps", True)

def plain_warnings(monkeypatch, *overrides, preset="math-qwen2.5-1.5b") -> list[str]:
    "The prompt-format warnings `get_config(preset, overrides)` gives, in a process that has warned of nothing yet"
    import warnings
    import bppo_kit.config as config
    monkeypatch.setattr(config, "_warned_plain", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_config(preset, overrides=list(overrides))
        get_config(preset, overrides=list(overrides))  # a second config of the same model: no second warning
    return [str(w.message) for w in caught if "data.prompt_format" in str(w.message)]

@pytest.mark.parametrize("model,fmt,warned", [
    ("Qwen/Qwen2.5-1.5B-Instruct", "plain", True), ("Qwen/Qwen2.5-1.5B-Instruct", "chat", False),
    ("google/gemma-2-2b-it", "plain", True), ("meta-llama/Llama-2-7b-chat-hf", "plain", True),
    ("Qwen/Qwen2.5-Math-1.5B", "plain", False), ("Qwen/Qwen2.5-1.5B", "plain", False),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "plain", True), ("runs/math/checkpoint", "plain", False)])
def test_instruct_model_on_plain_prompts_warns_once(monkeypatch, model, fmt, warned):
    "The MATH preset (plain: a base model) set to an instruct model warns once, naming the fix; chat or base: silent"
    said = plain_warnings(monkeypatch, f"model.name_or_path={model}", f"data.prompt_format={fmt}")
    assert len(said) == int(warned), said
    if warned: assert model in said[0] and "set data.prompt_format=chat" in said[0] and "\n" not in said[0]

def test_synthetic_task_never_warns(monkeypatch):
    "The synthetic task's prompts are a completion format of their own: an instruct model on it gets no warning"
    assert plain_warnings(monkeypatch, "model.name_or_path=Qwen/Qwen2.5-1.5B-Instruct", preset="cpu-demo") == []
    said = plain_warnings(monkeypatch, "model.name_or_path=Qwen/Qwen2.5-1.5B-Instruct", "data.task=gsm8k",
                          preset="cpu-demo")
    assert len(said) == 1, said

def test_presets_format_follows_the_model(monkeypatch):
    "Every preset as shipped: chat exactly where the model is an instruct one, and no warning"
    from bppo_kit.config import instruct_name
    for name in PRESETS:
        cfg = get_config(name)
        assert (cfg.data.prompt_format == "chat") == instruct_name(cfg.model.name_or_path), name
        assert plain_warnings(monkeypatch, preset=name) == [], name
