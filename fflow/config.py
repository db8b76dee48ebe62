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
* `blas_kernel` ("auto"): the OpenBLAS kernels of compiled GEMMs. "auto" runs the core
  OpenBLAS detects for this CPU even when `OPENBLAS_CORETYPE` pins NumPy's to another
  (lowering/cpu_gemm.py); "numpy" calls NumPy's library as loaded. Read at the first GEMM.
* `malloc_tuning` (True): at the first compiled program, glibc's malloc keeps freed
  temporaries' pages mapped (`mallopt` M_MMAP_THRESHOLD 32 MB, M_TOP_PAD 64 MB;
  `fflow.threads.tune_malloc`): without it every step can re-fault its temporaries.
* `cpu_devices` (8): number of simulated CPU devices for `shard`.
* `explain_log` (False): print `fflow.explain`'s report for every jit compile.
* `jit_backend` ("numpy"): "cuda_shim" lowers jitted programs to CUDA kernels run on
  the CPU through the host shim (tests); inputs on a GPU always use "cuda".
* `attention_rewrite` (True): hand-written `softmax(q @ kᵀ · scale + mask) @ v` becomes
  the fused `dot_product_attention` when jit/make_jaxpr trace (before autodiff; rules
  in transforms/attention_rewrite.py). Read at trace time: functions already traced
  keep what they were traced with.
* `enable_x64` (False; JAX's name `jax_enable_x64`, env `JAX_ENABLE_X64` too): 64-bit
  mode. Off, 64-bit inputs and requested dtypes are narrowed to 32 bits, as in JAX.

JAX's option names (`jax_enable_x64`, `jax_debug_nans`, ...) are accepted: a `jax_`
name of an fflow option sets that option; the other JAX options are kept and read
back but change nothing here (`jax_default_matmul_precision`, `jax_platforms`...).
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
    "blas_kernel": "auto",
    "malloc_tuning": True,
}


def _parse(default, text):
    if isinstance(default, bool):
        return text.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int(text)
    return text


# JAX option names that are fflow options under another name
_ALIASES = {
    "jax_enable_x64": "enable_x64",
    "jax_debug_nans": "debug_nans",
    "jax_debug_infs": "debug_infs",
}
# JAX options fflow accepts and stores (no effect here: one CPU/GPU backend, full precision)
_JAX_ONLY = {
    "jax_default_matmul_precision": None,
    "jax_default_prng_impl": "threefry2x32",
    "jax_disable_jit": False,
    "jax_platforms": None,
    "jax_platform_name": None,
    "jax_default_device": None,
    "jax_numpy_rank_promotion": "allow",
    "jax_numpy_dtype_promotion": "standard",
    "jax_log_compiles": False,
    "jax_traceback_filtering": "auto",
    "jax_threefry_partitionable": True,
    "jax_compilation_cache_dir": None,
    "jax_persistent_cache_min_compile_time_secs": 1.0,
    "jax_check_tracer_leaks": False,
    "jax_transfer_guard": None,
    "jax_pmap_shmap_merge": False,
    "jax_use_shardy_partitioner": False,
}


class Config:
    """fflow's options. Read them as attributes; change them with `update`."""

    def __init__(self):
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_hooks", {})
        for name, default in _DEFAULTS.items():
            env = os.environ.get("FFLOW_" + name.upper())
            self._values[name] = default if env is None else _parse(default, env)
        self._values.update(_JAX_ONLY)
        self._values["enable_x64"] = self._values["enable_x64"] or _env_flag("JAX_ENABLE_X64")

    def update(self, name, value):
        """Set option `name` (raises for an unknown name, listing the known ones)."""
        name = _ALIASES.get(name, name)
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
            return self._values[_ALIASES.get(name, name)]
        except KeyError:
            raise AttributeError(f"unknown fflow config option {name!r}") from None

    def __setattr__(self, name, value):
        self.update(name, value)

    def values(self):
        return dict(self._values)

    def read(self, name):
        """JAX's `config.read(name)`: the value of an option."""
        return getattr(self, name)

    def config_with_absl(self):
        """JAX's absl hook; fflow reads no absl flags (a no-op for JAX test files)."""

    def parse_flags_with_absl(self):
        """JAX's absl hook; fflow reads no absl flags (a no-op for JAX test files)."""

    def __repr__(self):
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in sorted(self._values.items())) + ")"


def _env_flag(name):
    text = os.environ.get(name)
    return text is not None and text.strip().lower() in ("1", "true", "yes", "on")


config = Config()


def _blas_threads_hook(value):
    threads.set_fixed(value)


config.on_update("blas_threads", _blas_threads_hook)
if config.blas_threads:
    _blas_threads_hook(config.blas_threads)
config.on_update("blas_kernel", threads.set_blas_kernel)
threads.set_blas_kernel(config.blas_kernel)
config.on_update("malloc_tuning", threads.set_malloc_tuning)
threads.set_malloc_tuning(config.malloc_tuning)

update = config.update

__all__ = ["config", "update", "Config"]


def __getattr__(name):
    # `import fflow.config` makes the module the attribute `fflow.config`; reads of
    # options on the module go to the Config object
    return getattr(config, name)
