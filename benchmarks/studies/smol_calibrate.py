"""Choose cpu-smol's sampling temperature on the train and val sums (never the test ones): the base model's
lenient and strict accuracy and mixed-group fraction, 8 samples a problem, the kit engine in the preset's dtype.
Usage: HF_HUB_OFFLINE=1 python benchmarks/studies/smol_calibrate.py 0.5 0.6 0.7 1.0"""
import sys
import time
import torch
from bppo_kit.config import get_config
from bppo_kit.core import SamplingParams
from bppo_kit.data import arith_examples
from bppo_kit.evaluate import summarize
from bppo_kit.kit_engine import KitEngine
from bppo_kit.policy import load_policy, prompt_ids

torch.manual_seed(0)
c = get_config("cpu-smol")
d = c.data
model, tok = load_policy(c.model.name_or_path, dtype=c.model.dtype)
model.eval()
ex = arith_examples("train", d.arith_max, d.arith_ops) + arith_examples("val", d.arith_max, d.arith_ops)
prompts = [prompt_ids(tok, e, d) for e in ex]
for temp in map(float, sys.argv[1:]):
    engine = KitEngine(model, tok, max_slots=64)
    t = time.time()
    cs = engine.generate(prompts, 8, SamplingParams(temperature=temp, max_new_tokens=96, logprobs=False))
    dt = time.time() - t
    r = summarize(ex, cs, 8, tok.eos_token_id)
    print(f"n={len(ex)} T={temp}: lenient {r['accuracy']:.3f} strict {r['strict_accuracy']:.3f} "
          f"mixed {r['mixed_group_fraction']:.2f} tokens {r['mean_response_tokens']:.1f} "
          f"tok/s {sum(x.n_tokens for x in cs) / dt:.0f}", flush=True)
