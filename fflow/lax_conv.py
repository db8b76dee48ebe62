"""JAX's convolution and window-shape helpers in `fflow.lax` (pure shape arithmetic):
`conv_dimension_numbers`, `conv_general_shape_tuple`, `padtype_to_pads`,
`reduce_window_shape_tuple`. `conv` itself is in lax_extra, next to
`conv_general_dilated`.

Example:
    >>> from fflow import lax
    >>> lax.padtype_to_pads((10, 10), (3, 3), (2, 2), "SAME")
    [(0, 1), (0, 1)]
"""

from collections import namedtuple

ConvDimensionNumbers = namedtuple("ConvDimensionNumbers", ["lhs_spec", "rhs_spec", "out_spec"])


def padtype_to_pads(in_shape, window_shape, window_strides, padding):
    """Explicit (low, high) pads of "SAME"/"VALID"/"SAME_LOWER" padding, as JAX computes."""
    kind = padding.upper() if isinstance(padding, str) else None
    if kind not in ("SAME", "VALID", "SAME_LOWER"):
        raise TypeError(f"Unknown padding type: {padding}.")
    if kind == "VALID":
        return [(0, 0)] * len(in_shape)
    pads = []
    for n, w, s in zip(in_shape, window_shape, window_strides):
        total = max((-(-n // s) - 1) * s + w - n, 0)
        lo, hi = total // 2, total - total // 2
        pads.append((hi, lo) if kind == "SAME_LOWER" else (lo, hi))
    return pads


def conv_dimension_numbers(lhs_shape, rhs_shape, dimension_numbers):
    """`ConvDimensionNumbers` (axis permutations) of layout strings or None (NC.., OI..)."""
    if isinstance(dimension_numbers, ConvDimensionNumbers):
        return dimension_numbers
    nd = len(lhs_shape)
    if dimension_numbers is None:
        iota = tuple(range(nd))
        return ConvDimensionNumbers(iota, iota, iota)
    ls, rs, os_ = dimension_numbers
    lhs_spec = (ls.index("N"), ls.index("C")) + tuple(ls.index(c) for c in rs if c not in "OI")
    rhs_spec = (rs.index("O"), rs.index("I")) + tuple(rs.index(c) for c in rs if c not in "OI")
    out_spec = (os_.index("N"), os_.index("C")) + tuple(os_.index(c) for c in rs if c not in "OI")
    return ConvDimensionNumbers(lhs_spec, rhs_spec, out_spec)


def conv_general_shape_tuple(lhs_shape, rhs_shape, window_strides, padding, dimension_numbers):
    """The output shape of `conv_general_dilated` (no dilation), in the output layout."""
    dn = conv_dimension_numbers(lhs_shape, rhs_shape, dimension_numbers)
    lhs = [lhs_shape[i] for i in dn.lhs_spec]
    rhs = [rhs_shape[i] for i in dn.rhs_spec]
    if isinstance(padding, str):
        padding = padtype_to_pads(lhs[2:], rhs[2:], window_strides, padding)
    spatial = [
        (n + lo + hi - w) // s + 1
        for n, w, s, (lo, hi) in zip(lhs[2:], rhs[2:], window_strides, padding)
    ]
    out = [lhs[0], rhs[0]] + spatial  # in N, C, spatial... order
    result = [0] * len(out)
    for pos, axis in enumerate(dn.out_spec):
        result[axis] = out[pos]
    return tuple(result)


def reduce_window_shape_tuple(
    operand_shape, window_dimensions, window_strides, padding, base_dilation=None,
    window_dilation=None,
):  # fmt: skip
    """The output shape of `reduce_window` with explicit (low, high) `padding`."""
    nd = len(operand_shape)
    base = base_dilation or (1,) * nd
    wdil = window_dilation or (1,) * nd
    shape = []
    for n, w, s, (lo, hi), b, d in zip(
        operand_shape, window_dimensions, window_strides, padding, base, wdil
    ):
        n = (n - 1) * b + 1 + lo + hi
        w = (w - 1) * d + 1
        shape.append(max(0, (n - w) // s + 1))
    return tuple(shape)


__all__ = [
    "ConvDimensionNumbers",
    "conv_dimension_numbers",
    "conv_general_shape_tuple",
    "padtype_to_pads",
    "reduce_window_shape_tuple",
]
