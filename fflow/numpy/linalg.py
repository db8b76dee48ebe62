"""fflow.numpy.linalg: norms (and the products from the main namespace)."""

from fflow.numpy.linalg_ops import matmul, norm, outer, tensordot, trace, vdot  # noqa: F401


def matrix_transpose(x):
    from fflow.numpy.shapes import matrix_transpose as _mt

    return _mt(x)


def vector_norm(x, axis=None, keepdims=False, ord=2):
    return norm(x, ord=ord, axis=axis, keepdims=keepdims)
