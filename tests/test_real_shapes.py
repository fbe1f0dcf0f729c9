"""The Qwen2.5-0.5B shape (494M parameters, the BPE tokenizer of `bppo_kit.shapes`) trained on the CPU through
`bppo_kit.trainer.train`: 2 steps of GRPO and 2 of BPPO in bfloat16 with the chunked loss and gradient checkpointing.

Random weights never answer right, so the rewards are coin flips (`examples/plugins/coin_rewards.py`); everything
else is the kit's loop. Slow (a minute or two) and about 12 GB of memory at its peak (in `make test` beside one other
test worker); alone: `python -m pytest -m slow tests/test_real_shapes.py -s`. On disk it needs the model (1 GB) and
one run's checkpoint (6 GB: float32 weights and AdamW's moments) at a time: each run is removed once read, and the
test skips, saying why, where the disk has less free.
"""
import gc, math, resource, shutil, time
import pytest, torch
from safetensors.torch import load_file
from transformers import AutoConfig
from conftest import ROOT


def _changed(before: dict, after: dict) -> tuple[int, int]:
    "(tensors that differ, elements that differ) between two state dicts of the same keys"
    n_t = n_e = 0
    for k, a in before.items():
        d = int((a != after[k]).sum())
        n_t, n_e = n_t + (d > 0), n_e + d
    return n_t, n_e


@pytest.mark.slow
def test_train_qwen2_5_0_5b_shape_on_cpu(tmp_path):
    from bppo_kit.cli import load_plugin
    from bppo_kit.config import get_config
    from bppo_kit.runs import checkpoint_bytes, read_jsonl_rows
    from bppo_kit.shapes import param_count, qwen2_5_config, save_real_shaped
    from bppo_kit.trainer import train
    # the bf16 model, one checkpoint, and 1 GB for the rest (the swap writes the first save whole, then renames)
    need = 2 * param_count(qwen2_5_config("0.5b")) + checkpoint_bytes(qwen2_5_config("0.5b"))["total"] + 2**30
    free = shutil.disk_usage(tmp_path).free
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB free on the disk of {tmp_path}; it has {free / 2**30:.1f}")
    load_plugin(str(ROOT / "examples" / "plugins" / "coin_rewards.py"))  # grpo_coin, bppo_coin
    t0 = time.time()
    folder = save_real_shaped(tmp_path / "model", "0.5b", "bfloat16", seed=0)
    before = load_file(folder / "model.safetensors")
    n_params = sum(v.numel() for v in before.values())
    assert n_params == 494_032_768 == param_count(AutoConfig.from_pretrained(folder))
    print(f"\n0.5B-shaped checkpoint written in {time.time() - t0:.1f} s")
    for algo in ("grpo_coin", "bppo_coin"):
        out = tmp_path / f"run-{algo}"
        cfg = get_config("cpu-demo", overrides=[
            f"algo.name={algo}", f"model.name_or_path={folder}", "model.dtype=bfloat16", "train.loss_kernel=chunked",
            "model.gradient_checkpointing=True", "rollout.engine=kit", "train.prompts_per_step=2",
            "rollout.group_size=4", "rollout.max_new_tokens=12", "train.lr=1e-6", "train.steps=2", "train.device=cpu",
            f"train.out={out}"])
        t0 = time.time()
        summary = train(cfg, progress=False, evaluate_every=False)
        seconds = time.time() - t0
        rows = read_jsonl_rows(out / "metrics.jsonl")
        assert summary["steps"] == 2 and len(rows) == 2
        for r in rows:
            assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["skipped"] == 0, r
            assert r["trained_tokens"] > 0 and 0 < r["generated_tokens"] <= 2 * 4 * 12, r
        after = load_file(out / "checkpoint" / "model.safetensors")
        n_t, n_e = _changed(before, after)
        assert n_e / n_params > 0.99, f"{n_e / n_params:.2%} of the elements moved"  # fp32 masters keep lr 1e-6
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        steps = ", ".join(f"{r['wall_s']:.1f}" for r in rows)
        updates = ", ".join(f"{r['update_s']:.1f}" for r in rows)
        print(f"{algo}: {seconds:.1f} s for 2 steps (step {steps} s; update {updates} s), "
              f"losses {[round(r['loss'], 5) for r in rows]}, "
              f"trained tokens {[r['trained_tokens'] for r in rows]}; weights changed: {n_t} of {len(before)} tensors, "
              f"{n_e / n_params:.2%} of elements; peak RSS so far {maxrss / 2**30:.2f} GiB "
              f"(threads {torch.get_num_threads()})", flush=True)
        del after
        gc.collect()
        shutil.rmtree(out)  # one checkpoint at a time on the disk
    shutil.rmtree(folder)
