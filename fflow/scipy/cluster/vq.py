"""`jax.scipy.cluster.vq.vq`: the index of each observation's nearest code-book entry and
the Euclidean distance to it (SciPy's vq).

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow.scipy.cluster.vq import vq
    >>> codes, dist = vq(jnp.array([[0.0, 0.1], [2.0, 2.0]]), jnp.array([[0.0, 0.0], [2.0, 1.0]]))
    >>> codes.tolist(), [round(float(d), 4) for d in dist]
    ([0, 1], [0.1, 1.0])
"""

import fflow.numpy as jnp
from fflow.numpy._util import promote_inexact


def vq(obs, code_book, check_finite=True):
    """(codes, distances): argmin over the code book of ||obs[i] - code_book[j]||."""
    obs, code_book = promote_inexact(jnp.asarray(obs), jnp.asarray(code_book))
    if obs.ndim != code_book.ndim:
        raise ValueError(
            f"vq: obs has {obs.ndim} dims and code_book {code_book.ndim}. Fix: give both "
            f"the same number of dims ((n, d) and (k, d), or (n,) and (k,))."
        )
    if obs.ndim == 1:
        obs, code_book = obs[:, None], code_book[:, None]
    dist = jnp.linalg.norm(obs[:, None, :] - code_book[None, :, :], axis=-1)
    code = jnp.argmin(dist, axis=-1)
    return code, jnp.take_along_axis(dist, code[:, None], axis=1)[:, 0]


__all__ = ["vq"]
