"""A Python model of the fftconv kernels (fftconv_sm80.cu): the same factorisation, matrices,
twiddles and 16-bit rounding points, in float64 elsewhere (the kernels accumulate in fp32, whose
error is far below the 16-bit roundings). It checks the index math against torch.fft (exact
arithmetic: agreement to ~1e-15; the three-factor model keeps the kernel's fp32 twiddles,
~4e-8) and measures the error of the 16-bit scheme, and of the fp32 transform that gives the
filter's spectrum (filter_rfft.cu). Run it to print the error table:

    python csrc/fftconv/model.py

Layouts: n = q + Q p + Q P r (input), k = k_r + R k_p + R P k_q (spectrum), P = 1 for two
factors; see params.h.
"""

import math

import numpy as np
import torch

# Kernel length N -> the factorisation of the FFT of length 2N (params.h, decomposition()).
CONFIGS = {256: (32, 1, 16), 512: (32, 1, 32), 1024: (64, 1, 32), 2048: (16, 16, 16), 4096: (32, 16, 16),
           8192: (64, 16, 16), 16384: (128, 16, 16)}
# Kernel lengths whose filter gradient splits each head's frequencies k_r over this many blocks,
# each scaling its part of the accumulated spectrum to 16 bits by its own power of two
# (three_factor_large.cuh).
FILTER_GRAD_PARTS = {8192: 2, 16384: 4}


def rnd(x, dtype):
    """x (real or complex, float64) rounded to dtype elementwise (real and imaginary parts
    separately), back in float64; dtype None: unchanged."""
    if dtype is None:
        return x
    if np.iscomplexobj(x):
        return rnd(x.real, dtype) + 1j * rnd(x.imag, dtype)
    return torch.from_numpy(np.ascontiguousarray(x)).to(dtype).double().numpy()


def dft(n):
    a = np.arange(n)
    return np.exp(-2j * np.pi * np.outer(a, a) / n)


def root(L, e):
    """w_L^e = exp(-2 pi i e / L)."""
    return np.exp(-2j * np.pi * e / L)


def reference(u, k, pre=None, post=None):
    """float64 causal convolution of u (..., N) with k (Nk <= N) via an FFT of length 2N."""
    u = torch.as_tensor(u).double()
    if pre is not None:
        u = u * torch.as_tensor(pre).double()
    n = u.shape[-1]
    y = torch.fft.irfft(torch.fft.rfft(u, n=2 * n) * torch.fft.rfft(torch.as_tensor(k).double(), n=2 * n),
                        n=2 * n)[..., :n]
    if post is not None:
        y = y * torch.as_tensor(post).double()
    return y.numpy()


def pack_pairs(u, dtype, pre):
    """(B, N) real -> (ceil(B/2), N) complex u[2i] + 1j u[2i+1] (zero past the last batch); the
    pregate multiplies first, rounded to 16 bits once (the kernel multiplies in the 16-bit type)."""
    if pre is not None:
        u = rnd(u * pre, dtype)
    if u.shape[0] % 2:
        u = np.concatenate([u, np.zeros((1, u.shape[1]))])
    return u[0::2] + 1j * u[1::2]


def unpack_pairs(z, batch, dtype, post):
    y = np.empty((2 * z.shape[0], z.shape[-1]))
    y[0::2], y[1::2] = z.real, z.imag
    y = y[:batch]
    if post is not None:
        y = y * post  # fp32 in the kernel, before the one rounding of the output
    return rnd(y, dtype)


