"EGAE and T-PPO maths: property tests against direct loop implementations of the equations, on random ragged batches."
import math
import pytest, torch
from hypothesis import given, settings, strategies as st
from conftest import examples
from bppo_kit.egae import (adaptive_lambda, dual_clip_surrogate, egae, explained_variance, mc_returns, terminal_rewards,
                           tppo_token_mask, value_loss, whiten_clamp)
from bppo_kit.core import clipped_surrogate

F64 = torch.float64

def egae_loop(r, v, lengths, finished, gamma, lam):
    "The equations read literally: per row, per token, V_next by the EGAE rule, delta, discounted sum to the row's end"
    B, T = r.shape
    A, R = torch.zeros(B, T, dtype=F64), torch.zeros(B, T, dtype=F64)
    for b in range(B):
        L, lb = int(lengths[b]), float(lam[b]) if torch.is_tensor(lam) else lam
        def v_next(t, b=b, L=L):
            if t + 1 < L: return float(v[b, t + 1])
            return 0.0 if finished[b] else float(v[b, L - 1])  # after the last token
        delta = [float(r[b, t]) + gamma * v_next(t) - float(v[b, t]) for t in range(L)]
        for t in range(L):
            A[b, t] = sum((gamma * lb) ** k * delta[t + k] for k in range(L - t))
            R[b, t] = A[b, t] + float(v[b, t])
    return A, R

def batch(draw_seed, B, T):
    g = torch.Generator().manual_seed(draw_seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    r = torch.randn(B, T, generator=g, dtype=F64)
    v = torch.randn(B, T, generator=g, dtype=F64)
    fin = torch.rand(B, generator=g) < 0.5
    return g, lengths, mask, r, v, fin

@settings(max_examples=examples(60))
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 6), T=st.integers(1, 9),
       gamma=st.sampled_from([1.0, 0.99, 0.9, 0.5]), lam=st.sampled_from([0.0, 0.5, 0.95, 1.0, "per-seq"]))
def test_egae_matches_loop(seed, B, T, gamma, lam):
    g, lengths, mask, r, v, fin = batch(seed, B, T)
    if lam == "per-seq": lam = torch.rand(B, generator=g, dtype=F64)
    A, R = egae(r, v, mask, fin, gamma, lam)
    Ar, Rr = egae_loop(r, v, lengths, fin, gamma, lam)
    assert A.dtype == F64 and A.shape == (B, T)
    torch.testing.assert_close(A, Ar, atol=1e-6, rtol=0)
    torch.testing.assert_close(R, Rr, atol=1e-6, rtol=0)
    assert (A[~mask] == 0).all() and (R[~mask] == 0).all()

@settings(max_examples=examples(40))
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 6), T=st.integers(1, 9),
       gamma=st.sampled_from([1.0, 0.97, 0.6]))
def test_all_finished_lam1_is_monte_carlo(seed, B, T, gamma):
    g, lengths, mask, r, v, _ = batch(seed, B, T)
    _, R = egae(r, v, mask, torch.ones(B, dtype=torch.bool), gamma, 1.0)
    want = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        for t in range(int(lengths[b])):
            want[b, t] = sum(gamma ** k * float(r[b, t + k]) for k in range(int(lengths[b]) - t))
    torch.testing.assert_close(R, want, atol=1e-9, rtol=0)
    torch.testing.assert_close(mc_returns(r, mask, gamma), want, atol=1e-9, rtol=0)

def test_unfinished_gamma1_last_delta_is_reward():
    "gamma = 1: V_next = V at the last token of an unfinished row, so delta there is r and A_last = r"
    g, lengths, mask, r, v, _ = batch(3, 8, 7)
    A, R = egae(r, v, mask, torch.zeros(8, dtype=torch.bool), 1.0, 0.7)
    for b in range(8):
        L = int(lengths[b])
        if L: assert abs(float(A[b, L - 1]) - float(r[b, L - 1])) < 1e-12
    # and with zero rewards, lam = 1: every return is the bootstrap value V(s_{l-1})
    _, R0 = egae(torch.zeros_like(r), v, mask, torch.zeros(8, dtype=torch.bool), 1.0, 1.0)
    for b in range(8):
        L = int(lengths[b])
        if L: torch.testing.assert_close(R0[b, :L], v[b, L - 1].expand(L))

