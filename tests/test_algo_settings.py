"""Each built-in algorithm owns its settings (issue 45): `AlgoConfig` keeps what every algorithm reads, each
algorithm registers a dataclass of its own, and every old flat key `algo.X` still works, through `--set` and YAML,
giving the same config as the new `algo.NAME.X`, with a warning."""
import warnings
from dataclasses import fields, MISSING
import pytest, yaml
import bppo_kit.algorithms  # noqa: F401  (registers the built-ins and their settings)
from bppo_kit.config import (MOVED, RENAMED, AlgoConfig, Config, ConfigError, apply_overrides, check_value, get_config,
                             load_config, moved_to)
from bppo_kit.core import SETTINGS, algo_settings, make_algorithm


def other_value(f):
    "A value of field `f` that is not its default and that its range accepts"
    d = f.default
    if f.metadata.get("choices"): return next(c for c in f.metadata["choices"] if c != d)
    for v in ((d + 1, d + 2) if isinstance(d, int) else (d * 0.5 if d else 0.5, d + 0.1, d + 1.0, d * 2)):
        try: return check_value("x", f, v)
        except ConfigError: continue
    raise AssertionError(f"no other value for {f.name}")


def owned():
    "(old key, an owner, the owner's field) for every moved key and each of its owners"
    return [(k, n, next(f for f in fields(SETTINGS[n]) if f.name == RENAMED.get(k, k)))
            for k, (owners, _) in MOVED.items() for n in owners]


def test_algo_config_keeps_twelve_fields_and_each_setting_has_one_home():
    names = {f.name for f in fields(AlgoConfig)}
    assert len(names) <= 12 and not names & set(MOVED)
    own = {f.name for cls in SETTINGS.values() for f in fields(cls) if cls.__module__.startswith("bppo_kit")}
    assert own == {RENAMED.get(k, k) for k in MOVED}  # every built-in setting can still be set by its old flat key
    assert set(RENAMED) <= set(MOVED) and not set(RENAMED.values()) & set(MOVED)


@pytest.mark.parametrize("key,owner,f", owned(), ids=lambda x: x if isinstance(x, str) else "")
def test_old_default_is_the_settings_default(key, owner, f):
    assert f.default is not MISSING and f.default == MOVED[key][1], (owner, key)


@pytest.mark.parametrize("key,owner,f", owned(), ids=lambda x: x if isinstance(x, str) else "")
def test_old_flat_key_gives_the_new_keys_config(key, owner, f, tmp_path):
    v = other_value(f)
    new = get_config("cpu-demo", overrides=[f"algo.name={owner}", f"algo.{owner}.{f.name}={v}"])
    with pytest.warns(FutureWarning, match=f"algo.{key} is now algo.NAME.{f.name}"):
        old = get_config("cpu-demo", overrides=[f"algo.{key}={v}", f"algo.name={owner}"])  # either order
    assert old == new and getattr(algo_settings(old), f.name) == v
    (tmp_path / "old.yaml").write_text(yaml.safe_dump({"algo": {"name": owner, key: v}}))
    with pytest.warns(FutureWarning):
        assert load_config(tmp_path / "old.yaml", get_config("cpu-demo")) == new


def test_a_saved_config_at_the_old_defaults_loads_silently(tmp_path):
    "A run folder's config.yaml from before holds every old key; at their defaults they say nothing"
    old = {"algo": {"name": "tppo", **{k: d for k, (_, d) in MOVED.items()}, "settings": {}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(old))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = load_config(tmp_path / "c.yaml")
    assert c.algo.settings == {} and c == apply_overrides(Config(), ["algo.name=tppo"])


def test_settings_are_built_once_and_checked_by_name():
    algo = make_algorithm(get_config("cpu-demo", overrides=["algo.name=bppo", "algo.bppo.prefix_mode=ratio"]))
    assert algo.settings is algo.settings and algo.settings.prefix_mode == "ratio"
    assert moved_to("lam", "ppo") == "ppo" and moved_to("lam", "bppo") == "tppo"
    with pytest.raises(ConfigError, match="algo.bppo.prefix_mod: bppo has no setting 'prefix_mod'"):
        make_algorithm(get_config("cpu-demo", overrides=["algo.name=bppo", "algo.bppo.prefix_mod=ratio"]))


def test_the_panel_reads_a_plugins_settings_without_string_annotations():
    "This file has no `from __future__ import annotations`: its dataclass's field types are classes, not strings"
    from dataclasses import dataclass
    from bppo_kit.core import ALGORITHMS, SETTINGS, Algorithm, register
    from bppo_kit.widgets import panel_fields, widget_spec

    @dataclass
    class PlainSettings:
        label: str = "x"
        rate: float = 0.5
        on: bool = False

    register("plain_plugin", settings=PlainSettings)(type("PlainPlugin", (Algorithm,), {}))
    try:
        assert "algo.plain_plugin.rate" in panel_fields(Config())[1]
        assert [widget_spec(Config(), f"algo.plain_plugin.{k}")["kind"] for k in ("label", "rate", "on")] == [
            "text", "float_box", "checkbox"]
    finally:
        ALGORITHMS.pop("plain_plugin")
        SETTINGS.pop("plain_plugin")
