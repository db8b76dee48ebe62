"""Every primitive's CUDA lowering, registry-driven: hypothesis draws shapes (odd sizes,
broadcasting, 0-d) and dtypes; each generated kernel is compiled to an sm_90 cubin
with NVRTC and run on the CPU through the host shim; results must equal eager
NumPy evaluation (exactly for integers and bools, within one low-precision ulp
for floats)."""

import itertools

import numpy as np
import pytest
from cuda_harness import BF16, FLOATS, bind, collect, run_cases, shapes
from fflow.lowering import cuda_attention, cuda_backend, cuda_kernels
from hypothesis import strategies as st
from op_db import OPS

import fflow
from fflow import lax
from fflow.core import ShapedArray, primitives

# unary float primitives: (name, input range) — ranges keep results finite mostly;
# NaN results are compared as NaN
UNARY = {
    "sin": (-3, 3), "cos": (-3, 3), "tan": (-1.2, 1.2), "asin": (-1, 1), "acos": (-1, 1),
    "atan": (-3, 3), "sinh": (-3, 3), "cosh": (-3, 3), "tanh": (-3, 3), "asinh": (-3, 3),
    "acosh": (1, 4), "atanh": (-0.9, 0.9), "exp": (-3, 3), "exp2": (-3, 3), "expm1": (-3, 3),
    "log": (0.1, 4), "log1p": (-0.5, 3), "sqrt": (0, 4), "rsqrt": (0.1, 4), "cbrt": (-3, 3),
    "logistic": (-5, 5), "erf": (-2, 2), "erf_inv": (-0.9, 0.9), "abs": (-3, 3),
    "sign": (-3, 3), "floor": (-3, 3), "ceil": (-3, 3), "round": (-3, 3),
    "round_even": (-3, 3), "is_finite": (-3, 3), "neg": (-3, 3), "square": (-3, 3),
    "stop_gradient": (-3, 3), "copy": (-3, 3),
}  # fmt: skip
BINARY = ["add", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "nextafter"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]
INT_BINARY = ["add", "sub", "mul", "div", "rem", "max", "min", "and", "or", "xor", "pow"]
INT_UNARY = ["neg", "abs", "sign", "not", "square", "copy", "population_count"]
INTS = [np.dtype(t) for t in (np.int32, np.int64, np.int8, np.uint8, np.uint32, np.int16)]


def _broadcasting(data, shape):
    """A shape that broadcasts to `shape` (some dims 1, maybe fewer dims)."""
    drop = data.draw(st.integers(0, len(shape)))
    small = tuple(1 if data.draw(st.booleans()) else d for d in shape[drop:])
    return small


def _bcast(x, shape):
    n = len(shape) - x.ndim
    return lax.broadcast_in_dim(x, shape, tuple(range(n, len(shape))))


def test_unary_float():
    def make(data):
        name = data.draw(st.sampled_from(sorted(UNARY)))
        dtype = data.draw(st.sampled_from(FLOATS))
        shape = data.draw(shapes())
        lo, hi = UNARY[name]
        rng = np.random.default_rng(data.draw(st.integers(0, 99)))
        x = (rng.uniform(lo, hi, shape)).astype(dtype)
        return f"{name} {dtype.name}{list(shape)}", lambda a: bind(name, a), [x]

    cases = collect(make, 110)
    # integer_pow, with negative powers too
    rng = np.random.default_rng(1)
    for y in (0, 1, 2, 3, 5, -1, -2):
        x = rng.uniform(0.5, 2, (3, 5)).astype(np.float32)
        cases.append((f"integer_pow {y}", lambda a, y=y: bind("integer_pow", a, y=y), [x]))
    run_cases(cases)


