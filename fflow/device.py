"""Devices and device arrays: `fflow.devices("gpu")`, `fflow.device_put(x, device)`.

A GPU array is an `Array` whose value is a `DeviceBuffer` (a CuPy array holding
the bytes, plus the logical dtype: bfloat16 is stored as uint16 because CuPy has
no bfloat16). Eager operations on device arrays run through the CUDA backend
(one cached kernel per primitive and signature) and `jit` lowers whole programs
to it. CuPy is imported only here, and only when a GPU is asked for.

The "cuda_shim" platform is a simulated GPU: its buffers are host memory and its
kernels are the same generated CUDA C run on the CPU through the host shim. It
exercises every GPU code path on machines without one.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> dev = fflow.devices("cuda_shim")[0]
    >>> x = fflow.device_put(jnp.arange(4.0), dev)
    >>> (x * 2 + 1).tolist()
    [1.0, 3.0, 5.0, 7.0]
"""

import numpy as np

from fflow.array import Array
from fflow.device_buffer import Device, DeviceBuffer, device_of, devices, to_device
from fflow.tree_util import tree_map


def device_put(x, device=None):
    """Place `x` (an array or a pytree of arrays) on `device` (default: the first GPU).

    Example:
        >>> import fflow, numpy as np
        >>> x = fflow.device_put(np.ones(3, np.float32), fflow.devices("cuda_shim")[0])
        >>> x.device
        Device(cuda_shim:0)
    """
    if device is None:  # as JAX: the default device (the first GPU, else the CPU)
        device = devices()[0]
    if hasattr(device, "_fflow_put"):  # a jax.sharding object (fflow.jax_sharding)
        return device._fflow_put(x)
    if isinstance(device, str):
        device = devices(device)[0]

    def put(leaf):
        if type(leaf) is Array and type(leaf._value) is DeviceBuffer:
            if leaf._value.device == device:
                return leaf
            leaf = Array(leaf._value.get(), leaf._weak)
        weak = leaf._weak if type(leaf) is Array else False
        host = np.asarray(leaf)
        if device.platform == "cpu":
            return Array(np.array(host), weak)
        # the CUDA backend runs eager operations on device arrays (it installs the hook)
        from fflow.lowering import cuda_backend  # noqa: F401

        return Array(to_device(host, device), weak)

    return tree_map(put, x)


__all__ = ["Device", "DeviceBuffer", "devices", "device_put", "device_of"]
