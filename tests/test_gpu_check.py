"tools/gpu_check.py --smoke: the GPU check's own code, run on the CPU at tiny shapes, so that it cannot rot"
import importlib.util, json, math, os, re, subprocess, sys, venv
from importlib import metadata
from pathlib import Path
import pytest, torch
from packaging.requirements import Requirement
from conftest import ROOT

SCRIPT = ROOT / "tools" / "gpu_check.py"
GUIDE = ROOT / "docs" / "guides" / "gpu.md"
# what a lent GPU machine has: its own python3 with these (and what they require), no kit venv
MACHINE = ("torch", "triton", "transformers")


def _finite(x): return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _env(): return os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _planner_exists() -> bool:
    if importlib.util.find_spec("bppo_kit.plan") is None: return False
    import bppo_kit.plan
    return callable(getattr(bppo_kit.plan, "plan", None))


def _norm(name: str) -> str: return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots) -> dict:
    "The installed distributions `roots` need, their requirements' too (extras left out): name -> distribution"
    seen, todo = {}, list(roots)
    while todo:
        name = _norm(todo.pop())
        if name in seen: continue
        try: seen[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError: continue
        for r in seen[name].requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}): todo.append(req.name)
    return seen


def _bare_python(folder: Path) -> Path:
    "A venv holding only the machine's packages and the carried wheels (links into this venv): its python"
    venv.create(folder, with_pip=False, symlinks=True)
    site = next((folder / "lib").glob("python3*")) / "site-packages"
    for dist in _closure(MACHINE + _script().WHEELS).values():
        # a distribution's files: its top-level packages and modules, and its .dist-info (for its version)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            src = Path(dist.locate_file(top))
            if src.exists() and not top.endswith(".pth") and not (site / top).exists(): (site / top).symlink_to(src)
    return folder / "bin" / "python"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    ("One smoke run (about 30-100 s on 2 busy cores) by a python that has only torch, triton, transformers, their "
     "requirements and `WHEELS`, as a lent GPU machine: its exit code, its JSON and its printed summary")
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    python = _bare_python(tmp_path_factory.mktemp("bare") / "venv")
    r = subprocess.run([str(python), str(SCRIPT), "--smoke", "--out", str(out)], env=_env(), capture_output=True,
                       text=True, timeout=420, cwd=out.parent)
    assert out.exists(), (r.stdout[-2000:], r.stderr[-3000:])
    return r, json.loads(out.read_text())


def test_every_section_ok(smoke):
    r, res = smoke
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert res["smoke"] is True and _finite(res["total_s"]) and res["failed"] == []
    s = res["sections"]
    # the machine has no vLLM (tests/test_vllm.py runs the section on vLLM's CPU build): the section says why not
    assert {k: v["status"] for k, v in s.items()} == dict.fromkeys(
        ("preflight", "triton", "kernel", "memory", "train", "engine", "rope", "cost"), "ok") | {"vllm": "n/a"}, \
        {k: v.get("error") for k, v in s.items()}
    assert "vllm does not import" in s.pop("vllm")["reason"] and "vllm       not run" in r.stdout
    for name, sec in s.items():
        assert _finite(sec["seconds"]) and sec["checks"] and all(sec["checks"].values()), (name, sec["checks"])
    assert "failed: nothing" in r.stdout


def test_the_carried_wheels_are_enough(smoke):
    "The run imported only the machine's packages, their requirements and the carried wheels, which are pure Python"
    gc, imported = _script(), smoke[1]["imported"]
    allowed = _closure(MACHINE + gc.WHEELS)
    assert {"torch", "transformers", "fastcore"} <= {_norm(d) for d in imported}, imported
    assert all(_norm(d) in allowed for d in imported), set(map(_norm, imported)) - set(allowed)
    for name in gc.WHEELS:
        wheel = metadata.distribution(name).read_text("WHEEL")
        assert "Root-Is-Purelib: true" in wheel and "py3-none-any" in wheel, (name, wheel)


def test_the_guide_gives_the_commands():
    "The GPU guide's first check: the wheels downloaded here, carried, installed there, the check run, no GPU figure"
    gc, text = _script(), GUIDE.read_text()
    section = text[text.index("## A first check on a GPU"):]
    download = next(line for line in section.splitlines() if "pip download" in line)
    assert "--no-deps" in download and ".whl" in download, download
    freeze = next(line for line in section.splitlines() if "pip freeze" in line)
    assert all(name in freeze for name in gc.WHEELS), freeze
    # the wheels unpacked beside the checkout (no pip needed), or installed by pip without an index
    unpack = 'for w in .whl/*.whl; do python3 -m zipfile -e "$w" .whl/site; done'
    assert f"{unpack}\nPYTHONPATH=.:.whl/site python3 tools/gpu_check.py --out $OUT/gpu_check.json" in section
    assert "--no-index" in section and "PYTHONPATH=. python3 tools/gpu_check.py --out $OUT/gpu_check.json" in section
    assert '"carry": [".whl"]' in section and "no GPU figure has been measured" in " ".join(section.split())