def test_binary_float_broadcasting():
    def make(data):
        name = data.draw(st.sampled_from(BINARY + COMPARE + ["select_n"]))
        dtype = data.draw(st.sampled_from(FLOATS))
        shape = data.draw(shapes())
        small = _broadcasting(data, shape)
        rng = np.random.default_rng(data.draw(st.integers(0, 99)))
        lo = 0.1 if name == "pow" else -3
        x = rng.uniform(lo, 3, shape).astype(dtype)
        y = rng.uniform(-3, 3, small).astype(dtype)
        if name == "select_n":
            return (
                f"select_n {dtype.name}{list(shape)}<-{list(small)}",
                lambda a, b: lax.select_n(lax.gt(a, _bcast(b, shape)), a, _bcast(b, shape)),
                [x, y],
            )
        return (
            f"{name} {dtype.name}{list(shape)}<-{list(small)}",
            lambda a, b: bind(name, a, _bcast(b, shape)),
            [x, y],
        )

    run_cases(collect(make, 90))


def test_integer_and_bool_ops():
    def make(data):
        dtype = data.draw(st.sampled_from(INTS + [np.dtype(bool)]))
        shape = data.draw(shapes())
        rng = np.random.default_rng(data.draw(st.integers(0, 99)))
        if dtype == np.bool_:
            name = data.draw(st.sampled_from(["and", "or", "xor", "not", "eq", "ne"]))
        else:
            name = data.draw(st.sampled_from(INT_BINARY + INT_UNARY + COMPARE + ["shift_left"]))
        lo = 0 if dtype.kind == "u" or name == "pow" else -20
        x = (
            rng.integers(lo, 20, shape).astype(dtype)
            if dtype != np.bool_
            else rng.random(shape) < 0.5
        )
        y = (
            rng.integers(lo, 20, shape).astype(dtype)
            if dtype != np.bool_
            else rng.random(shape) < 0.5
        )
        if name == "pow":
            y = rng.integers(0, 4, shape).astype(dtype)
        if name == "shift_left":
            y = rng.integers(0, 8 * dtype.itemsize + 2, shape).astype(dtype)
        if name in INT_UNARY or name == "not":
            return f"{name} {dtype.name}{list(shape)}", lambda a: bind(name, a), [x]
        return f"{name} {dtype.name}{list(shape)}", lambda a, b: bind(name, a, b), [x, y]

    cases = collect(make, 90)
    rng = np.random.default_rng(2)
    u = rng.integers(0, 2**32, (4, 6), dtype=np.uint64).astype(np.uint32)
    s = rng.integers(0, 34, (4, 6)).astype(np.uint32)
    cases.append(("shift_right_logical", lambda a, b: bind("shift_right_logical", a, b), [u, s]))
    for dt in (np.int32, np.int8, np.uint16):
        a = rng.integers(-100 if dt != np.uint16 else 0, 100, (3, 5)).astype(dt)
        b = rng.integers(-2, 8 * np.dtype(dt).itemsize + 3, (3, 5)).astype(dt)
        cases.append(
            (f"shift_right_arithmetic {np.dtype(dt).name}",
             lambda a, b: bind("shift_right_arithmetic", a, b), [a, b])
        )  # fmt: skip
    z = np.array([0, 3, -4, 7], np.int32)
    cases.append(("div by zero", lambda a, b: lax.div(a, b), [z, np.zeros(4, np.int32)]))
    cases.append(("rem by zero", lambda a, b: lax.rem(a, b), [z, np.zeros(4, np.int32)]))
    run_cases(cases)


def test_convert_element_type():
    kinds = FLOATS + INTS + [np.dtype(bool)]

    def make(data):
        src = data.draw(st.sampled_from(kinds))
        dst = data.draw(st.sampled_from(kinds))
        shape = data.draw(shapes())
        rng = np.random.default_rng(data.draw(st.integers(0, 99)))
        if src == np.bool_:
            x = rng.random(shape) < 0.5
        elif src.kind in "iu":
            x = rng.integers(0, 100, shape).astype(src)
        else:
            x = rng.uniform(-100, 100, shape).astype(src)
            if dst.kind == "u" or dst.itemsize == 1:
                x = np.abs(x).astype(src)
        return (
            f"convert {src.name}->{dst.name}{list(shape)}",
            lambda a: lax.convert_element_type(a, dst),
            [x],
        )

    run_cases(collect(make, 70))


