"""The kit's FSDP2 code on 2 CPU processes (run by tests/test_distributed.py under torchrun).

accelerate runs FSDP only on accelerators, so on this CPU the sharding comes from PyTorch's own `fully_shard` (the
function accelerate's FSDP2 path calls), behind a small stand-in for the few `Accelerator` methods `Dist` uses.
Checked: `update` on the sharded policy, each process with its deal of the items, makes the update one process makes
on all of them (naive and fused loss); `full_state_dict` gathers the weights for the engine's copy, and an engine
with weights of its own gets the gathered ones from `Session.refresh_engine`; a checkpoint
written from the shards loads with `from_pretrained`, and its name-keyed optimizer state into a plain optimizer.

    torchrun --nproc_per_node 2 tests/fsdp2_check.py OUT_DIR
"""
import contextlib, copy, json, random, sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as td
from torch.distributed.fsdp import fully_shard

from bppo_kit.config import get_config
from bppo_kit.core import Engine, EngineCaps, TrainItem
from bppo_kit.distributed import Dist, checkpoint_states, deal_items, full_state_dict, load_optimizer_state
from bppo_kit.policy import load_policy, merged_state_dict
from bppo_kit.trainer import Session
from bppo_kit.runs import load_trainer_state, save_checkpoint
from bppo_kit.update import update


class TorchFSDP2:
    "The `Accelerator` methods `Dist` calls, over torch.distributed and `fully_shard`"
    distributed_type = SimpleNamespace(name="FSDP")
    device = torch.device("cpu")
    def __init__(self): self.process_index, self.num_processes = td.get_rank(), td.get_world_size()
    def reduce(self, t, op):
        td.all_reduce(t)
        return t
    def wait_for_everyone(self): td.barrier()
    def backward(self, loss): loss.backward()
    def unwrap_model(self, m): return m
    @contextlib.contextmanager
    def no_sync(self, model):
        model.set_requires_gradient_sync(False)
        try: yield
        finally: model.set_requires_gradient_sync(True)
    def clip_grad_norm_(self, params, max_norm):
        n = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return n.full_tensor() if hasattr(n, "full_tensor") else n
    def prepare(self, model, opt):
        for layer in model.model.layers: fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), **{k: v for k, v in opt.defaults.items()
                                                               if k in ("lr", "betas", "weight_decay")})


class FSDPDist(Dist):
    def gather(self, obj):
        out = [None] * self.world
        td.all_gather_object(out, obj)
        return out


def items_for(seed: int, n: int = 7) -> list[TrainItem]:
    "Train items of uneven lengths and advantages (3 processes' worth of micro-batches at micro_batch 2)"
    r = random.Random(seed)
    return [TrainItem([r.randrange(3, 60) for _ in range(5)], [r.randrange(3, 60) for _ in range(r.randrange(4, 20))],
                      r.choice([-1.0, 0.5, 1.5]), r.randrange(2, 4)) for _ in range(n)]


def main(out: Path):
    td.init_process_group("gloo")
    torch.manual_seed(0)
    res = {}
    for kernel in ("naive", "chunked"):
        cfg = get_config("cpu-demo", overrides=["train.micro_batch=2", f"train.loss_kernel={kernel}"])
        lr = cfg.train.lr
        base, tok = load_policy(cfg.model.name_or_path, "float32", "cpu")
        items = items_for(1)
        for it in items: it.end = len(it.completion_ids) - 1  # most of each completion trains
        one = copy.deepcopy(base)  # the one-process reference, on every process
        update(one, torch.optim.AdamW(one.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0), items, cfg,
               tok.pad_token_id)
        d = FSDPDist(TorchFSDP2())
        model, opt = d.prepare(copy.deepcopy(base), torch.optim.AdamW(base.parameters(), lr=lr, betas=(0.9, 0.99),
                                                                      weight_decay=0.0))
        mets = update(model, opt, deal_items(items, d.world)[d.rank], cfg, tok.pad_token_id, dist=d)
        full = full_state_dict(d, model)
        ref = one.state_dict()
        res[kernel] = dict(max_diff=max((full[k] - ref[k]).abs().max().item() for k in ref),
                           lr=lr, moved=max((ref[k] - base.state_dict()[k]).abs().max().item() for k in ref),
                           trained_tokens=mets["trained_tokens"])
    # an engine with weights of its own (vLLM) is synced by the loop from the gathered weights, never from a shard
    class OwnWeights(Engine):
        caps = EngineCaps(own_weights=True)
        def sync_weights(self, m): self.got = {k: v.detach().clone() for k, v in merged_state_dict(m).items()}
    eng = OwnWeights()
    gen = copy.deepcopy(base).eval().requires_grad_(False)  # the trainer's copy to gather into (setup, under FSDP2)
    from bppo_kit.distributed import gather_into
    from bppo_kit.plan import LiveBytes  # the sync's peak: weight by weight, and the whole state dict at once
    held = list(gen.state_dict().values()) + [v.to_local() for v in model.state_dict().values()]  # not the sync's
    with LiveBytes(keep=held) as live: gather_into(d, model, gen)  # one weight at a time
    res["sync_peak"] = live.peaks.get("update", 0)
    res["gather_diff"] = max((gen.state_dict()[k] - v).abs().max().item() for k, v in full_state_dict(d, model).items())
    torch.manual_seed(1)  # rows that do not split evenly over the processes, and a weight with fewer rows than them
    odd = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 7), torch.nn.Linear(7, 1))
    whole = copy.deepcopy(odd).requires_grad_(False)
    for p in whole.parameters(): p.zero_()  # a weight the gather missed stays zero
    from torch.distributed.fsdp import fully_shard
    gather_into(d, fully_shard(odd), whole)
    res["uneven_gather_diff"] = max((whole.state_dict()[k] - v).abs().max().item()
                                    for k, v in full_state_dict(d, odd).items())
    with LiveBytes(keep=held) as live2: gen.load_state_dict(full_state_dict(d, model))
    res["sync_peak_whole"] = live2.peaks.get("update", 0)
    res["model_bytes"] = sum(4 * p.numel() for p in base.parameters())
    from bppo_kit.plan import plan  # the planner's row for this model on 2 FSDP2 processes
    res["sync_planned"] = plan(cfg, gpus=d.world, shard="fsdp2", device="cpu")["FSDP2 weight sync, a weight at a time"]
    Session(model, tok, opt, None, None, eng, None, gen=gen, dist=d).refresh_engine()
    res["engine_sync_keys"] = sorted(eng.got) == sorted(full)
    res["engine_sync_diff"] = max((eng.got[k] - full[k]).abs().max().item() for k in full)
    res["engine_sync_plain"] = all(type(v) is torch.Tensor for v in eng.got.values())  # no DTensor shards
    msd, osd, fmt = checkpoint_states(d, model, opt)
    if d.main:
        save_checkpoint(out, model, tok, opt, 1, None, None, msd, osd, fmt)
        back, _ = load_policy(str(out / "checkpoint"), "float32", "cpu")
        res["checkpoint_diff"] = max((back.state_dict()[k] - full[k]).abs().max().item() for k in full)
        st = load_trainer_state(out / "checkpoint")
        plain = copy.deepcopy(back)
        popt = torch.optim.AdamW(plain.parameters(), lr=1e-3)
        load_optimizer_state(plain, popt, st["optimizer"], st["optimizer_format"])
        res["optimizer_format"], res["optimizer_states"] = st["optimizer_format"], len(popt.state_dict()["state"])
        (out / "fsdp2.json").write_text(json.dumps(res))
    td.barrier()
    td.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
