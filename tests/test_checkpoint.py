"""Checkpoints at scale: a save is whole or absent (killed before any disk operation, or by SIGKILL in the middle of a
checkpoint over 1 GiB, the run resumes the old step), folders the earlier in-place rewrite left still judged, two
checkpoints on the disk at most, GPU-written state loads on the CPU, each process reads what it uses, and the size
estimate matches a written checkpoint."""
import json, os, select, signal, subprocess, sys
from functools import partial
from pathlib import Path

import pytest, torch
import transformers.modeling_utils as modeling_utils
from safetensors.torch import load_file
from transformers import Qwen2ForCausalLM

from bppo_kit.config import ConfigError, data_dir, get_config
from bppo_kit.policy import add_lora, char_tokenizer, load_policy, tiny_config
from bppo_kit.runs import (SAVING, _fsync, _write_whole, checkpoint_bytes, load_trainer_state, open_run,
                           save_checkpoint, settle_checkpoint, tree_bytes)
from killed_save import fingerprint

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


def test_a_save_holds_two_checkpoints_at_most_and_leaves_one(tmp_path, monkeypatch):
    "Peak disk of a save: the old checkpoint and the new one whole (what the trainer's disk check must allow), no more"
    m, tok, opt = trained(hidden=128, layers=2, intermediate=512)
    run = tmp_path / "run"
    save_checkpoint(run, m, tok, opt, 1)
    peak = peak_while_saving(monkeypatch, run, partial(save_checkpoint, run, m, tok, opt, 2))
    ckpt = run / "checkpoint"
    assert load_trainer_state(ckpt)["step"] == 2 and sorted(p.name for p in run.iterdir()) == ["checkpoint"]
    final, largest = tree_bytes(ckpt), max(files(ckpt).values())
    assert final > 4e6 and largest < 0.75 * final, (final, largest)  # weights, and AdamW's state twice their size
    assert 1.9 * final <= peak <= 2 * final + SLACK, (peak, final)


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


def rewrite_in_place(run_dir: Path, model, tok, opt, step: int):
    "The kit's earlier save of a checkpoint over 1 GiB: the old files deleted, then the new written, under a marker"
    final, save_id = run_dir / "checkpoint", f"legacy-{step}"
    state = final / "trainer_state.pt"
    marker = dict(step=step, previous=torch.load(state, weights_only=True, mmap=True)["step"], id=save_id)
    _write_whole(final / SAVING, lambda p: p.write_text(json.dumps(marker)))
    state.unlink()
    _fsync(final)
    for p in list(final.iterdir()):
        if p.name != SAVING: p.unlink()
    model.save_pretrained(final)
    tok.save_pretrained(final)
    for f in final.iterdir(): _fsync(f)
    st = dict(step=step, optimizer=opt.state_dict(), optimizer_format="torch", rng=None, algo=None, ranks=None,
              save_id=save_id)
    _write_whole(state, lambda p: torch.save(st, p))
    (final / SAVING).unlink()
    _fsync(final)


def kill_each_operation(tmp_path, monkeypatch, save) -> list[str]:
    "Kill `save(run, model, tok, opt, 2)` over step 1 before each of its disk operations in turn: the outcomes"
    saves = {1: trained(seed=1)[::2], 2: trained(seed=2)[::2]}
    tok = char_tokenizer()
    seen = []
    for k in range(1, 100):
        run = tmp_path / f"k{k}"
        cfg = get_config("cpu-demo", overrides=[f"train.out={run}"])
        save_checkpoint(run, saves[1][0], tok, saves[1][1], 1)
        with monkeypatch.context() as mp:
            crash_at(mp, k)
            try: save(run, saves[2][0], tok, saves[2][1], 2)
            except Crash: pass
            else: break  # the save had fewer than k operations: it finished
        seen.append(outcome(cfg, run / "checkpoint", saves))
    assert outcome(cfg, run / "checkpoint", saves) == "step 2" and len(seen) > 8, seen
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "config.yaml"]  # nothing left beside it
    return seen


def test_a_save_killed_anywhere_resumes_a_whole_step(tmp_path, monkeypatch):
    "Kill the second save before each of its disk operations in turn: resume always gets step 1 or step 2, whole"
    seen = kill_each_operation(tmp_path, monkeypatch, save_checkpoint)
    assert set(seen) == {"step 1", "step 2"}, seen