def test_bitcast_convert_type():
    """Stored bits reread: floats (with inf, -0, subnormals) <-> same-width ints, fused
    into a consumer too; compared exactly with NumPy's .view."""
    pairs = [(np.float32, np.int32), (np.float32, np.uint32), (np.float64, np.int64),
             (np.float64, np.uint64), (np.float16, np.int16), (np.float16, np.uint16),
             (np.int8, np.uint8)] + ([(BF16, np.int16)] if BF16 is not None else [])  # fmt: skip
    rng = np.random.default_rng(3)
    cases = []
    for a, b in pairs:
        a, b = np.dtype(a), np.dtype(b)
        if a.kind not in "iu":  # a float (bfloat16's kind is "V")
            x = rng.uniform(-3, 3, (3, 5)).astype(a)
            x.flat[:3] = [np.inf, -0.0, -np.inf]
            x.flat[3] = np.ones((), b).view(a)  # the smallest subnormal
        else:
            x = rng.integers(np.iinfo(a).min, np.iinfo(a).max, (3, 5), endpoint=True).astype(a)
        y = x.view(b)  # the other direction: the bits of every drawn value (no NaNs)
        cases.append(
            (f"bitcast {a.name}->{b.name}", lambda v, b=b: lax.bitcast_convert_type(v, b), [x])
        )
        cases.append((f"bitcast {b.name}->{a.name} fused",
                      lambda v, a=a: lax.bitcast_convert_type(v, a) * a.type(1), [y]))  # fmt: skip
    run_cases(cases, exact_kinds="biuf")


def test_shape_and_index_ops():
    """Each op both materialized on its own and fused (index arithmetic) into a consumer."""
    cases = []

    def make(data):
        shape = data.draw(shapes(1, 3, 6))
        dtype = data.draw(st.sampled_from([np.dtype(np.float32), np.dtype(np.float16)]))
        rng = np.random.default_rng(data.draw(st.integers(0, 99)))
        x = rng.uniform(-2, 2, shape).astype(dtype)
        nd = len(shape)
        op = data.draw(
            st.sampled_from(
                [
                    "broadcast_in_dim",
                    "reshape",
                    "transpose",
                    "squeeze",
                    "slice",
                    "pad",
                    "concatenate",
                    "rev",
                    "iota",
                    "dynamic_slice",
                    "dynamic_update_slice",
                    "gather",
                ]  # fmt: skip
            )
        )
        fused = data.draw(st.booleans())
        if op == "broadcast_in_dim":
            f = lambda a: lax.broadcast_in_dim(a, (3,) + shape, tuple(range(1, nd + 1)))
        elif op == "reshape":
            f = lambda a: lax.reshape(a, (int(np.prod(shape)),) if nd > 1 else (1,) + shape)
        elif op == "transpose":
            perm = tuple(data.draw(st.permutations(range(nd))))
            f = lambda a: lax.transpose(a, perm)
        elif op == "squeeze":
            f = lambda a: lax.squeeze(lax.reshape(a, shape + (1,)), (nd,))
        elif op == "slice":
            starts = tuple(data.draw(st.integers(0, d - 1)) for d in shape)
            strides = tuple(data.draw(st.integers(1, 3)) for _ in shape)
            f = lambda a: lax.slice(a, starts, shape, strides)
        elif op == "pad":
            cfg = tuple(
                (data.draw(st.integers(-1, 2)), data.draw(st.integers(-1, 2)), data.draw(st.integers(0, 2)))
                for _ in shape
            )  # fmt: skip
            if any(d + lo + hi + max(d - 1, 0) * it < 0 for d, (lo, hi, it) in zip(shape, cfg)):
                return None
            f = lambda a: lax.pad(a, np.asarray(0.5, dtype), cfg)
        elif op == "concatenate":
            ax = data.draw(st.integers(0, nd - 1))
            f = lambda a: lax.concatenate([a, lax.neg(a), a], ax)
        elif op == "rev":
            dims = tuple(sorted(set(data.draw(st.lists(st.integers(0, nd - 1), max_size=nd)))))
            f = lambda a: lax.rev(a, dims)
        elif op == "iota":
            dim = data.draw(st.integers(0, nd - 1))
            f = lambda a: lax.add(a, lax.broadcasted_iota(dtype, shape, dim))
        elif op == "dynamic_slice":
            sizes = tuple(data.draw(st.integers(0, d)) for d in shape)
            starts = [np.int32(data.draw(st.integers(-2, d + 2))) for d in shape]
            f = lambda a, *s: lax.dynamic_slice(a, s, sizes)
            return (f"{op} {list(shape)} {sizes}", _maybe_fused(f, fused), [x, *starts])
        elif op == "dynamic_update_slice":
            usize = tuple(data.draw(st.integers(0, d)) for d in shape)
            upd = rng.uniform(5, 6, usize).astype(dtype)
            starts = [np.int32(data.draw(st.integers(-2, d + 2))) for d in shape]
            f = lambda a, u, *s: lax.dynamic_update_slice(a, u, s)
            return (f"{op} {list(shape)} {usize}", _maybe_fused(f, fused), [x, upd, *starts])
        else:  # gather
            naxes = data.draw(st.integers(1, nd))
            axes = tuple(sorted(data.draw(st.permutations(range(nd)))[:naxes]))
            batch = data.draw(shapes(0, 2, 4))
            idx = np.stack([rng.integers(-1, shape[a] + 1, batch) for a in axes], axis=-1).astype(
                np.int32
            )
            f = lambda a, i: lax.gather(a, i, axes)
            return (
                f"gather {list(shape)} axes={axes} batch={batch}",
                _maybe_fused(f, fused),
                [x, idx],
            )
        return f"{op} {list(shape)} fused={fused}", _maybe_fused(f, fused), [x]

    cases = collect(make, 90)
    run_cases(cases)