def test_preflight(smoke):
    pf = smoke[1]["sections"]["preflight"]
    assert pf["torch"] == torch.__version__ and pf["python"] and pf["transformers"] and pf["device"]
    assert pf["cuda_available"] is False and pf["triton_interpret"] == "1"
    # nothing the check imports plots: a GPU image without matplotlib runs it
    assert pf["kit_imports_matplotlib"] is False and "bppo_kit.trainer" in pf["kit_modules"]
    # the bare machine has none of the optional packages, and the whole run passes without them
    assert set(pf["optional"]) == set(pf["missing"]) == {"accelerate", "peft", "vllm", "matplotlib", "math_verify"}
    for name, line in pf["missing"].items(): assert pf["optional"][name] in line and "needed for" in line


def test_triton_matches_float64(smoke):
    tr = smoke[1]["sections"]["triton"]
    for dt, tol in (("bfloat16", dict(loss=1e-4, grad=1e-2)), ("float32", dict(loss=1e-4, grad=1e-4))):
        e = tr[dt]["errors"]
        assert all(_finite(v) for v in e.values()) and e["loss"] < tol["loss"], (dt, e)
        assert max(e["dH"], e["dW"]) < tol["grad"] and tr[dt]["masked_dH_max"] == 0, (dt, e)
        assert all(_finite(v) for v in tr[dt]["repeat"]["max_rel_diff"].values()), tr[dt]["repeat"]
    # bfloat16 gradients carry bfloat16's rounding; float32 ones do not
    assert tr["bfloat16"]["errors"]["dW"] > 10 * tr["float32"]["errors"]["dW"]


def test_kernel_is_the_trainers_loss_path(smoke):
    "Issue 52: the loss path as `update` runs it in bfloat16, the full-logits baseline included, at a micro-batch"
    k = smoke[1]["sections"]["kernel"]
    sh = k["shape"]
    assert (sh["masters"], sh["compute"], sh["path"]) == ("float32", "bfloat16", "bppo_kit.update.micro_batch_loss")
    assert sh["N"] == sh["micro_batch"] * sh["response"] and k["auto_is"] == "triton" and k["tis_cap"] > 0, sh
    for impl in ("naive", "chunked", "auto"):
        r = k["runs"][impl]
        assert _finite(r["time_s"]) and r["time_s"] > 0 and _finite(r["peak_bytes"]) and _finite(r["loss"]), (impl, r)
        assert all(_finite(r[f"{x}_rel_err"]) for x in ("loss", "dH", "dW")), (impl, r)
    # the trainer's full-logits path rounds the logits to bfloat16 (the old baseline kept them in float32); the fused
    # paths sum bfloat16 products in float32
    assert max(k["runs"][i]["loss_rel_err"] for i in ("chunked", "auto")) < 1e-4 < k["runs"]["naive"]["loss_rel_err"]
    assert _finite(k["auto_speedup"]) and _finite(k["chunked_memory_ratio"]) and _finite(k["float64_loss"])
    assert {"naive_ran_or_oom", "chunked_grads_within_1e-2", "auto_grads_within_1e-2"} <= set(k["checks"])


def test_out_of_memory_is_recorded(monkeypatch):
    "The full-logits path may run out of memory at the math shape: recorded as `oom`; any other error is raised"
    gc = _script()
    k = gc.SMOKE["kernel"]
    mb, hidden, weight = gc.loss_inputs(k, "cpu")
    def out_of_memory(*args, **kw): raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.96 GiB")
    monkeypatch.setattr(gc, "loss_step", out_of_memory)
    r = gc.loss_run("naive", k, mb, hidden.requires_grad_(), weight.requires_grad_(), {}, "cpu")
    assert r["oom"] is True and "Tried to allocate" in r["error"] and "time_s" not in r, r
    monkeypatch.setattr(gc, "loss_step", lambda *args, **kw: 1 / 0)
    with pytest.raises(ZeroDivisionError): gc.loss_run("naive", k, mb, hidden, weight, {}, "cpu")