def two_factor(u, spectrum, R, Q, dtype, pre=None, post=None):
    """L = R Q. One warp's strip of k_r runs F1 .. G3 in registers; G1 sums the strips."""
    batch, n = u.shape
    L = 2 * n
    z = pack_pairs(u, dtype, pre)
    X = z.reshape(-1, R // 2, Q)                                        # x[r, q], r < R/2
    FRh = rnd(dft(R)[:, : R // 2] / math.sqrt(R), dtype)                # F1's matrix (R, R/2)
    FQ = rnd(dft(Q) / math.sqrt(Q), dtype)
    kr, q = np.arange(R)[:, None], np.arange(Q)[None, :]
    tw = root(L, kr * q)                                               # fp32 in the kernel
    K = spectrum[..., kr + R * q]                                       # [k_r, k_q]
    Y = rnd((FRh @ X) * tw, dtype)                                      # F1, T1
    W = rnd((Y @ FQ) * K, dtype)                                        # F3, times the filter
    U = rnd((W @ np.conj(FQ)) * np.conj(tw), dtype)                     # G3, T1*
    y = np.conj(FRh).T @ U                                              # G1: rows r < R/2
    return unpack_pairs(y.reshape(-1, n), batch, dtype, post)


# Kernel lengths whose forward folds T1 into F2's and F3's matrices (three_factor.cuh, FOLDED and
# FOLDED_Q).
FOLDED = {2048, 4096}


def three_factor(u, spectrum, R, dtype, pre=None, post=None, P=16, Q=16, folded=False):
    """L = R P Q. F1 and G1 with the plain F_R; T1 = w_L^(k_r q) w_L^(Q k_r p) in fp32 (both
    factors from fp32 tables), or (folded) no T1: F2's matrix for tile k_r is
    F_P diag(w_L^(Q k_r p)) and F3's diag(w_L^(k_r q)) F_Q, each rounded to 16 bits as one
    matrix (G2's and G3's their conjugate transposes)."""
    batch, n = u.shape
    L = 2 * n
    z = pack_pairs(u, dtype, pre)
    X = z.reshape(-1, R // 2, P * Q)                                    # x[r, (p, q)], r < R/2
    FRh = rnd(dft(R)[:, : R // 2] / math.sqrt(R), dtype)                # (R, R/2)
    FP = rnd(dft(P) / math.sqrt(P), dtype)
    FQ = rnd(dft(Q) / math.sqrt(Q), dtype)
    kr = np.arange(R)[:, None, None]
    p, q = np.arange(P)[None, :, None], np.arange(Q)[None, None, :]
    fp32 = lambda x: x.astype(np.complex64).astype(np.complex128)
    if folded:
        tw1 = np.ones((R, P, Q))
        M = rnd(dft(P)[None] * root(L, Q * kr * p.reshape(1, 1, P)) / math.sqrt(P), dtype)  # [k_r, k_p, p]
        N = rnd(root(L, kr * q.reshape(1, Q, 1)) * dft(Q)[None] / math.sqrt(Q), dtype)       # [k_r, q, k_q]
    else:
        tw1 = fp32(fp32(root(L, kr * q)) * fp32(root(L, Q * kr * p)))  # [k_r, p, q]
        M = np.broadcast_to(FP, (R, P, P))
        N = np.broadcast_to(FQ, (R, Q, Q))
    tw2 = root(P * Q, p * q)[0]                                         # [k_p, q]
    K = spectrum[..., kr + R * p + R * P * q]                           # [k_r, k_p, k_q]
    Y = rnd((FRh @ X).reshape(-1, R, P, Q) * tw1, dtype)                            # F1, T1
    Z = rnd(np.einsum('rap,nrpq->nraq', M, Y) * tw2, dtype)                         # F2, T2
    W = rnd(np.einsum('nrpq,rqk->nrpk', Z, N) * K, dtype)                           # F3, filter
    V = rnd(np.einsum('nrpk,rqk->nrpq', W, np.conj(N)) * np.conj(tw2), dtype)       # G3, T2*
    U = rnd(np.einsum('rap,nraq->nrpq', np.conj(M), V) * np.conj(tw1), dtype)       # G2, T1*
    y = np.conj(FRh).T @ U.reshape(-1, R, P * Q)                                    # G1, r < R/2
    return unpack_pairs(y.reshape(-1, n), batch, dtype, post)


def two_factor_spectrum(z, R, Q, dtype):
    """Forward transform of packed pairs z (pairs, N): fft(z, L)[k_r + R k_q] / sqrt(L) at
    [k_r, k_q], left in fp32 accumulators (unrounded)."""
    L = 2 * z.shape[-1]
    X = z.reshape(-1, R // 2, Q)
    FRh = rnd(dft(R)[:, : R // 2] / math.sqrt(R), dtype)
    FQ = rnd(dft(Q) / math.sqrt(Q), dtype)
    tw = root(L, np.arange(R)[:, None] * np.arange(Q)[None, :])
    return rnd((FRh @ X) * tw, dtype) @ FQ


def two_factor_inverse(W, R, Q, dtype):
    """The inverse of a spectrum W [k_r, k_q] (16-bit), rows r < R/2: (N,) complex, / sqrt(L)."""
    L = R * Q
    FRh = rnd(dft(R)[:, : R // 2] / math.sqrt(R), dtype)
    FQ = rnd(dft(Q) / math.sqrt(Q), dtype)
    tw = root(L, np.arange(R)[:, None] * np.arange(Q)[None, :])
    U = rnd((W @ np.conj(FQ)) * np.conj(tw), dtype)
    return (np.conj(FRh).T @ U).reshape(L // 2)


def three_factor_spectrum(z, R, dtype, P=16, Q=16):
    L = 2 * z.shape[-1]
    X = z.reshape(-1, R // 2, P * Q)
    FRh = rnd(dft(R)[:, : R // 2] / math.sqrt(R), dtype)
    FP, FQ = rnd(dft(P) / math.sqrt(P), dtype), rnd(dft(Q) / math.sqrt(Q), dtype)
    kr, p, q = np.arange(R)[:, None, None], np.arange(P)[None, :, None], np.arange(Q)[None, None, :]
    fp32 = lambda x: x.astype(np.complex64).astype(np.complex128)
    tw1 = fp32(fp32(root(L, kr * q)) * fp32(root(L, Q * kr * p)))
    tw2 = root(P * Q, p * q)[0]
    Y = rnd((FRh @ X).reshape(-1, R, P, Q) * tw1, dtype)
    Z = rnd(np.einsum('ap,nrpq->nraq', FP, Y) * tw2, dtype)
    return Z @ FQ                                                       # [k_r, k_p, k_q]


def three_factor_inverse(W, R, dtype, P=16, Q=16, row_scale=None):
    """row_scale (R,): the power of two each k_r row of W was scaled by (divided out after the
    16-bit steps, before G1 sums the rows, as each part's block does)."""
    L = R * P * Q
    FRh = rnd(dft(R)[:, : R // 2] / math.sqrt(R), dtype)
    FP, FQ = rnd(dft(P) / math.sqrt(P), dtype), rnd(dft(Q) / math.sqrt(Q), dtype)
    kr, p, q = np.arange(R)[:, None, None], np.arange(P)[None, :, None], np.arange(Q)[None, None, :]
    fp32 = lambda x: x.astype(np.complex64).astype(np.complex128)
    tw1 = fp32(fp32(root(L, kr * q)) * fp32(root(L, Q * kr * p)))
    tw2 = root(P * Q, p * q)[0]
    V = rnd((W @ np.conj(FQ)) * np.conj(tw2), dtype)
    U = rnd(np.einsum('pa,raq->rpq', np.conj(FP), V) * np.conj(tw1), dtype)
    if row_scale is not None:
        U = U / row_scale[:, None, None]
    return (np.conj(FRh).T @ U.reshape(R, P * Q)).reshape(L // 2)


def filter_grad_model(u, dy, dtype):
    """grad[t] = sum_b sum_n dy[b, n] u[b, n - t] (u, dy (B, N), N a kernel length) as the
    filter-gradient kernels compute it: both packed sequences transformed, S = sum over pairs of
    fft(dy) conj(fft(u)) in fp32, scaled by a power of two to [32, 64) at its largest, rounded to
    16 bits, one inverse, the real part rescaled."""
    n = u.shape[-1]
    R, P, Q = CONFIGS[n]
    zu, zd = pack_pairs(u, dtype, None), pack_pairs(dy, dtype, None)
    if P == 1:
        S = (two_factor_spectrum(zd, R, Q, dtype) * np.conj(two_factor_spectrum(zu, R, Q, dtype))).sum(0)
    else:
        S = (three_factor_spectrum(zd, R, dtype, P, Q) * np.conj(three_factor_spectrum(zu, R, dtype, P, Q))).sum(0)
    def power_of_two(part):
        _, e = math.frexp(max(np.abs(part.real).max(), np.abs(part.imag).max()))
        return 2.0 ** (6 - e)

    parts = FILTER_GRAD_PARTS.get(n, 1)
    if parts > 1:  # S is [k_r, k_p, k_q]: rows k_r split into contiguous parts
        row_scale = np.repeat([power_of_two(part) for part in np.split(S, parts)], R // parts)
        W = rnd(S * row_scale[:, None, None], dtype)
        return three_factor_inverse(W, R, dtype, P, Q, row_scale).real * math.sqrt(2 * n)
    scale = power_of_two(S)
    W = rnd(S * scale, dtype)
    y = two_factor_inverse(W, R, Q, dtype) if P == 1 else three_factor_inverse(W, R, dtype, P, Q)
    return y.real * math.sqrt(2 * n) / scale


def filter_grad_reference(u, dy):
    n = u.shape[-1]
    products = torch.fft.rfft(torch.as_tensor(dy), n=2 * n) * torch.fft.rfft(torch.as_tensor(u), n=2 * n).conj()
    return torch.fft.irfft(products.sum(0), n=2 * n)[:n].numpy()


def model(u, spectrum, dtype, pre=None, post=None):
    """y for u (B, N) with N a kernel length; spectrum = fft(k, 2N) in natural order."""
    R, P, Q = CONFIGS[u.shape[-1]]
    if P == 1:
        return two_factor(u, spectrum, R, Q, dtype, pre, post)
    return three_factor(u, spectrum, R, dtype, pre, post, P, Q, folded=u.shape[-1] in FOLDED)


def relative_l2(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


# ---- the filter's spectrum (filter_rfft.cu), in float32 as the kernel computes it ------------


def unit32(num, den):
    """w_den^num from an exact angle, rounded to complex64 (sincospif's result)."""
    return root(den, num).astype(np.complex64)


def dft_radix2(v):
    """The kernel's in-register DFT of the rows of v (R rows, R a power of two): even and odd
    halves transformed, then combined with w_R^j (complex64 throughout)."""
    R = v.shape[0]
    if R == 1:
        return v
    even, odd = dft_radix2(v[0::2]), dft_radix2(v[1::2])
    twiddled = np.stack([odd[j] * unit32(j, R) if j else odd[j] for j in range(R // 2)])
    return np.concatenate([even + twiddled, even - twiddled])


def filter_rfft_model(k, fft_size):
    """rfft(k, fft_size) the way tk::fftconv_filter_rfft computes it, in float32: z[n] = x[2n] +
    i x[2n + 1] (M = fft_size / 2 points, the upper half zero), a first radix-16 pass on the 8
    loaded values, Stockham passes of radix 16 (then the remainder) with w^(2^i) from exact angles
    and the other powers as their products, then X[f] = E[f] + w_L^f O[f] with w_L^f = w_L^t
    w_32^i for f = t + i M / 16."""
    M = fft_size // 2
    x = np.zeros(fft_size, dtype=np.float32)
    x[: len(k)] = k
    z = (x[0::2] + 1j * x[1::2]).astype(np.complex64)
    j = np.arange(M // 16)
    loaded = np.stack([z[j + r * (M // 16)] for r in range(8)])
    even = dft_radix2(loaded)
    odd = dft_radix2(np.stack([loaded[r] * unit32(r, 16) if r else loaded[r] for r in range(8)]))
    data = np.empty(M, dtype=np.complex64)
    for m in range(8):
        data[j * 16 + 2 * m], data[j * 16 + 2 * m + 1] = even[m], odd[m]
    ns = 16
    while ns < M:
        R = min(16, M // ns)
        j = np.arange(M // R)
        k_ = j % ns
        v = np.stack([data[j + r * (M // R)] for r in range(R)])
        powers = [unit32(k_ << i, ns * R) for i in range(R.bit_length() - 1)]
        for r in range(1, R):
            w = None
            for i, power in enumerate(powers):
                if r & (1 << i):
                    w = power if w is None else w * power
            v[r] = v[r] * w
        v = dft_radix2(v)
        out = np.empty_like(data)
        for r in range(R):
            out[(j // ns) * ns * R + k_ + r * ns] = v[r]
        data, ns = out, ns * R
    f = np.arange(M + 1)
    t, i = f % (M // 16), f // (M // 16)
    w = unit32(t, fft_size) * unit32(i, 32)  # exact for i = 0 (a product with 1)
    w[M] = -1
    a, zc = data[f % M], np.conj(data[(M - f) % M])
    e = (a + zc) * np.float32(0.5)
    o = (a - zc) * np.float32(0.5) * np.complex64(-1j)
    return e + w * o


def main():
    rng = np.random.default_rng(0)
    print("exact arithmetic (index math): relative L2 error against torch.fft")
    for n in CONFIGS:
        u, k = rng.standard_normal((3, n)), rng.standard_normal(n)
        print(f"  N={n:5d}: {relative_l2(model(u, np.fft.fft(k, 2 * n), None), reference(u, k)):.1e}")
    print("16-bit: relative L2 error and max error / max|y| in eps (2^-8 bf16, 2^-11 fp16);"
          " gates multiplied exactly in the reference")
    for n in CONFIGS:
        for name, dtype, eps in (("bf16", torch.bfloat16, 2.0**-8), ("fp16", torch.float16, 2.0**-11)):
            u = rnd(rng.standard_normal((6, n)), dtype)
            k = rng.standard_normal(n) * np.exp(-np.arange(n) / (n / 8))
            pre, post = rnd(rng.standard_normal((6, n)), dtype), rnd(rng.standard_normal((6, n)), dtype)
            spectrum = np.fft.fft(k, 2 * n)
            for gated in (False, True):
                g = (pre, post) if gated else (None, None)
                ref = reference(u, k, *g)
                y = model(u, spectrum, dtype, *g)
                floor = relative_l2(rnd(ref, dtype), ref)
                print(f"  N={n:5d} {name} gates={int(gated)}: {relative_l2(y, ref) / eps:.2f} eps, max "
                      f"{np.abs(y - ref).max() / np.abs(ref).max() / eps:.2f} eps (rounding y alone: "
                      f"{floor / eps:.2f} eps)")

    print("filter spectrum (filter_rfft.cu, float32): relative L2 error and max error / max|X|"
          " against the float64 rfft")
    for n in CONFIGS:
        for length in (n, n - 5, 3):
            k = rng.standard_normal(length).astype(np.float32)
            X, ref = filter_rfft_model(k, 2 * n), np.fft.rfft(k.astype(np.float64), 2 * n)
            print(f"  N={n:5d} length {length:5d}: {relative_l2(X, ref):.1e}, max "
                  f"{np.abs(X - ref).max() / np.abs(ref).max():.1e}")

    print("filter gradient: relative L2 error and max error / max|grad| in eps")
    for n in CONFIGS:
        u, dy = rng.standard_normal((5, n)), rng.standard_normal((5, n))
        print(f"  N={n:5d} exact: {relative_l2(filter_grad_model(u, dy, None), filter_grad_reference(u, dy)):.1e}")
        for name, dtype, eps in (("bf16", torch.bfloat16, 2.0**-8), ("fp16", torch.float16, 2.0**-11)):
            for batch, dy_scale in ((6, 1.0), (16, 1.0), (5, 1e-3)):
                u = rnd(rng.standard_normal((batch, n)), dtype)
                dy = rnd(rng.standard_normal((batch, n)) * dy_scale, dtype)
                ref = filter_grad_reference(u, dy)
                g = filter_grad_model(u, dy, dtype)
                print(f"  N={n:5d} {name} B={batch} |dy|~{dy_scale:g}: {relative_l2(g, ref) / eps:.2f} eps, "
                      f"max {np.abs(g - ref).max() / np.abs(ref).max() / eps:.2f} eps")


if __name__ == "__main__":
    main()
