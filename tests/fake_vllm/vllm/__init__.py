"""A recorder standing in for vLLM (tests/test_vllm_build.py): `LLM` logs how the kit builds and drives it and answers
with short fixed completions. Nothing is computed; on PYTHONPATH it is what `import vllm` finds.

With `COMPUTE` set (or `FAKE_VLLM_COMPUTE=1` in the environment) it samples instead, as vLLM does: the model in the
folder `LLM` was built from, on the CPU, weights pushed by `reload_weights` loaded into it, and each drawn token's
log-prob reported as `logprobs_mode` asks (`processed_logprobs`: after the temperature, top-k and top-p, renormalised
over the kept tokens; `raw_logprobs`: the raw logits'). Its top-k / top-p is written after vLLM's sampler, not taken
from the kit, so the kit's engines are checked against a separate implementation (tests/test_truncated_logprobs.py,
tests/test_eval_checkpoint.py)."""
import json, os
from types import SimpleNamespace as NS

EVENTS: list[dict] = []  # this process's log; also appended to `$FAKE_VLLM_LOG.RANK` when that is set
WEIGHTS: list[dict] = []  # the weights of every push, in order (this process)
__version__ = "0.11.0"  # a release the kit accepts (VLLMCompat.OLDEST and later)
COMPUTE = os.environ.get("FAKE_VLLM_COMPUTE") == "1"  # sample the checkpoint's model (slow: tests of what is drawn)


def record(kind: str, **kw):
    EVENTS.append(dict(kind=kind, **kw))
    path = os.environ.get("FAKE_VLLM_LOG")
    if path:
        with open(f"{path}.{os.environ.get('RANK', '0')}", "a") as f:
            f.write(json.dumps(EVENTS[-1], default=str) + "\n")


class SamplingParams:
    def __init__(self, n=1, top_k=0, max_tokens=16, stop_token_ids=(), seed=None, temperature=1.0, top_p=1.0,
                 logprobs=None, **kw):
        self.n, self.top_k, self.max_tokens, self.seed = n, top_k, max_tokens, seed
        self.temperature, self.top_p, self.logprobs = temperature, top_p, logprobs
        self.stop_token_ids = list(stop_token_ids)


class _Runner:  # current vLLM's model runner: a layer-wise reload that takes the weights it is given
    def reload_weights(self, weights_iterator=None, is_checkpoint_format=True): pass


def _top_k_top_p(logits, top_k: int, top_p: float):
    "vLLM's `apply_top_k_top_p`: one ascending sort, the k-th largest's mask, then the nucleus of what is left"
    import torch
    srt, idx = logits.sort(dim=-1)
    if top_k > 0:
        kth = srt[..., max(0, srt.shape[-1] - top_k)].unsqueeze(-1)
        srt = srt.masked_fill(srt < kth, float("-inf"))
    if top_p < 1:
        cut = srt.softmax(-1).cumsum(-1) <= 1 - top_p
        cut[..., -1] = False  # at least one token
        srt = srt.masked_fill(cut, float("-inf"))
    return torch.empty_like(srt).scatter_(-1, idx, srt)


def _sample(model, ids: list[int], sp: SamplingParams, mode: str) -> list:
    "`sp.n` samples of the prompt `ids` from `model`, as vLLM's `CompletionOutput`s"
    import torch
    gen = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else None  # else torch's generator
    x, past = torch.tensor([ids] * sp.n), {}
    toks, lps, live = [[] for _ in range(sp.n)], [[] for _ in range(sp.n)], [True] * sp.n
    with torch.no_grad():
        for _ in range(sp.max_tokens):
            out = model(input_ids=x, use_cache=True, **past)
            # the cache goes back in under the name it came out by (`cache` in transformers 5, else `past_key_values`)
            past = {k: v for k, v in out.items() if k in ("cache", "past_key_values")}
            raw = out.logits[:, -1].float()
            if sp.temperature == 0: scores, nxt = raw, raw.argmax(-1)
            else:
                scores = _top_k_top_p(raw / sp.temperature, sp.top_k, sp.top_p)
                nxt = torch.multinomial(scores.softmax(-1), 1, generator=gen)[:, 0]
            lp = (scores if mode == "processed_logprobs" else raw).log_softmax(-1)
            for r, t in enumerate(nxt.tolist()):
                if not live[r]: continue
                toks[r].append(t)
                lps[r].append({t: NS(logprob=lp[r, t].item())})
                live[r] = t not in sp.stop_token_ids
            if not any(live): break
            x = nxt[:, None]
    return [NS(index=j, token_ids=t, logprobs=l, finish_reason="stop" if t[-1] in sp.stop_token_ids else "length",
               stop_reason=t[-1] if t[-1] in sp.stop_token_ids else None) for j, (t, l) in enumerate(zip(toks, lps))]


class LLM:
    def __init__(self, model, **kw):
        env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        record("LLM", model=str(model), env=env, **kw)
        self.llm_engine = NS(model_config=NS(max_model_len=kw.get("max_model_len") or 2048),
                             engine_core=NS(shutdown=lambda: record("shutdown")))
        self.worker = NS(model_runner=_Runner(), reload_weights=True)
        self.mode = kw.get("logprobs_mode", "raw_logprobs")
        self.model = None
        if COMPUTE:
            from transformers import AutoModelForCausalLM
            self.model = AutoModelForCausalLM.from_pretrained(str(model)).eval()

    def sleep(self, level=1): record("sleep", level=level)
    def wake_up(self, tags=None): record("wake_up", tags=tags)
    def reset_prefix_cache(self): record("reset_prefix_cache")

    def collective_rpc(self, method, kwargs=None):
        if callable(method): return [method(self.worker)]
        w = {k: v.detach().to("cpu").clone() for k, v in kwargs["weights_iterator"]}
        WEIGHTS.append(w)
        record(method, tensors=len(w), dtypes=sorted({str(v.dtype) for v in w.values()}))
        if self.model is not None:  # vLLM's names are the checkpoint's: a name it does not know is an error
            got = self.model.load_state_dict({k: v.float() for k, v in w.items()}, strict=False)
            assert not got.unexpected_keys, got.unexpected_keys
        return [None]

    def generate(self, prompts, params, use_tqdm=False):
        record("generate", prompts=len(prompts))
        if self.model is not None:
            return [NS(outputs=_sample(self.model, p["prompt_token_ids"], sp, self.mode))
                    for p, sp in zip(prompts, params)]
        outs = []
        for p, sp in zip(prompts, params):
            ids, stop = p["prompt_token_ids"], sp.stop_token_ids[0]
            samples = []
            for j in range(sp.n):
                k = 1 + ((sp.seed or 0) + j) % 3
                toks = ([ids[-1]] * k)[:sp.max_tokens - 1] + [stop]
                samples.append(NS(index=j, token_ids=toks, logprobs=[{t: NS(logprob=-0.5)} for t in toks],
                                  finish_reason="stop", stop_reason=stop))
            outs.append(NS(outputs=samples))
        return outs