def test_take_along_axis_and_its_scatter():
    """Every axis of a 3-D operand, alone and fused into a consumer, out-of-range indices
    clamped; the scatter (take_along_axis's transpose) with repeated indices."""
    rng = np.random.default_rng(0)
    cases = []
    for dtype, ax, fused in itertools.product((np.float32, np.float16), range(3), (False, True)):
        shape = (3, 4, 5)
        x = rng.uniform(-2, 2, shape).astype(dtype)
        ishape = shape[:ax] + (6,) + shape[ax + 1 :]
        idx = rng.integers(-1, shape[ax] + 1, ishape).astype(np.int32)
        f = lambda a, i, ax=ax: lax.take_along_axis(a, i, ax)  # noqa: E731
        cases.append((f"take_along_axis {ax} {dtype.__name__}", _maybe_fused(f, fused), [x, idx]))
        u = rng.uniform(-2, 2, ishape).astype(dtype)
        g = lambda a, i, u, ax=ax: lax.scatter_add_along_axis(a, i, u, ax)  # noqa: E731
        cases.append((f"scatter_add_along_axis {ax} {dtype.__name__}", g, [x, idx, u]))
    run_cases(cases)


def _maybe_fused(f, fused):
    if not fused:
        return f

    # a consumer renders the op by index arithmetic (no buffer in between)
    def g(*a):
        y = f(*a)
        return lax.mul(y, lax.full(y.shape, 2, y.dtype))

    return g


REDUCTIONS = ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_or",
              "reduce_and", "argmax", "argmin"]  # fmt: skip


