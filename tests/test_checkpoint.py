"""Checkpoints at scale: no second copy on the disk, a save killed anywhere never resumes a mix, GPU-written state
loads on the CPU, each process reads what it uses, and the size estimate matches a written checkpoint."""
import json, os, subprocess, sys
from functools import partial
from pathlib import Path

import pytest, torch
import transformers.modeling_utils as modeling_utils
from safetensors.torch import load_file
from transformers import Qwen2ForCausalLM

from bppo_kit.config import ConfigError, data_dir, get_config
from bppo_kit.policy import add_lora, char_tokenizer, load_policy, tiny_config
from bppo_kit.runs import (SAVING, checkpoint_bytes, load_trainer_state, open_run, save_checkpoint, settle_checkpoint,
                           tree_bytes)

ROOT = Path(__file__).resolve().parents[1]
SLACK = 4096  # the marker file and a rounding of the small files


def trained(hidden=32, layers=1, intermediate=64, seed=0, lora_r=0):
    "A tiny Qwen2 with one AdamW step taken (so the optimizer has state): (model, tokenizer, optimizer)"
    tok = char_tokenizer()
    torch.manual_seed(seed)
    m = Qwen2ForCausalLM(tiny_config(tok, hidden_size=hidden, num_layers=layers, num_heads=2,
                                     intermediate_size=intermediate))
    if lora_r: m = add_lora(m, lora_r, 2 * lora_r)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)
    m(torch.tensor([[5, 6, 7]])).logits.sum().backward()
    opt.step()
    return m, tok, opt


def files(folder: Path) -> dict:
    return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}


def test_trainer_imports_without_matplotlib():
    "A GPU image without plotting installed can still import the trainer (matplotlib only where a figure is drawn)"
    code = "import sys; sys.modules['matplotlib'] = None; import bppo_kit.trainer, bppo_kit.runs; print('ok')"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def peak_while_saving(monkeypatch, run_dir: Path, save) -> int:
    "The most bytes under `run_dir` right after any file write of `save()` (torch.save, safetensors, os.replace)"
    peak = [tree_bytes(run_dir)]
    def after(f):
        def wrapped(*a, **k):
            out = f(*a, **k)
            peak.append(tree_bytes(run_dir))
            return out
        return wrapped
    with monkeypatch.context() as mp:
        mp.setattr(torch, "save", after(torch.save))
        mp.setattr(modeling_utils, "safe_save_file", after(modeling_utils.safe_save_file))
        mp.setattr(os, "replace", after(os.replace))
        save()
    return max(peak)


def test_rewrite_in_place_never_holds_two_copies(tmp_path, monkeypatch):
    "Peak disk of a save in place <= checkpoint + its largest file (in fact + a few bytes); the swap's holds two"
    m, tok, opt = trained(hidden=128, layers=2, intermediate=512)
    peaks = {}
    for name, headroom in (("in place", 0), ("swap", 2**40)):
        run = tmp_path / name.replace(" ", "_")
        save_checkpoint(run, m, tok, opt, 1)
        second = partial(save_checkpoint, run, m, tok, opt, 2, headroom=headroom)
        peaks[name] = peak_while_saving(monkeypatch, run, second)
        ckpt = run / "checkpoint"
        assert load_trainer_state(ckpt)["step"] == 2 and SAVING not in files(ckpt)
    final, largest = tree_bytes(ckpt), max(files(ckpt).values())
    assert final > 4e6 and largest < 0.75 * final, (final, largest)  # weights, and AdamW's state twice their size
    assert peaks["in place"] <= final + largest + SLACK, (peaks, final, largest)
    assert peaks["in place"] <= final + SLACK, (peaks, final)  # old files go before the new come
    assert peaks["swap"] > final + largest + SLACK and peaks["swap"] >= 1.9 * final, (peaks, final)


class Crash(BaseException):
    "A kill: not an `Exception`, so nothing on the way catches it (`shutil.rmtree(ignore_errors=True)` included)"


def crash_at(monkeypatch, k: int):
    "Die just before the k-th disk operation (write, rename, replace, delete) of what follows"
    seen = [0]
    def gate(f):
        def wrapped(*a, **kw):
            seen[0] += 1
            if seen[0] == k: raise Crash(f"killed before operation {k}")
            return f(*a, **kw)
        return wrapped
    for mod, name in ((os, "replace"), (os, "rename"), (os, "unlink"), (torch, "save"),
                      (modeling_utils, "safe_save_file")):
        monkeypatch.setattr(mod, name, gate(getattr(mod, name)))