def test_memory_against_the_planner(smoke):
    m = smoke[1]["sections"]["memory"]
    assert set(m["runs"]) == {"64", "128"} and m["model"]["gradient_checkpointing"] is True
    prompts, group = m["model"]["step"]["prompts"], m["model"]["step"]["group"]
    for T, r in m["runs"].items():
        assert r["trained_tokens"] == r["micro_batch"] * r["micro_batches"] * int(T), r
        assert _finite(r["peak_bytes"]) and r["peak_bytes"] > 0 and _finite(r["first_call"]["peak_bytes"]), r
        assert _finite(r["grad_norm"]) and r["grad_norm"] > 0 and r["skipped"] == 0, r
        # the kit engine's full cache: every slot of the step's rollout (at most `rollout.max_slots`, 256)
        kv = r["kv_cache"]
        assert (kv["slots"], kv["positions"]) == (min(256, prompts * group), r["prompt_tokens"] + int(T)), kv
        if _planner_exists():
            assert _finite(r["measured_over_predicted"]) and r["predicted_bytes"] > 0, r
            # the ledger: each state row of the plan beside the tensors the trainer holds for it
            assert set(r["ledger"]) == {"weights (float32 masters)", "AdamW state (2 x float32)", "generation copy",
                                        "kit engine KV cache"}, r["ledger"]
            assert all(abs(x["held_over_planned"] - 1) <= 0.1 and x["held_bytes"] > 0 for x in r["ledger"].values())
            assert r["ledger"]["kit engine KV cache"]["held_bytes"] == kv["bytes"]
        else: assert r["planner"] == "unavailable" and r["reason"], r


def test_train_step_per_kernel(smoke):
    tr = smoke[1]["sections"]["train"]
    assert set(tr["runs"]) == {"naive", "chunked", "auto"} and tr["workload"]["auto_is"] == "triton"
    for k, r in tr["runs"].items():
        assert _finite(r["loss"]) and _finite(r["grad_norm"]) and r["grad_norm"] > 0 and r["skipped"] == 0, (k, r)
        # bfloat16 with tis_cap > 0 records the engine's log-probs: the sampler's KL to the trainer is measured
        assert _finite(r["sampler_kl"]) and r["sampler_kl"] >= 0, (k, r)
        assert _finite(r["wall_s"]) and r["peak_bytes"] > 0 and r["trained_tokens"] > 0, (k, r)
        assert r["grad_norm_rel_diff"] < 0.05, (k, r)
    assert len({r["rollout_digest"] for r in tr["runs"].values()}) == 1  # one seed, one rollout


def test_engine_rates_sampler_and_greedy_identity(smoke):
    e = smoke[1]["sections"]["engine"]
    for name in ("kit", "hf"):
        r = e[name]
        assert r["rows"] == 4 * 2 and r["prompt_tokens"] == 8 * 48 and r["new_tokens"] > 0, (name, r)
        assert _finite(r["tokens_per_s"]) and r["tokens_per_s"] > 0 and r["predicted_s"] > 0, (name, r)
        assert r["error"] == pytest.approx(r["predicted_s"] / r["seconds"] - 1), (name, r)
    # the kit engine's prediction comes from its own pass histogram: one pass per token after the prefill's
    assert e["kit"]["passes"] >= e["kit"]["longest"] - 1 > 0 and e["priced_as"] == "H100"
    sp = e["step_split"]
    assert (sp["rows"], sp["vocab"]) == (8, 8192) and sp["pass_s"] > 0 and sp["sampler_s"] > 0, sp
    assert sp["sampler_share"] == pytest.approx(sp["sampler_s"] / (sp["pass_s"] + sp["sampler_s"]))
    assert "sampler_under_a_quarter_of_the_step" not in e["checks"]  # the CPU's figures are not judged
    g = e["greedy"]["float32"]
    assert g["prompts"] == 3 and g["identical_fraction"] == 1.0 and g["first_divergence"] is None, g
    assert all(r["identical"] and r["kit_tokens"] == r["hf_tokens"] > 0 for r in g["rows"]), g["rows"]


def test_rope_drift_by_position(smoke):
    "Issue 52, item 1: the old cast's rotary tables drift with position; the kit's generation copy does not"
    rp = smoke[1]["sections"]["rope"]
    buckets = ["0-100", "100-1000", "1000-2000", "2000-3000", "3000-4096"]
    assert list(rp["before"]) == list(rp["after"]) == buckets
    assert rp["inv_freq_dtype"] == dict(trainer="float32", before="bfloat16", after="float32"), rp["inv_freq_dtype"]
    assert all(rp["after"][b] <= rp["before"][b] for b in buckets) and rp["after"]["3000-4096"] <= 0.01, rp
    # the old cast's error grows with position, to many times bfloat16's rounding of the table at 4k
    assert rp["before"]["3000-4096"] > rp["before"]["100-1000"] > rp["before"]["0-100"], rp["before"]
    assert rp["before"]["3000-4096"] > 20 * rp["after"]["3000-4096"], rp


