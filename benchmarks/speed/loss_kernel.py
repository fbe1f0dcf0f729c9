"""Time and peak memory of the prefix policy loss: full logits (naive) vs the chunked PyTorch path, and on CUDA the
Triton kernels.

    OMP_NUM_THREADS=1 python benchmarks/speed/loss_kernel.py --json runs/loss_kernel.json  # CPU: N=4096, H=512, V=32000
    OMP_NUM_THREADS=1 python benchmarks/speed/loss_kernel.py --small --json runs/loss_kernel_small.json  # CI size

What is measured, per implementation: one forward + backward of `prefix_policy_loss` (gradients w.r.t. hidden and
weight) on float32 inputs, half of every 512-token sequence trained (a prefix mask: 50% of the tokens), old log-probs
close to the current ones (as right after a rollout), seed 0.

- time: the median of `--repeats` forward+backward runs after one warm-up run.
- CPU peak memory: each implementation runs in its own fresh Python process (`--child`), so neither sees the other's
  heap. After the warm-up the process resets its kernel high-water mark (`echo 5 > /proc/self/clear_refs`,
  Linux >= 4.0), reads its resident set size, runs forward+backward once, and reports `VmHWM - VmRSS_before`: the extra
  resident memory at the peak of that run, gradients included. glibc is told to serve every allocation above 64 KiB
  with mmap (`MALLOC_MMAP_THRESHOLD_=65536`), so freed tensors leave the resident set at once and a tensor freed early
  cannot hide in, or inflate, a later peak. This counts pages actually touched, which every PyTorch tensor here is.
- CUDA (when available; not run where the kit was developed): bfloat16 at H=1536, V=151936 (Qwen2.5's vocabulary),
  N=16384: naive vs chunked vs Triton (and Liger-Kernel's `LigerFusedLinearGRPOLoss` when importable), time by CUDA
  events, memory by `torch.cuda.max_memory_allocated()` above the inputs (`measure`, also used by
  `tools/gpu_check.py`).

Acceptance targets at the CPU shape: chunked peak memory >= 4x below naive, time no worse than 1.5x naive.
"""
import argparse, gc, json, os, re, statistics, subprocess, sys, time
from pathlib import Path
import torch
from bppo_kit.kernels import prefix_policy_loss, streaming_lse

SEQ = 512  # tokens per sequence; the first half of each is the trained prefix

