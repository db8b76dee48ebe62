"""Global configuration, JAX style: `fflow.config.update(name, value)` and attribute reads.

Example:
    >>> import fflow
    >>> fflow.config.update("debug_nans", True)
    >>> fflow.config.debug_nans
    True
    >>> fflow.config.update("debug_nans", False)

Options (also read from the environment as `FFLOW_<NAME>` at import):

* `debug_nans` (False): raise at the first equation that produces a NaN, naming the
  primitive and the user's source line (jit, grad and eager).
* `debug_infs` (False): the same for infinities.
* `jit_interpret` (False): run jitted programs equation by equation with the
  primitives' reference implementations instead of the generated kernels.
* `jit_native` (True): compile large fused elementwise groups to native code when
  a C compiler is available (else chunked NumPy).
* `blas_threads` (0): threads of large matrix products. 0 adapts (fflow runs NumPy's
  BLAS on one thread and splits large GEMMs over its own pool, sized to the free
  cores, see fflow/threads.py); n > 0 uses n threads; -1 leaves NumPy's BLAS alone.
* `cpu_devices` (8): number of simulated CPU devices for `shard`.
* `explain_log` (False): print `fflow.explain`'s report for every jit compile.
* `jit_backend` ("numpy"): "cuda_shim" lowers jitted programs to CUDA kernels run on
  the CPU through the host shim (tests); inputs on a GPU always use "cuda".
"""

import os

from fflow import threads

_DEFAULTS = {
    "debug_nans": False,
    "debug_infs": False,
    "jit_interpret": False,
    "jit_native": True,
    "cpu_devices": 8,
    "explain_log": False,
    "enable_x64": False,
    "jit_backend": "numpy",
    "blas_threads": 0,
}


def _parse(default, text):
    if isinstance(default, bool):
        return text.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int(text)
    return text


class Config:
    """fflow's options. Read them as attributes; change them with `update`."""

    def __init__(self):
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_hooks", {})
        for name, default in _DEFAULTS.items():
            env = os.environ.get("FFLOW_" + name.upper())
            self._values[name] = default if env is None else _parse(default, env)

    def update(self, name, value):
        """Set option `name` (raises for an unknown name, listing the known ones)."""
        if name not in self._values:
            known = ", ".join(sorted(self._values))
            raise AttributeError(f"unknown fflow config option {name!r}; known options: {known}")
        self._values[name] = value
        for hook in self._hooks.get(name, ()):
            hook(value)

    def define(self, name, default, hook=None):
        """Add an option (for other modules of fflow); `hook(value)` runs on updates."""
        if name not in self._values:
            env = os.environ.get("FFLOW_" + name.upper())
            self._values[name] = default if env is None else _parse(default, env)
        if hook is not None:
            self._hooks.setdefault(name, []).append(hook)
            hook(self._values[name])

    def on_update(self, name, hook):
        self._hooks.setdefault(name, []).append(hook)

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"unknown fflow config option {name!r}") from None

    def __setattr__(self, name, value):
        self.update(name, value)

    def values(self):
        return dict(self._values)

    def __repr__(self):
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in sorted(self._values.items())) + ")"


config = Config()


def _blas_threads_hook(value):
    threads.set_fixed(value)


config.on_update("blas_threads", _blas_threads_hook)
if config.blas_threads:
    _blas_threads_hook(config.blas_threads)

update = config.update

__all__ = ["config", "update", "Config"]


def __getattr__(name):
    # `import fflow.config` makes the module the attribute `fflow.config`; reads of
    # options on the module go to the Config object
    return getattr(config, name)
