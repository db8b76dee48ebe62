"""fflow.compat: run programs and libraries written for JAX on fflow.

`fflow.compat.install()` makes `import jax`, `import jax.numpy`, `import jaxlib` (and
every `jax.<module>` fflow provides) resolve to fflow in this process. It is off by
default; nothing changes until it is called. `python -m fflow.compat script.py [args]`
runs a script with it installed.

Example:
    >>> import fflow.compat
    >>> fflow.compat.install()
    >>> import jax, jax.numpy as jnp
    >>> jax.grad(lambda x: jnp.sin(x) ** 2)(0.5).dtype
    dtype('float32')
    >>> fflow.compat.uninstall()

Names fflow does not provide raise an ImportError naming the module. An installed JAX
is never imported; libraries that need JAX's internals (`jax._src`, XLA) fail there.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

# JAX module -> fflow module, where the names differ (otherwise jax.X -> fflow.X)
_MODULES = {
    "jax": "fflow",
    "jax.sharding": "fflow.jax_sharding",
    "jax.experimental.shard_map": "fflow.experimental.shard_map",
    "jax.extend": "fflow.extend",
    "jax.extend.core": "fflow.extend",
    "jax.core": "fflow.jax_core",
    "jax.interpreters": "fflow.interpreters",
    "jax.api_util": "fflow.api_util",
}

_installed = []


def _target(name):
    if name in _MODULES:
        return _MODULES[name]
    parent, _, leaf = name.rpartition(".")
    if parent in _MODULES and parent != "jax":
        return _MODULES[parent] + "." + leaf
    return "fflow" + name[len("jax") :]


class _Loader(importlib.abc.Loader):
    def __init__(self, module):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """Answers `jax`, `jax.*` and `jaxlib*` imports with fflow's modules."""

    def find_spec(self, name, path=None, target=None):
        if name == "jaxlib" or name.startswith("jaxlib."):
            module = _jaxlib(name)
        elif name == "jax" or name.startswith("jax."):
            module = _fflow_module(name)
            _alias_submodules(name, module)
        else:
            return None
        return importlib.machinery.ModuleSpec(name, _Loader(module))


def _jax_module():
    """`jax` is its own module object forwarding to fflow: the import system sets each
    imported `jax.X` on its parent, and `jax.sharding` / `jax.core` must not replace
    fflow's own `fflow.sharding` / `fflow.core`."""
    fflow = importlib.import_module("fflow")
    module = _Forwarding("fflow", fflow.__doc__)
    module.__path__ = []
    module._fflow = fflow
    for name in ("sharding", "core"):
        setattr(module, name, importlib.import_module(_MODULES["jax." + name]))
    return module


class _Forwarding(types.ModuleType):
    def __getattr__(self, name):
        return getattr(self.__dict__["_fflow"], name)

    def __dir__(self):
        return sorted(set(dir(self.__dict__["_fflow"])) | set(self.__dict__))


def _fflow_module(name):
    if name == "jax":
        return _jax_module()
    target = _target(name)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name != target and not target.startswith(str(e.name)):
            raise
        # an attribute of the parent that is a namespace (jax.scipy.stats.norm)
        parent, _, leaf = target.rpartition(".")
        value = getattr(importlib.import_module(parent), leaf, None) if parent else None
        if isinstance(value, types.ModuleType):
            return value
        raise ImportError(
            f"fflow.compat: {name} is not provided by fflow (looked for {target}). "
            f"Fix: use the fflow equivalent, or run this program with real JAX."
        ) from None


def _alias_submodules(name, module):
    # submodules fflow registers itself (fflow.scipy.stats.norm) are importable as
    # jax.scipy.stats.norm without the parent being a package
    prefix = module.__name__ + "."
    for key, value in list(sys.modules.items()):
        if key.startswith(prefix):
            sys.modules.setdefault(name + "." + key[len(prefix) :], value)
    if not hasattr(module, "__path__"):  # a plain module: its module attributes too
        for attr, value in list(vars(module).items()):
            if isinstance(value, types.ModuleType) and not attr.startswith("_"):
                sys.modules.setdefault(name + "." + attr, value)


def _jaxlib(name):
    fflow = importlib.import_module("fflow")
    module = types.ModuleType(name, "fflow stands in for jaxlib (fflow.compat)")
    module.__version__ = fflow.__jax_version__
    module.version = module
    module.__path__ = []
    return module


def install():
    """Make `import jax` / `jax.*` / `jaxlib` resolve to fflow in this process.

    JAX modules already imported are replaced in `sys.modules` (code that holds them
    keeps them). Call `uninstall()` to undo.
    """
    if _installed:
        return
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    saved = {k: v for k, v in sys.modules.items() if _is_jax_name(k)}
    for k in saved:
        del sys.modules[k]
    _installed.append((finder, saved))
    sys.modules["jax"] = _jax_module()
    sys.modules["jax.numpy"] = importlib.import_module("fflow.numpy")


def uninstall():
    """Undo `install()`: `import jax` finds the real JAX (if installed) again."""
    if not _installed:
        return
    finder, saved = _installed.pop()
    sys.meta_path.remove(finder)
    for k in [k for k in sys.modules if _is_jax_name(k)]:
        del sys.modules[k]
    sys.modules.update(saved)


def is_installed():
    return bool(_installed)


def _is_jax_name(name):
    return name in ("jax", "jaxlib") or name.startswith(("jax.", "jaxlib."))


def main(argv=None):
    """`python -m fflow.compat script.py [args...]`: run a JAX script on fflow."""
    import runpy

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m fflow.compat script.py [args...]  (or -m module [args...])")
        return 0 if argv else 2
    install()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