def test_cost_points_beside_the_model(smoke):
    "The cost section measures each point, sets the cost model's prediction beside it and fits the overheads"
    c = smoke[1]["sections"]["cost"]
    by = lambda phase: [p for p in c["points"] if p["phase"] == phase]
    assert [p["rows"] for p in by("decode pass")] == [1, 4, 8] and [p["rows"] for p in by("prefill")] == [4, 8]
    assert [p["tokens"] for p in by("update")] == [64, 128] and len(by("weight refresh")) == 1
    for p in c["points"]:
        assert _finite(p["measured_s"]) and p["measured_s"] > 0 and _finite(p["predicted_s"]) and p["predicted_s"] > 0
        assert p["error"] == pytest.approx(p["predicted_s"] / p["measured_s"] - 1)
    fit, implied = c["fit"], c["implied"]
    assert fit["points"] == 3 and _finite(fit["per_pass_overhead_s"]) and _finite(fit["slope"]), fit
    assert implied["per_pass_overhead_s"] == fit["per_pass_overhead_s"] and implied["assumed"]["bandwidth"] == 0.75
    assert _finite(implied["prefill_flops"]) and _finite(implied["update_flops"]) and implied["weight_refresh_s"] > 0
    assert c["priced_as"] == "H100" and c["checks"] == {"measured": True, "overhead_fitted": True}


def test_the_full_run_fits_five_minutes_and_says_so(smoke):
    "Issue 43: the full run's budget is at most 300 s, printed section by section before anything runs"
    gc = _script()
    line = gc.estimate_line(gc.FULL, gc.FULL["budget_s"], list(gc.SECTIONS))
    caps, estimates = gc.FULL["caps"], gc.FULL["estimates"]
    assert gc.FULL["budget_s"] <= 300 and sum(caps.values()) <= 300, caps
    assert set(caps) == set(estimates) == set(gc.SECTIONS) and all(estimates[n] <= caps[n] for n in caps)
    assert line.startswith("gpu_check: at most 300 s: preflight 20 s, triton 35 s") and "(expected about" in line
    # the docstring's share table and the GPU guide's estimate are the ones the script runs with
    for n in gc.SECTIONS: assert re.search(rf"\| {n} +\| +{caps[n]} \| +{estimates[n]} \|", gc.__doc__), n
    expected = sum(estimates.values())
    assert f"about {expected} s in all" in " ".join(gc.__doc__.split()), expected
    assert f"about {expected} s on an H100" in " ".join(GUIDE.read_text().split()), expected
    r, _ = smoke
    first = r.stdout.splitlines()[0]
    assert first.startswith("gpu_check: at most ") and all(f"{n} " in first for n in gc.SECTIONS), first


def test_full_shapes_are_the_math_presets():
    "The kernel and memory sections measure at the math preset's micro-batch and step (math-qwen2.5-1.5b)"
    from bppo_kit.config import get_config
    cfg, gc = get_config("math-qwen2.5-1.5b"), _script()
    k, m = gc.FULL["kernel"], gc.FULL["memory"]
    math_batch = (cfg.train.micro_batch, cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens)
    assert (k["micro_batch"], k["prompt"], k["tokens"]) == math_batch, k
    assert (m["micro_batch"], m["prompt"], max(m["tokens"])) == math_batch and m["kernel"] == "auto", m
    assert m["step"] == (cfg.train.prompts_per_step, cfg.rollout.group_size) and m["size"] == "1.5b", m
    e = gc.FULL["engine"]
    assert e["prompts"] * e["n"] == 256 and gc.FULL["cost"]["rows"][-1] == 256, e


def test_preflight_without_matplotlib(tmp_path):
    "A GPU image may have no plotting: the preflight alone, with matplotlib made unimportable, passes"
    out = tmp_path / "preflight.json"
    code = ("import runpy, sys\nsys.modules['matplotlib'] = None\n"
            f"sys.argv = ['gpu_check.py', '--smoke', '--only', '', '--out', {str(out)!r}]\n"
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    pf = json.loads(out.read_text())["sections"]["preflight"]
    assert pf["status"] == "ok" and pf["kit_imports_matplotlib"] is False and pf["checks"], pf


@pytest.mark.skipif(torch.cuda.is_available(), reason="the stop is for a machine without CUDA")
def test_full_mode_stops_without_cuda(tmp_path):
    out = tmp_path / "gpu_check.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], env=_env(), capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 3, (r.stdout[-2000:], r.stderr[-2000:])
    assert r.stdout.strip().splitlines()[-1] == "gpu_check: stopped at the preflight: no CUDA device " \
                                                "(torch.cuda.is_available() is False)"
    res = json.loads(out.read_text())
    assert res["sections"]["preflight"]["status"] == "stopped" and res["failed"] == ["preflight (stopped)"]
    assert set(res["sections"]) == {"preflight"} and res["sections"]["preflight"]["torch"] == torch.__version__