def test_a_folder_the_old_rewrite_in_place_left_is_still_judged(tmp_path, monkeypatch):
    "The earlier in-place rewrite killed at each of its operations: resume gets step 1 or 2 whole, or one clear line"
    seen = kill_each_operation(tmp_path, monkeypatch, rewrite_in_place)
    assert set(seen) == {"step 1", "mix refused", "step 2"}, seen


def test_settle_judges_the_marker(tmp_path):
    "A marker beside a whole checkpoint: 'new' (the save's own trainer_state) or 'old' (another's); then it is gone"
    m, tok, opt = trained()
    ckpt = save_checkpoint(tmp_path, m, tok, opt, 1)
    save_checkpoint(tmp_path, m, tok, opt, 2)
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
def test_trainer_resumes_after_a_failed_save_and_refuses_an_old_mix(tmp_path):
    "The loop resumes after a save that failed midway (the old step, whole); an old in-place rewrite's mix: one line"
    from bppo_kit.trainer import train
    small = ["train.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=16", "train.eval_every=0",
             f"train.out={tmp_path / 'r'}"]
    cfg = get_config("cpu-demo", overrides=small + ["train.steps=1"])
    train(cfg, progress=False, evaluate_every=False)
    ckpt = tmp_path / "r" / "checkpoint"
    m, tok = load_policy(str(ckpt), "float32")
    opt = torch.optim.AdamW(m.parameters(), lr=cfg.train.lr, betas=(0.9, 0.99), weight_decay=0.0)
    class DiskFull:
        def save_pretrained(self, folder, **kw): raise OSError(28, "No space left on device")
    with pytest.raises(OSError): save_checkpoint(tmp_path / "r", DiskFull(), tok, opt, 2)
    more = get_config("cpu-demo", overrides=small + ["train.steps=2"])
    assert train(more, resume=True, progress=False, evaluate_every=False)["steps"] == 2
    (ckpt / SAVING).write_text(json.dumps(dict(step=3, previous=2, id="x")))
    (ckpt / "trainer_state.pt").unlink()  # the earlier in-place rewrite, killed midway
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
    (ckpt / "trainer_state.pt").unlink()  # killed in the middle of the earlier rewrite in place
    code, line = said()
    assert code == 130 and "from step 4 to step 5" in line and "cannot be resumed" in line and "\n" not in line


def wait_for_line(p: subprocess.Popen, timeout: float) -> str:
    "The first line `p` prints, waiting at most `timeout` seconds (a dead or silent child fails the test)"
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    line = p.stdout.readline() if ready else ""
    if not line.strip():
        p.kill()
        raise AssertionError(f"the child said nothing in {timeout} s: {p.stderr.read()[-3000:]}")
    return line.strip()


@pytest.mark.parametrize("point,shape", [
    ("weights", (64, 1, 128)), ("swap", (64, 1, 128)),
    # 101M parameters: 1.21 GB of float32 weights and AdamW moments (14 s here; serial: it writes GBs)
    pytest.param("weights", (1024, 6, 4096), marks=pytest.mark.serial, id="weights-over-1GiB")])
def test_kill_9_in_the_middle_of_a_save_resumes_the_old_step(tmp_path, point, shape):
    "SIGKILL a process while it writes step 2's checkpoint: the run resumes from step 1, weights and optimizer whole"
    run = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "tests" / "killed_save.py"), str(run), point, *map(str, shape)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                          start_new_session=True) as p:
        assert wait_for_line(p, timeout=600) == "stopped"
        during = sorted(q.name.split("-")[0] for q in run.iterdir())
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL
    # the new checkpoint half-written beside the old one; or, between the renames, the old one set aside
    assert during == (["checkpoint", "checkpoint.tmp"] if point == "weights" else ["checkpoint.old", "checkpoint.tmp"])
    open_run(get_config("cpu-demo", overrides=[f"train.out={run}"]), resume=True)
    ckpt = run / "checkpoint"
    assert sorted(q.name for q in run.iterdir()) == ["checkpoint", "config.yaml"]
    if shape[0] > 64: assert tree_bytes(ckpt) > 2**30
    st, (m, _) = load_trainer_state(ckpt), load_policy(str(ckpt), "float32")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    opt.load_state_dict(st["optimizer"])
    assert st["step"] == 1 and fingerprint(m, opt) == json.loads((tmp_path / "step1.json").read_text())