def test_reductions():
    def make(data):
        name = data.draw(st.sampled_from(REDUCTIONS))
        shape = data.draw(shapes(1, 4, 9))
        nd = len(shape)
        if name in ("reduce_or", "reduce_and"):
            dtype = np.dtype(bool)
        else:
            dtype = data.draw(st.sampled_from(FLOATS + [np.dtype(np.int32), np.dtype(np.int8)]))
        rng = np.random.default_rng(data.draw(st.integers(0, 99)))
        if dtype == np.bool_:
            x = rng.random(shape) < data.draw(st.sampled_from([0.05, 0.5, 0.95]))
        elif dtype.kind == "i":
            x = rng.integers(-3, 4, shape).astype(dtype)
        else:
            lo = 0.5 if name == "reduce_prod" else -2
            x = rng.uniform(lo, 1.5 if name == "reduce_prod" else 2, shape).astype(dtype)
            if name in ("argmax", "argmin") and data.draw(st.booleans()):
                x = np.round(x).astype(dtype)  # ties: the first index wins
        if name in ("argmax", "argmin"):
            axis = data.draw(st.integers(0, nd - 1))
            return (
                f"{name} {dtype.name}{list(shape)} axis={axis}",
                lambda a: bind(name, a, axes=(axis,), index_dtype=np.dtype(np.int32)),
                [x],
            )
        axes = tuple(
            sorted(set(data.draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd))))
        )
        fuse = data.draw(st.booleans()) and dtype.kind == "f"
        if fuse:  # a producer fused into the reduction's loads
            return (
                f"{name}(x*x) {dtype.name}{list(shape)} axes={axes}",
                lambda a: bind(name, lax.mul(a, a), axes=axes),
                [x],
            )
        return (
            f"{name} {dtype.name}{list(shape)} axes={axes}",
            lambda a: bind(name, a, axes=axes),
            [x],
        )

    cases = collect(make, 80)
    rng = np.random.default_rng(3)
    big = rng.uniform(-1, 1, (3, 5000)).astype(np.float32)
    cases.append(("row sum, block mode", lambda a: lax.reduce_sum(a, (1,)), [big]))
    cases.append(("argmax, block mode", lambda a: lax.argmax(a, 1), [big]))
    cases.append(("full sum, two passes", lambda a: lax.reduce_sum(a, (0, 1)), [big]))
    cases.append(("full max, two passes", lambda a: lax.reduce_max(a, (0, 1)), [big]))
    tall = rng.uniform(-1, 1, (3000, 5)).astype(np.float32)
    cases.append(("column sum split in slices", lambda a: lax.reduce_sum(a, (0,)), [tall]))
    cases.append(
        ("column max split (f16)", lambda a: lax.reduce_max(a, (0,)), [tall.astype(np.float16)])
    )
    cases.append(
        ("bias-grad-like sum over (0, 1)", lambda a: lax.reduce_sum(a.reshape(30, 100, 5), (0, 1)), [tall])
    )  # fmt: skip
    half = big.astype(np.float16)
    cases.append(("f16 full sum (f32 accumulation)", lambda a: lax.reduce_sum(a, (0, 1)), [half]))
    run_cases(cases)


def test_cumulative():
    def make(data):
        name = data.draw(st.sampled_from(["cumsum", "cumprod", "cummax", "cummin"]))
        shape = data.draw(shapes(1, 3, 9))
        axis = data.draw(st.integers(0, len(shape) - 1))
        reverse = data.draw(st.booleans())
        dtype = data.draw(st.sampled_from([np.dtype(np.float32), np.dtype(np.int32)]))
        rng = np.random.default_rng(data.draw(st.integers(0, 99)))
        if dtype.kind == "i":
            x = rng.integers(-3, 4, shape).astype(dtype)
        else:
            x = rng.uniform(0.5, 1.5, shape).astype(dtype)
        return (
            f"{name} {dtype.name}{list(shape)} axis={axis} reverse={reverse}",
            lambda a: bind(name, a, axis=axis, reverse=reverse),
            [x],
        )

    cases = collect(make, 30)
    long = np.random.default_rng(4).uniform(-1, 1, (2, 3000)).astype(np.float32)
    cases.append(("cumsum over several chunks", lambda a: lax.cumsum(a, 1), [long]))
    cases.append(("cummax reverse, chunks", lambda a: lax.cummax(a, 1, reverse=True), [long]))
    run_cases(cases)