def outcome(cfg, ckpt: Path, saves: dict) -> str:
    "Resume as the trainer does: 'mix refused', or the step whose weights and optimizer state the folder holds whole"
    try: open_run(cfg, resume=True)
    except ConfigError as e:
        assert "cannot be resumed" in str(e) and "\n" not in str(e), e
        return "mix refused"
    st = load_trainer_state(ckpt)
    m, opt = saves[st["step"]]
    w = load_file(str(ckpt / "model.safetensors"))
    assert all(torch.equal(w[k], v) for k, v in m.state_dict().items() if k in w), f"weights not of step {st['step']}"
    assert torch.equal(st["optimizer"]["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert SAVING not in files(ckpt)
    return f"step {st['step']}"


@pytest.mark.parametrize("headroom", [0, 2**30], ids=["in place", "swap"])
def test_a_save_killed_anywhere_never_resumes_a_mix(tmp_path, monkeypatch, headroom):
    "Kill the second save before each of its disk operations in turn: resume gets step 1 or 2 whole, or one clear line"
    saves = {1: trained(seed=1)[::2], 2: trained(seed=2)[::2]}
    tok = char_tokenizer()
    seen = []
    for k in range(1, 100):
        run = tmp_path / f"k{k}"
        cfg = get_config("cpu-demo", overrides=[f"train.out={run}"])
        save_checkpoint(run, saves[1][0], tok, saves[1][1], 1)
        with monkeypatch.context() as mp:
            crash_at(mp, k)
            try: save_checkpoint(run, saves[2][0], tok, saves[2][1], 2, headroom=headroom)
            except Crash: pass
            else: break  # the save had fewer than k operations: it finished
        seen.append(outcome(cfg, run / "checkpoint", saves))
    assert outcome(cfg, run / "checkpoint", saves) == "step 2" and len(seen) > 8, seen
    if headroom: assert set(seen) == {"step 1", "step 2"}, seen  # the swap: always whole
    else: assert set(seen) == {"step 1", "mix refused", "step 2"}, seen  # in place: a stretch it cannot resume


def test_settle_judges_the_marker(tmp_path):
    "A marker beside a whole checkpoint: 'new' (the save's own trainer_state) or 'old' (another's); then it is gone"
    m, tok, opt = trained()
    ckpt = save_checkpoint(tmp_path, m, tok, opt, 1)
    save_checkpoint(tmp_path, m, tok, opt, 2, headroom=0)
    sid = load_trainer_state(ckpt)["save_id"]
    for marker_id, kept in ((sid, "new"), ("another save", "old")):
        (ckpt / SAVING).write_text(json.dumps(dict(step=2, previous=1, id=marker_id)))
        assert settle_checkpoint(ckpt, clear=False) == kept and (ckpt / SAVING).exists()
        assert settle_checkpoint(ckpt) == kept and settle_checkpoint(ckpt) == "clean"
    (ckpt / SAVING).write_text(json.dumps(dict(step=3, previous=2, id="x")))
    (ckpt / "trainer_state.pt").unlink()
    with pytest.raises(ConfigError, match="from step 2 to step 3 .* cannot be resumed"): load_trainer_state(ckpt)


def test_state_written_on_a_gpu_loads_on_the_cpu(tmp_path, monkeypatch):
    "trainer_state.pt as rank 0 of a GPU run writes it (storages tagged cuda:0): it loads onto the CPU, not cuda:0"
    m, tok, opt = trained()
    with monkeypatch.context() as mp:
        mp.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        ckpt = save_checkpoint(tmp_path, m, tok, opt, 1)
    if not torch.cuda.is_available():  # the load without map_location: onto a GPU, and here there is none
        with pytest.raises(RuntimeError, match="CUDA"): torch.load(ckpt / "trainer_state.pt", weights_only=True)
    st = load_trainer_state(ckpt)
    tensors = [t for s in st["optimizer"]["state"].values() for t in s.values()] + [st["rng"]["torch"]]
    assert {t.device.type for t in tensors} == {"cpu"}
    o2 = torch.optim.AdamW(m.parameters(), lr=1e-3)
    o2.load_state_dict(st["optimizer"])
    assert torch.equal(o2.state_dict()["state"][1]["exp_avg_sq"], opt.state_dict()["state"][1]["exp_avg_sq"])


def mapped_rss(path: Path) -> int:
    "Bytes of `path` this process has mapped and touched (Linux: /proc/self/smaps)"
    rss, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ")[0] and len(line.split()) >= 5: inside = line.split()[-1] == str(path)
        elif inside and line.startswith("Rss:"): rss += int(line.split()[1]) * 1024
    return rss


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
def test_each_process_reads_only_what_it_uses(tmp_path):
    "Two ranks' entries of 32 MB each: a process that takes its own touches about half of the file, not all of it"
    m, tok, opt = trained()
    ranks = [dict(rng=None, algo=dict(critic=torch.full((8 * 2**20,), float(r)))) for r in range(2)]
    ckpt = save_checkpoint(tmp_path, m, tok, opt, 1, ranks=ranks)
    path = (ckpt / "trainer_state.pt").resolve()
    st = load_trainer_state(ckpt)
    assert mapped_rss(path) < 2**20  # mapped, not read
    assert st["ranks"][1]["algo"]["critic"].sum().item() == 8 * 2**20  # rank 1's entry, read
    assert 30 * 2**20 < mapped_rss(path) < 0.75 * path.stat().st_size, (mapped_rss(path), path.stat().st_size)


@pytest.mark.parametrize("lora_r", [0, 64], ids=["full", "lora"])
def test_size_estimate_matches_a_written_checkpoint(tmp_path, lora_r):
    "checkpoint_bytes from the config alone, against the bytes a real save writes: within 3%"
    m, tok, opt = trained(hidden=128, layers=2, intermediate=512, lora_r=lora_r)
    real = tree_bytes(save_checkpoint(tmp_path, m, tok, opt, 1))
    est = checkpoint_bytes(m.config if not lora_r else m.get_base_model().config, lora_r, 2 * lora_r)
    assert est["total"] == pytest.approx(real, rel=0.03), (est, real)
    assert est["optimizer"] == pytest.approx(2 * est["weights"], rel=0.01)


@pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(), reason="needs the shipped policy")
def test_trainer_resumes_a_checkpoint_rewritten_in_place_and_refuses_a_mix(tmp_path):
    "The loop resumes from a checkpoint rewritten in place; one whose rewrite died midway stops it in one line"
    from bppo_kit.trainer import train
    small = ["train.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=16", "train.eval_every=0",
             f"train.out={tmp_path / 'r'}"]
    cfg = get_config("cpu-demo", overrides=small + ["train.steps=1"])
    train(cfg, progress=False, evaluate_every=False)
    ckpt = tmp_path / "r" / "checkpoint"
    m, tok = load_policy(str(ckpt), "float32")
    opt = torch.optim.AdamW(m.parameters(), lr=cfg.train.lr, betas=(0.9, 0.99), weight_decay=0.0)
    opt.load_state_dict(load_trainer_state(ckpt)["optimizer"])
    save_checkpoint(tmp_path / "r", m, tok, opt, 1, headroom=0)  # in place, what a bigger model's save does
    more = get_config("cpu-demo", overrides=small + ["train.steps=2"])
    assert train(more, resume=True, progress=False, evaluate_every=False)["steps"] == 2
    class DiskFull:
        def save_pretrained(self, folder, **kw): raise OSError(28, "No space left on device")
    with pytest.raises(OSError): save_checkpoint(tmp_path / "r", DiskFull(), tok, opt, 3, headroom=0)
    with pytest.raises(ConfigError, match="from step 2 to step 3 .* cannot be resumed"):
        train(get_config("cpu-demo", overrides=small + ["train.steps=4"]), resume=True, progress=False,
              evaluate_every=False)


@pytest.mark.skipif(not (data_dir() / "tiny_policy" / "config.json").exists(), reason="needs the shipped policy")
def test_train_refuses_a_disk_too_small_for_its_checkpoint_before_training(tmp_path, monkeypatch):
    "With less free than a checkpoint (`checkpoint_bytes`) under train.out, `train` stops in one line, untrained"
    import shutil
    from bppo_kit.trainer import train
    from bppo_kit.plan import model_config
    need = checkpoint_bytes(model_config("tiny"))["total"]
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=need // 2))
    cfg = get_config("cpu-demo", overrides=["train.steps=1", f"train.out={tmp_path / 'r'}"])
    with pytest.raises(ConfigError, match=r"train.out: .* GiB free and a checkpoint of this run takes"):
        train(cfg, progress=False, evaluate_every=False)
    assert not (tmp_path / "r" / "metrics.jsonl").exists() and not (tmp_path / "r" / "checkpoint").exists()


def test_interrupted_train_says_what_the_checkpoint_holds(tmp_path, monkeypatch, capsys):
    "`bppo train` stopped by Ctrl-C reports no checkpoint, the step it holds, or a half-rewritten one, in one line"
    import bppo_kit.api as api
    from bppo_kit.cli import cmd_train
    def stopped(self, **kw): raise KeyboardInterrupt
    monkeypatch.setattr(api.RLTrainer, "train", stopped)
    cfg = get_config("cpu-demo", overrides=[f"train.out={tmp_path}"])
    args = type("Args", (), dict(resume=False, quiet=True, overwrite=False))()
    said = lambda: (cmd_train(args, cfg), capsys.readouterr().err.strip().splitlines()[-1])
    assert said() == (130, "bppo: interrupted; no checkpoint was saved")
    m, tok, opt = trained()
    ckpt = save_checkpoint(tmp_path, m, tok, opt, 4)
    capsys.readouterr()  # the save's own progress bar
    assert said() == (130, f"bppo: interrupted; the checkpoint in {ckpt} holds step 4 (continue with --resume)")
    (ckpt / SAVING).write_text(json.dumps(dict(step=5, previous=4, id="x")))
    (ckpt / "trainer_state.pt").unlink()  # killed in the middle of a rewrite in place
    code, line = said()
    assert code == 130 and "from step 4 to step 5" in line and "cannot be resumed" in line and "\n" not in line
