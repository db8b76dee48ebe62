"""Devices and the value of a GPU array: `Device`, `DeviceBuffer`, `devices()`.

Below the backends (layer 2): the CUDA backend and its runtimes build `DeviceBuffer`s
from here, and `fflow.device` (device_put) sits on top and loads the backend, so the
module graph has no cycle. CuPy is imported only when a GPU is asked for.

Example:
    >>> from fflow.device_buffer import DeviceBuffer, devices
    >>> import numpy as np
    >>> buf = DeviceBuffer(np.arange(3.0), np.float64, devices("cuda_shim")[0])
    >>> buf
    DeviceBuffer(float64[3] on Device(cuda_shim:0))
"""

import os

import numpy as np

from fflow.array import Array
from fflow.errors import user_error


class Device:
    """One device: `platform` is "gpu" (CuPy), "cuda_shim" (simulated) or "cpu"."""

    def __init__(self, platform, id=0):  # noqa: A002
        self.platform = platform
        self.id = id

    @property
    def backend(self):
        return {"gpu": "cuda", "cuda_shim": "cuda_shim"}.get(self.platform, "numpy")

    # JAX's Device fields
    @property
    def device_kind(self):
        return self.platform

    process_index = 0

    def __repr__(self):
        return f"Device({self.platform}:{self.id})"

    def __eq__(self, other):
        return isinstance(other, Device) and (self.platform, self.id) == (other.platform, other.id)

    def __hash__(self):
        return hash((self.platform, self.id))


def _cupy():
    # float32 GEMMs use TF32 tensor cores, as JAX does by default on GPUs; set
    # FFLOW_GPU_TF32=0 (before the first GPU use) for full float32 products
    os.environ.setdefault("CUPY_TF32", os.environ.get("FFLOW_GPU_TF32", "1"))
    try:
        import cupy
    except ImportError as e:
        raise user_error(
            RuntimeError,
            "GPU arrays need CuPy. Fix: pip install 'fflow[gpu]' (cupy-cuda13x) on a "
            "machine with an NVIDIA GPU, or use fflow.devices('cuda_shim') to simulate one.",
        ) from e
    return cupy


def devices(platform=None):
    """The devices of a platform: "gpu" (also "cuda"), "cuda_shim" or "cpu"; by default
    the GPUs when CuPy finds one, else the CPU (as `jax.devices()`).

    Example:
        >>> import fflow
        >>> fflow.devices("cpu")
        [Device(cpu:0)]
    """
    if platform is None:
        try:
            return devices("gpu")
        except RuntimeError:
            return devices("cpu")
    if platform in ("gpu", "cuda"):
        cupy = _cupy()
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # noqa: BLE001 - CuPy raises its own runtime errors
            raise user_error(RuntimeError, f"no usable CUDA device: {e}") from e
        return [Device("gpu", i) for i in range(n)]
    if platform == "cuda_shim":
        return [Device("cuda_shim", 0)]
    if platform == "cpu":
        return [Device("cpu", 0)]
    raise user_error(ValueError, f"unknown platform {platform!r}; use 'gpu', 'cuda_shim' or 'cpu'")


class DeviceBuffer:
    """Device memory holding one array: `data` (storage array), logical `dtype`, `device`."""

    __slots__ = ("data", "dtype", "device")

    def __init__(self, data, dtype, device):
        self.data = data
        self.dtype = np.dtype(dtype)
        self.device = device

    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)
    nbytes = property(lambda self: self.data.nbytes)

    def get(self):
        """A host NumPy copy (a view for the simulated device)."""
        host = self.data.get() if hasattr(self.data, "get") else self.data
        if host.dtype != self.dtype:
            host = host.view(self.dtype)
        return host

    def __array__(self, dtype=None, copy=None):
        out = self.get()
        return out if dtype is None else out.astype(dtype)

    def reshape(self, shape):
        return DeviceBuffer(self.data.reshape(shape), self.dtype, self.device)

    def __bool__(self):
        return bool(self.get())

    def __int__(self):
        return int(self.get())

    def __float__(self):
        return float(self.get())

    def __index__(self):
        return int(self.get())

    def __repr__(self):
        return f"DeviceBuffer({self.dtype.name}{list(self.shape)} on {self.device})"


def storage_dtype(dtype):
    dtype = np.dtype(dtype)
    return np.dtype(np.uint16) if dtype.name == "bfloat16" else dtype


def to_device(host, device):
    """Copy a NumPy array to `device` as a DeviceBuffer."""
    host = np.asarray(host)
    if not host.flags.c_contiguous:
        host = host.copy()  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    if device.platform == "gpu":
        cupy = _cupy()
        with cupy.cuda.Device(device.id):
            data = cupy.asarray(host.view(storage_dtype(host.dtype)))
    else:
        data = _aligned_copy(host)
    return DeviceBuffer(data, host.dtype, device)


def _aligned_copy(host):
    # 16-byte aligned, so vectorised (uint4) loads are legal in the simulated kernels
    raw = np.empty(host.nbytes + 16, np.uint8)
    off = (-raw.ctypes.data) % 16
    out = raw[off : off + host.nbytes].view(host.dtype).reshape(host.shape)
    out[...] = host
    return out


def device_of(x):
    """The Device an Array lives on (a CPU device for host arrays)."""
    if type(x) is Array and type(x._value) is DeviceBuffer:
        return x._value.device
    return Device("cpu", 0)


Array.device = property(device_of)  # JAX's `x.device`

__all__ = ["Device", "DeviceBuffer", "devices", "device_of", "storage_dtype", "to_device"]