def test_scatters():
    def make(data):
        # (scatter_add_along_axis takes other indices: test_take_along_axis_and_its_scatter)
        names = sorted(p.name for p in cuda_kernels.SCATTERS if p.name != "scatter_add_along_axis")
        name = data.draw(st.sampled_from(names))
        shape = data.draw(shapes(1, 3, 6))
        nd = len(shape)
        dtype = data.draw(
            st.sampled_from([np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.float16),
                             np.dtype(np.float64), np.dtype(np.int64)] + ([BF16] if BF16 else []))
        )  # fmt: skip
        rng = np.random.default_rng(data.draw(st.integers(0, 99)))
        naxes = data.draw(st.integers(1, nd))
        axes = tuple(range(naxes)) if data.draw(st.booleans()) else tuple(range(nd - naxes, nd))
        batch = data.draw(shapes(1, 2, 5))
        unique = name in ("scatter", "scatter_mul")
        if unique:  # duplicates make these order dependent (also on a GPU)
            space = int(np.prod([shape[a] for a in axes]))
            n = int(np.prod(batch))
            if n > space:
                return None
            flat = rng.permutation(space)[:n]
            idx = np.stack(np.unravel_index(flat, [shape[a] for a in axes]), -1)
            idx = idx.reshape(batch + (naxes,)).astype(np.int32)
        else:
            idx = np.stack([rng.integers(-1, shape[a] + 1, batch) for a in axes], -1).astype(
                np.int32
            )
        ushape = batch + tuple(d for i, d in enumerate(shape) if i not in axes)
        if dtype.kind == "i":
            x = rng.integers(-5, 5, shape).astype(dtype)
            u = rng.integers(-5, 5, ushape).astype(dtype)
        else:
            x = rng.uniform(0.5, 2, shape).astype(dtype)
            u = rng.uniform(0.5, 2, ushape).astype(dtype)
        return (
            f"{name} {dtype.name}{list(shape)} axes={axes} idx{list(idx.shape)}",
            lambda a, i, b: bind(name, a, i, b, axes=axes),
            [x, idx, u],
        )

    run_cases(collect(make, 40))


def test_random_bits_match_numpy_backend():
    cases = []
    for shape in [(), (5,), (3, 7), (2, 3, 4)]:
        key = np.array([7, 42], np.uint32)
        cases.append(
            (f"random_bits {shape}", lambda k, s=shape: bind("random_bits", k, shape=s), [key])
        )
    keys = np.array([[1, 2], [3, 4], [0xFFFFFFFF, 5]], np.uint32)
    cases.append(("random_bits batched keys", lambda k: bind("random_bits", k, shape=(6,)), [keys]))
    data = np.array([0, 1, 123456], np.uint32)
    cases.append(("random_fold_in", lambda k, d: bind("random_fold_in", k, d), [keys, data]))
    cases.append(
        (
            "random.normal (bits + erf_inv fused)",
            lambda k: fflow.random.normal(k, (4, 9)),
            [np.array([0, 3], np.uint32)],
        )
    )
    run_cases(cases)