def make_inputs(N, H, V, dtype=torch.float32, device="cpu", seed=0, seq=SEQ):
    "Hidden states, LM head, targets, old log-probs (near the current ones), per-token advantages and a prefix mask"
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(V, H, generator=g) * (2 / H ** 0.5)).to(device=device, dtype=dtype)  # logits with std ~2
    t = torch.randint(V, (N,), generator=g).to(device)
    with torch.no_grad():  # the current log-probs, without full logits
        lp = torch.cat([(h[i:i + 1024].float() * w[t[i:i + 1024]].float()).sum(1) - streaming_lse(h[i:i + 1024], w)
                        for i in range(0, N, 1024)])
    old = lp + 0.05 * torch.randn(N, generator=g).to(device)
    seq = min(seq, N)
    adv = torch.randn(N // seq, generator=g).repeat_interleave(seq).to(device)  # one advantage per sequence
    mask = ((torch.arange(N) % seq) < seq // 2).to(device)  # a prefix: the first half of every sequence
    return dict(hidden=h.requires_grad_(), weight=w.requires_grad_(), targets=t, old_logp=old.float(), advantages=adv,
                mask=mask)

def step(x, impl):
    "One forward + backward; gradients are freed first so every run allocates them anew"
    x["hidden"].grad = x["weight"].grad = None
    loss = prefix_policy_loss(x["hidden"], x["weight"], x["targets"], x["old_logp"], x["advantages"], x["mask"],
                              impl=impl)
    loss.backward()
    return loss.item()

def _status(key):
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024

def child(a):
    "Measure one implementation in this (fresh) process and print one JSON line"
    torch.manual_seed(0)
    x = make_inputs(a.N, a.H, a.V)
    loss = step(x, a.child)  # warm-up: lazy initialisation, thread pools
    x["hidden"].grad = x["weight"].grad = None
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS
    before = _status("VmRSS")
    step(x, a.child)
    peak = _status("VmHWM") - before
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        step(x, a.child)
        times.append(time.perf_counter() - t0)
    print(json.dumps(dict(impl=a.child, peak_bytes=peak, time_s=statistics.median(times), times_s=times, loss=loss)))

def run_child(impl, a):
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536"}
    cmd = [sys.executable, __file__, "--child", impl, "--N", str(a.N), "--H", str(a.H), "--V", str(a.V),
           "--repeats", str(a.repeats)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode: raise SystemExit(f"{impl} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])

def cpu_bench(a):
    res = {impl: run_child(impl, a) for impl in ("naive", "chunked")}
    n, c = res["naive"], res["chunked"]
    out = dict(shape=dict(N=a.N, H=a.H, V=a.V, masked_frac=0.5, dtype="float32"), threads=torch.get_num_threads(),
               naive_peak_bytes=n["peak_bytes"], chunked_peak_bytes=c["peak_bytes"],
               naive_time_s=n["time_s"], chunked_time_s=c["time_s"],
               memory_ratio=n["peak_bytes"] / max(c["peak_bytes"], 1), time_ratio=c["time_s"] / n["time_s"],
               loss_abs_diff=abs(n["loss"] - c["loss"]), logits_bytes=a.N * a.V * 4, runs=res)
    out["memory_target_met"] = out["memory_ratio"] >= 4
    out["time_target_met"] = out["time_ratio"] <= 1.5
    print(f"CPU, N={a.N} H={a.H} V={a.V}, 50% masked, float32, {out['threads']} thread(s); "
          f"fwd+bwd, median of {a.repeats}")
    print(f"{'impl':<10}{'time (s)':>10}{'peak (MiB)':>12}")
    for k in ("naive", "chunked"):
        print(f"{k:<10}{res[k]['time_s']:>10.3f}{res[k]['peak_bytes'] / 2**20:>12.1f}")
    print(f"memory: chunked {out['memory_ratio']:.1f}x below naive (target >= 4);"
          f" time: chunked/naive = {out['time_ratio']:.2f} (target <= 1.5)")
    return out

class Peak:
    "Peak memory above a baseline: CUDA's allocator on a GPU; on a CPU the resident set's high-water mark (Linux)"
    def __init__(self, device: str = "cuda"): self.cuda, self.base = str(device).startswith("cuda"), 0

    def reset(self):
        "Take the current memory as the baseline and forget the peak so far"
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            gc.collect()
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            self.base = _status("VmRSS")

    def read(self) -> tuple[int, int]:
        "(peak above the baseline, peak in all) in bytes since the last `reset`"
        if self.cuda:
            torch.cuda.synchronize()
            total = torch.cuda.max_memory_allocated()
        else: total = _status("VmHWM")
        return max(0, total - self.base), total

def measure(fn, repeats: int = 3, device: str = "cuda", reset=None) -> dict:
    "After a warm-up call of `fn` and `reset()`: one call's peak memory above its start, the median time of `repeats`"
    fn()
    if reset: reset()
    cuda = str(device).startswith("cuda")
    if cuda: torch.cuda.empty_cache()
    peak = Peak(device)
    peak.reset()
    loss = fn()
    extra = peak.read()[0]
    ts = []
    for _ in range(repeats):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return dict(peak_bytes=extra, time_s=statistics.median(ts), times_s=ts, loss=loss)

def gpu_bench(a):
    "naive vs chunked vs Triton (vs Liger when installed) on CUDA in bfloat16"
    N, H, V = (2048, 512, 32000) if a.small else (16384, 1536, 151936)
    x = make_inputs(N, H, V, torch.bfloat16, "cuda", seq=1024)
    impls = {k: (lambda k=k: step(x, k)) for k in ("naive", "chunked", "triton")}
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
        B = N // 1024
        lig = LigerFusedLinearGRPOLoss(beta=0.0, use_ref_model=False, epsilon_low=0.2, epsilon_high=0.28,
                                       loss_type="bnpo")
        def liger():
            x["hidden"].grad = x["weight"].grad = None
            loss, _ = lig(x["hidden"].view(B, 1024, H), x["weight"], x["targets"].view(B, 1024),
                          x["mask"].view(B, 1024).float(),
                          x["advantages"].view(B, 1024)[:, 0], old_per_token_logps=x["old_logp"].view(B, 1024))
            loss.backward()
            return loss.item()
        impls["liger"] = liger
    except ImportError as e: print(f"liger-kernel not importable ({e}); skipped")
    res = {}
    def clear(): x["hidden"].grad = x["weight"].grad = None
    for name, fn in impls.items():
        try: res[name] = measure(fn, a.repeats, "cuda", reset=clear)
        except Exception as e:  # one failing implementation must not hide the others' numbers
            res[name] = dict(error=f"{type(e).__name__}: {e}"[:500])
        clear()
        torch.cuda.empty_cache()
    print(f"\nCUDA ({torch.cuda.get_device_name()}), N={N} H={H} V={V}, 50% masked, bfloat16; "
          f"fwd+bwd, median of {a.repeats}")
    print(f"{'impl':<10}{'time (ms)':>11}{'peak (GiB)':>12}")
    for k, r in res.items():
        print(f"{k:<10}" + (f"{r['time_s'] * 1e3:>11.1f}{r['peak_bytes'] / 2**30:>12.2f}" if "error" not in r
                            else "  " + r["error"]))
    out = dict(shape=dict(N=N, H=H, V=V, masked_frac=0.5, dtype="bfloat16"), device=torch.cuda.get_device_name(),
               runs=res)
    if "error" not in res.get("naive", {"error": 1}) and "error" not in res.get("triton", {"error": 1}):
        out["memory_ratio"] = res["naive"]["peak_bytes"] / max(res["triton"]["peak_bytes"], 1)
        out["speedup"] = res["naive"]["time_s"] / res["triton"]["time_s"]
    return out

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="CI size: N=1024, H=128, V=8000 on CPU")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-cuda", action="store_true", help="skip the CUDA part even where a GPU is present")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--N", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--H", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--V", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child: return child(a)
    a.N, a.H, a.V = (1024, 128, 8000) if a.small else (4096, 512, 32000)
    out = dict(command=" ".join(["python", "benchmarks/speed/loss_kernel.py"] + sys.argv[1:]), torch=torch.__version__,
               **cpu_bench(a))
    if torch.cuda.is_available() and not a.no_cuda: out["cuda"] = gpu_bench(a)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.json}")

if __name__ == "__main__":
    main()
