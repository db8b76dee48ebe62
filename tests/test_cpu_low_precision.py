"""bf16/fp16 matmuls and attention on the CPU backend (what `fflow.amp` runs): compiled
as float32 GEMMs over float32 copies (no reference fallback), against float64 NumPy on
the same 16-bit inputs."""

import ml_dtypes
import numpy as np
import pytest
from fflow.primitives.attention import attention_bwd_p, attention_p

import fflow
import fflow.numpy as jnp
from fflow import lax

LOW = {"bf16": (np.dtype(ml_dtypes.bfloat16), 2.0**-8), "f16": (np.dtype(np.float16), 2.0**-11)}


@pytest.mark.parametrize("low", sorted(LOW))
@pytest.mark.parametrize("pet", [None, np.float32])
@pytest.mark.parametrize(
    "dims, shape_a, shape_b",
    [
        ((((1,), (0,)), ((), ())), (48, 64), (64, 40)),
        ((((0,), (0,)), ((), ())), (64, 48), (64, 40)),  # lhs transposed (weight grads)
        ((((2,), (2,)), ((0,), (0,))), (4, 24, 32), (4, 16, 32)),  # batched, rhs transposed
        ((((1, 2), (0, 1)), ((), ())), (8, 6, 10), (6, 10, 12)),  # two contracted dims
    ],
)
def test_low_precision_dot_general_is_a_float32_gemm(low, pet, dims, shape_a, shape_b):
    dtype, eps = LOW[low]
    rng = np.random.default_rng(0)
    a = rng.normal(size=shape_a).astype(dtype)
    b = rng.normal(size=shape_b).astype(dtype)
    f = fflow.jit(lambda x, y: lax.dot_general(x, y, dims, preferred_element_type=pet))
    got = np.asarray(f(a, b))
    assert "impl_dot_general" not in f.lower(a, b).source
    assert got.dtype == (np.dtype(pet) if pet else dtype)
    want = np.asarray(lax.dot_general(a.astype(np.float64), b.astype(np.float64), dims))
    # float32 accumulation; a 16-bit output is that sum rounded once (half an ulp)
    tol = 1e-5 if pet else eps
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=1e-4)


def _attention64(q, k, v, causal):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    if causal:
        t = logits.shape[-1]
        logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


@pytest.mark.parametrize("low", sorted(LOW))
@pytest.mark.parametrize("causal", [False, True])
def test_low_precision_attention_and_gradient_are_float32_kernels(low, causal, monkeypatch):
    dtype, eps = LOW[low]
    rng = np.random.default_rng(1)
    q, k, v, w = (rng.normal(size=(2, 16, 2, 8)).astype(dtype) for _ in range(4))
    w64 = w.astype(np.float64)

    def attend(q, k, v):
        return fflow.nn.dot_product_attention(q, k, v, is_causal=causal)

    def loss(q, k, v):
        return jnp.sum(w.astype(np.float32) * attend(q, k, v).astype(np.float32))

    grad = fflow.jit(fflow.grad(loss, argnums=(0, 1, 2)))
    source = grad.lower(q, k, v).source
    assert "attn" in source and "impl_attention" not in source

    def reference_called(*args, **kwargs):
        raise AssertionError("16-bit attention fell back to the einsum reference")

    for prim in (attention_p, attention_bwd_p):  # the kernels must not call them
        monkeypatch.setattr(prim, "impl", reference_called)
    out = np.asarray(fflow.jit(attend)(q, k, v))
    assert out.dtype == dtype
    np.testing.assert_allclose(out.astype(np.float64), _attention64(q, k, v, causal),
                               rtol=2 * eps, atol=2 * eps)  # fmt: skip
    # gradients vs central differences of the float64 attention, along random directions
    for which, g in enumerate(grad(q, k, v)):
        assert g.dtype == dtype
        d = rng.normal(size=q.shape)
        args = [x.astype(np.float64) for x in (q, k, v)]
        plus, minus = list(args), list(args)
        plus[which], minus[which] = args[which] + 1e-6 * d, args[which] - 1e-6 * d
        want = np.sum(w64 * (_attention64(*plus, causal) - _attention64(*minus, causal))) / 2e-6
        got = float(np.sum(np.asarray(g, np.float64) * d))
        # each gradient entry is rounded to 16 bits: the directional sum keeps ~eps error
        scale = float(np.sum(np.abs(np.asarray(g, np.float64) * d)))
        assert abs(got - want) <= 4 * eps * max(1.0, scale), (which, got, want)


def _bit_patterns(n):
    """float32 bit patterns: random, plus NaNs of both signs, infinities, subnormals,
    the largest finite value, exact rounding ties and float16's overflow and subnormal
    edges."""
    rng = np.random.default_rng(5)
    u = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    special = [0x7FC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFC12345, 0x7F800000,
               0xFF800000, 0x7F7FFFFF, 0x00008000, 0x00018000, 0x3F808000, 0x3F818000,
               0x80000001, 0x00000000, 0x80000000, 0x477FEFFF, 0x477FF000, 0x33000000,
               0x33000001, 0x387FC000, 0x7F802000]  # fmt: skip
    k = min(n, len(special))
    u[:k] = special[:k]
    return u


@pytest.mark.parametrize("low", sorted(LOW))
@pytest.mark.parametrize("shape", [(1 << 14,), (3, 4099), (15,)])  # C loops (+ a tail); astype
def test_casts_equal_astype_bit_for_bit(low, shape):
    """float32 <-> bf16/f16 casts (lowering/cpu_casts.py) equal ml_dtypes'/NumPy's astype."""
    from fflow.lowering import cpu_casts, native

    n = int(np.prod(shape))
    x = _bit_patterns(n).view(np.float32).reshape(shape)
    dtype = LOW[low][0]
    with np.errstate(all="ignore"):  # astype warns on NaN and overflow
        want = x.astype(dtype)
        got = cpu_casts.cast(x, dtype)
        back_want = want.astype(np.float32)
        strided = cpu_casts.cast(x[..., ::2], dtype)  # astype's path: the same bits
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    back = cpu_casts.cast(want, np.float32)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back.view(np.uint32), back_want.view(np.uint32))
    np.testing.assert_array_equal(strided.view(np.uint16), want[..., ::2].view(np.uint16))
    if n >= cpu_casts.MIN_SIZE and native.enabled():  # the C loops ran
        assert cpu_casts._kernel(cpu_casts._KERNELS[("float32", dtype.name)]) is not None
        assert cpu_casts._kernel(cpu_casts._KERNELS[(dtype.name, "float32")]) is not None


def test_every_float16_bit_pattern_widens_as_numpy_does():
    from fflow.lowering import cpu_casts

    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    with np.errstate(all="ignore"):
        want = h.astype(np.float32)
    np.testing.assert_array_equal(
        cpu_casts.cast(h, np.float32).view(np.uint32), want.view(np.uint32)
    )