def test_dot_general_and_host_fallback():
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (2, 3, 4)).astype(np.float32)
    b = rng.uniform(-1, 1, (2, 4, 5)).astype(np.float32)
    cases = [
        (
            "batched matmul",
            lambda x, y: lax.dot_general(x, y, (((2,), (1,)), ((0,), (0,)))),
            [a, b],
        ),
        (
            "matmul + bias + relu epilogue",
            lambda x, y: lax.max(
                lax.add(lax.dot_general(x[0], y[0], (((1,), (0,)), ((), ()))), 1.0), 0.0
            ),
            [a, b],
        ),  # fmt: skip
        ("sort (a kernel)", lambda x: lax.sort(x, 1), [a]),
        (
            "sort of a long line (device sort)",
            lambda x: lax.sort(x, 0),
            [np.arange(3000.0)[::-1]],
        ),
        ("fft (host fallback)", lambda x: fflow.numpy.fft.fft(x).real * 2, [a[0, 0]]),
    ]
    from fflow.transforms.shard import sbp_constraint_p

    from fflow.sharding import B

    cases.append(
        ("with_sbp annotation (identity)", lambda x: sbp_constraint_p.bind(x * 2, sbp=(B,)), [a])
    )
    built = run_cases(cases)
    assert "fflow_sort_" in built[2][1].source
    assert "fflow_sortpass_" in built[3][1].source
    assert "host fft" in built[4][1].source
    assert "cublas gemm" in built[0][1].source


def test_sort_stable_multi_key_nan_last():
    def make(data):
        shape = data.draw(shapes(1, 3, 9))
        dim = data.draw(st.integers(0, len(shape) - 1))
        dtype = data.draw(
            st.sampled_from([np.dtype(np.float32), np.dtype(np.int32)] + ([BF16] if BF16 else []))
        )
        rng = np.random.default_rng(data.draw(st.integers(0, 99)))
        keys = rng.integers(-3, 3, shape).astype(dtype)  # many ties: stability matters
        if dtype.kind == "f" and data.draw(st.booleans()):
            keys[rng.random(shape) < 0.2] = np.nan
        second = rng.integers(0, 4, shape).astype(np.int32)
        num_keys = data.draw(st.integers(1, 2))
        iota = lambda: lax.broadcasted_iota(np.int32, shape, dim)  # noqa: E731
        return (
            f"sort {dtype.name}{list(shape)} dim={dim} keys={num_keys}",
            lambda k, s: lax.sort([k, s, iota()], dimension=dim, num_keys=num_keys),
            [keys, second],
        )

    run_cases(collect(make, 25))


def test_linear_algebra_steps():
    rng = np.random.default_rng(6)
    m = rng.standard_normal((2, 4, 4)).astype(np.float32)
    spd = m @ np.swapaxes(m, -1, -2) + 4 * np.eye(4, dtype=np.float32)
    b = rng.standard_normal((2, 4, 3)).astype(np.float32)
    tall = rng.standard_normal((5, 3)).astype(np.float64)
    cases = [
        ("solve", lambda a, b: bind("linalg_solve", a, b), [spd, b]),
        ("cholesky + elementwise", lambda a: lax.mul(bind("cholesky", a), 2.0), [spd]),
        ("eigh", lambda a: bind("eigh", a)[0], [spd]),
        ("slogdet", lambda a: bind("slogdet", a), [spd]),
        ("qr", lambda a: bind("qr", a)[1], [tall]),
        ("svd singular values", lambda a: bind("svd", a)[1], [tall]),
    ]
    built = run_cases(cases)
    assert "cusolver linalg_solve" in built[0][1].source


# primitives with no CUDA kernel on purpose: they run on the host inside a plan
HOST_ON_PURPOSE = {
    "debug_callback": "a host callback by definition",
    "pure_callback": "a host callback by definition",
    "io_callback": "a host callback by definition",
    "fft": "pocketfft on the host for now (cupy.fft would be the GPU path)",
    "lgamma": "scipy.special on the host (no CUDA kernel yet)",
    "digamma": "scipy.special on the host (no CUDA kernel yet)",
    "polygamma": "scipy.special on the host (no CUDA kernel yet)",
    "pipeline_call": "runs a micro-batch schedule on the host; its stages are sharded programs",
    "pipeline_call_lin": "the pipeline's gradient contraction, evaluated on the host",
    "attention_jvp": "forward-mode attention: its NumPy reference on the host (reverse mode "
    "transposes it into attention_bwd, which has a fused kernel)",
}


