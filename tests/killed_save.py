"""The child of `test_checkpoint.py`'s kill -9 test: save step 1 of a model, then start saving step 2 and stop at
`point` ('weights': the new folder's weights file written; 'swap': between the save's two renames), print `stopped`
and sleep until the parent kills it with SIGKILL. Step 1's fingerprints go to `run/../step1.json` first.

Usage: python tests/killed_save.py RUN_DIR POINT HIDDEN LAYERS INTERMEDIATE"""
import json, os, sys, time
from pathlib import Path

import torch
import transformers.modeling_utils as modeling_utils
from transformers import Qwen2ForCausalLM

from bppo_kit.policy import char_tokenizer, tiny_config
from bppo_kit.runs import save_checkpoint


def fingerprint(model, opt) -> dict:
    "Float64 sums of every weight and of the first moment of every optimizer entry (exact for equal tensors)"
    return dict(weights={k: v.double().sum().item() for k, v in model.state_dict().items()},
                exp_avg={str(k): s["exp_avg"].double().sum().item() for k, s in opt.state_dict()["state"].items()})


def stop_after(f, when):
    "`f`, then, where `when(*args)` holds, say so and wait to be killed"
    def wrapped(*a, **k):
        out = f(*a, **k)
        if when(*a):
            print("stopped", flush=True)
            time.sleep(600)
        return out
    return wrapped


def main(run: Path, point: str, hidden: int, layers: int, intermediate: int):
    tok = char_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_config(tok, hidden_size=hidden, num_layers=layers, num_heads=8,
                                         intermediate_size=intermediate))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[5, 6, 7]])).logits.sum().backward()
    opt.step()
    save_checkpoint(run, model, tok, opt, 1)
    (run.parent / "step1.json").write_text(json.dumps(fingerprint(model, opt)))
    # step 2: every weight and moment moved, so a file of either step tells which it is
    with torch.no_grad():
        for p in model.parameters(): p.add_(1.0)
    for s in opt.state.values(): s["exp_avg"].add_(1.0)
    if point == "weights":
        inside_new = lambda tensors, path, *a, **k: Path(path).parent.name.startswith("checkpoint.tmp")
        modeling_utils.safe_save_file = stop_after(modeling_utils.safe_save_file, inside_new)
    else:
        first_rename = lambda src, dst, *a, **k: Path(dst).name == "checkpoint.old"
        os.rename = stop_after(os.rename, first_rename)
    save_checkpoint(run, model, tok, opt, 2)
    print("finished", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:6]))