def test_padding_is_ignored():
    "Whatever sits in masked positions (even inf/nan) does not reach the result"
    g, lengths, mask, r, v, fin = batch(5, 6, 8)
    r2, v2 = r.clone(), v.clone()
    r2[~mask], v2[~mask] = float("nan"), float("inf")
    for lam in (0.9, torch.rand(6, generator=g, dtype=F64)):
        A, R = egae(r, v, mask, fin, 0.95, lam)
        A2, R2 = egae(r2, v2, mask, fin, 0.95, lam)
        assert torch.equal(A, A2) and torch.equal(R, R2)

def test_egae_float32_close_to_float64_and_no_grad():
    g, lengths, mask, r, v, fin = batch(7, 4, 50)
    vg = v.float().requires_grad_()
    A32, R32 = egae(r.float(), vg, mask, fin, 1.0, 0.95)
    A64, R64 = egae(r, v, mask, fin, 1.0, 0.95)
    assert A32.dtype == torch.float32 and not A32.requires_grad and not R32.requires_grad
    torch.testing.assert_close(A32.double(), A64, atol=1e-4, rtol=1e-4)

def test_egae_rejects_bad_inputs():
    m = torch.tensor([[True, False, True]])
    with pytest.raises(ValueError, match="left-aligned"):
        egae(torch.zeros(1, 3), torch.zeros(1, 3), m, torch.ones(1).bool())
    with pytest.raises(ValueError, match="finished"):
        egae(torch.zeros(1, 3), torch.zeros(1, 3), m[:, :1].expand(1, 3), torch.ones(2).bool())
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        egae(torch.zeros(1, 3), torch.zeros(1, 4), torch.ones(1, 3).bool(), torch.ones(1).bool())
    with pytest.raises(ValueError, match="lam"):
        egae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3).bool(), torch.ones(2).bool(), lam=torch.ones(2, 1))
    A, R = egae(torch.zeros(2, 0), torch.zeros(2, 0), torch.ones(2, 0).bool(), torch.ones(2).bool())  # empty window
    assert A.shape == R.shape == (2, 0)

@settings(max_examples=examples(30))
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 6), T=st.integers(1, 9))
def test_terminal_rewards_loop(seed, B, T):
    g, lengths, mask, *_ , fin = batch(seed, B, T)
    s = torch.rand(B, generator=g)
    out = terminal_rewards(s, lengths, fin, T)
    for b in range(B):
        for t in range(T):
            want = float(s[b]) if (fin[b] and t == int(lengths[b]) - 1) else 0.0
            assert float(out[b, t]) == want

@settings(max_examples=examples(30))
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 6), T=st.integers(1, 12), k=st.integers(0, 13))
def test_token_mask_loop(seed, B, T, k):
    g, lengths, mask, *_ , fin = batch(seed, B, T)
    tm = tppo_token_mask(mask, fin, k)
    for b in range(B):
        L = int(lengths[b])
        keep = L if fin[b] else max(L - k, 0)
        assert tm[b].tolist() == [t < keep for t in range(T)]

def test_adaptive_lambda_values():
    lam = adaptive_lambda(torch.tensor([0, 1, 20, 400, 401, 10_000]))
    want = [0.95, 0.95, 0.95, 0.95, 1 - 1 / (0.05 * 401), 1 - 1 / 500]
    torch.testing.assert_close(lam.double(), torch.tensor(want, dtype=F64), atol=1e-7, rtol=0)
    assert (adaptive_lambda(torch.arange(0, 5000, 7)).diff() >= 0).all()
    torch.testing.assert_close(adaptive_lambda(torch.tensor([100.]), lam0=0.5, alpha=0.1), torch.tensor([0.9]))