def _takes_no_params(prim):
    try:
        prim.abstract_eval(ShapedArray((2,), np.float32))
        with np.errstate(all="ignore"):
            prim.impl(np.full(2, 0.5, np.float32))
    except TypeError:  # a missing keyword: convert_element_type, integer_pow...
        return False
    return True


# every one-operand float row of the op database for an elementwise primitive without
# parameters runs in test_unary_float too, on its row's input range: a new primitive's
# row (tests/op_db.py) covers its CUDA kernel
for _op in OPS:
    _prim = primitives[_op.name]
    if (
        "elementwise" in _prim.traits
        and len(_op.args) == 1
        and _op.args[0].kind == "f"
        and _op.name not in HOST_ON_PURPOSE
        and _takes_no_params(_prim)
    ):
        UNARY.setdefault(_op.name, (_op.args[0].lo, _op.args[0].hi))

CONTROL_FLOW_AND_COLLECTIVES = ("cond", "while", "scan", "all_", "reduce_scatter", "psum",
                                "pmax", "pmin", "ppermute", "axis_index", "custom_", "remat",
                                "checkpoint", "shard", "pjit", "call", "collective")  # fmt: skip

SOLVER = {n for n, p in primitives.items() if "solver" in p.traits}  # primitives/linalg.py
TESTED_HERE = (
    set(UNARY) | set(BINARY) | set(COMPARE) | set(INT_BINARY) | set(INT_UNARY)
    | {"integer_pow", "select_n", "shift_left", "shift_right_logical", "not",
       "shift_right_arithmetic",
       "convert_element_type", "bitcast_convert_type", "broadcast_in_dim", "reshape",
       "transpose", "squeeze",
       "slice", "pad", "concatenate", "rev", "iota", "dynamic_slice", "dynamic_update_slice",
       "gather", "take_along_axis", "random_bits", "random_fold_in", "dot_general", "sbp_constraint", "sort"}
    | {p.name for p in cuda_attention.KERNELS}
    | SOLVER
    | set(REDUCTIONS) | {"cumsum", "cumprod", "cummax", "cummin"} | {p.name for p in cuda_kernels.SCATTERS}
)  # fmt: skip


def test_every_primitive_has_a_cuda_lowering():
    lowered = (
        cuda_kernels.ELEMENTWISE
        | {p.name for p in cuda_kernels.INDEX_OPS}
        | {p.name for p in cuda_kernels.REDUCTIONS}
        | {p.name for p in cuda_kernels.CUMULATIVE}
        | {p.name for p in cuda_kernels.SCATTERS}
        | {"dot_general", "sort"}
        | {p.name for p in cuda_attention.KERNELS}  # tested in tests/test_cuda_attention.py
        | SOLVER
    )
    missing = []
    for name in primitives:
        prim = primitives[name]
        if (
            name in HOST_ON_PURPOSE
            or name.startswith(CONTROL_FLOW_AND_COLLECTIVES)
            or "collective" in prim.traits  # NCCL (lowering/cuda_nccl.py), not kernels
            or "named_axis" in prim.traits  # vmap's axis_name collectives
        ):
            continue
        if getattr(prim.impl, "__module__", "") == "fflow.primitives.linalg":
            continue  # every linear algebra primitive is a solver step (tested above)
        if name not in lowered:
            missing.append(name)
        elif name not in TESTED_HERE:
            missing.append(name + " (untested)")
    assert not missing, f"primitives without a tested CUDA lowering: {missing}"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_zero_size_and_scalar_programs(dtype):
    x = np.zeros((0, 3), dtype)
    s = np.asarray(1.5, dtype)
    cases = [
        ("empty elementwise", lambda a: lax.exp(a), [x]),
        ("empty reduce", lambda a: lax.reduce_sum(a, (0,)), [x]),
        ("0-d", lambda a: lax.add(lax.sin(a), a), [s]),
    ]
    run_cases(cases)
    assert cuda_backend.Plan(fflow.make_jaxpr(lambda a: lax.exp(a))(x)).kernels