def test_value_loss_reference_and_gradient():
    g = torch.Generator().manual_seed(11)
    v, old, ret = (torch.randn(5, 7, generator=g, dtype=F64) for _ in range(3))
    mask = torch.rand(5, 7, generator=g) < 0.7
    vg = v.clone().requires_grad_()
    loss = value_loss(vg, old, ret, mask, 0.5, 0.6)
    terms = []
    for b in range(5):
        for t in range(7):
            if mask[b, t]:
                vc = min(max(float(v[b, t]), float(old[b, t]) - 0.5), float(old[b, t]) + 0.6)
                terms.append(0.5 * max((float(v[b, t]) - float(ret[b, t])) ** 2, (vc - float(ret[b, t])) ** 2))
    assert abs(loss.item() - sum(terms) / len(terms)) < 1e-12
    loss.backward()
    assert (vg.grad[~mask] == 0).all()
    # inside the clip range the gradient is (V - R) / n
    inside = mask & (v > old - 0.5) & (v < old + 0.6)
    torch.testing.assert_close(vg.grad[inside], ((v - ret) / mask.sum())[inside])

def test_value_loss_zero_at_target_within_range():
    R = torch.randn(3, 4, dtype=F64)
    assert value_loss(R, R + 0.3, R, torch.ones(3, 4).bool()).item() == 0.0

@settings(max_examples=examples(40))
@given(seed=st.integers(0, 2**31 - 1))
def test_dual_clip_reference(seed):
    g = torch.Generator().manual_seed(seed)
    lp, old = torch.randn(4, 6, generator=g, dtype=F64) * 2, torch.randn(4, 6, generator=g, dtype=F64) * 2
    adv = torch.randn(4, 6, generator=g, dtype=F64)
    loss, clipped = dual_clip_surrogate(lp, old, adv, 0.2, 0.28, 10.0)
    base, _ = clipped_surrogate(lp, old, adv, 0.2, 0.28)
    for i in range(4):
        for j in range(6):
            ratio, a = math.exp(float(lp[i, j] - old[i, j])), float(adv[i, j])
            obj = min(ratio * a, min(max(ratio, 0.8), 1.28) * a)
            if a < 0: obj = max(obj, 10.0 * a)
            assert abs(float(loss[i, j]) + obj) < 1e-9 * max(1.0, abs(obj))
    assert (loss[adv >= 0] == base[adv >= 0]).all()  # positive advantages: plain clipped PPO
    assert (loss <= -10.0 * adv + 1e-12)[adv < 0].all()
    # clipped tokens carry no gradient; the others do (where adv != 0)
    p = lp.clone().requires_grad_()
    dual_clip_surrogate(p, old, adv)[0].sum().backward()
    assert (p.grad[clipped] == 0).all() and (p.grad[~clipped & (adv != 0)] != 0).all()

def test_whiten_clamp_properties():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(6, 10, generator=g, dtype=F64) * 3 + 1
    mask = torch.rand(6, 10, generator=g) < 0.6
    w = whiten_clamp(a, mask, clamp=1e9)
    assert abs(w[mask].mean().item()) < 1e-9 and abs(w[mask].std(unbiased=False).item() - 1) < 1e-6
    assert (w[~mask] == 0).all()
    assert whiten_clamp(a * 100, mask, clamp=1.5).abs().max().item() <= 1.5
    assert (whiten_clamp(torch.full((2, 3), 4.0), torch.ones(2, 3).bool()) == 0).all()  # constant: all 0, no nan

def test_explained_variance():
    g = torch.Generator().manual_seed(4)
    R = torch.randn(4, 9, generator=g, dtype=F64)
    mask = torch.rand(4, 9, generator=g) < 0.7
    assert explained_variance(R, R, mask) == 1.0
    noisy = R + 0.1 * torch.randn(4, 9, generator=g, dtype=F64)
    y, p = R[mask], noisy[mask]
    want = 1 - ((y - p) - (y - p).mean()).pow(2).mean() / (y - y.mean()).pow(2).mean()
    assert abs(explained_variance(noisy, R, mask) - want.item()) < 1e-12
    assert math.isnan(explained_variance(R, torch.ones_like(R), mask))
    assert math.isnan(explained_variance(R, R, torch.zeros_like(mask)))
