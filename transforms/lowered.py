"""JAX's ahead-of-time API shape: `jit(f).lower(*args)` -> `Lowered` -> `.compile()`.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> lowered = fflow.jit(lambda x: x * 2 + 1).lower(jnp.ones(3))
    >>> "def fflow_kernel" in lowered.as_text()
    True
    >>> lowered.compile()(jnp.ones(3)).tolist()
    [3.0, 3.0, 3.0]
"""

from fflow.api_util import as_value
from fflow.tree_util import tree_flatten, tree_unflatten


class Lowered:
    """A traced and lowered program: `.as_text()` is the program and the generated code."""

    def __init__(self, entry, in_tree=None):
        self.entry = entry
        self.in_tree = in_tree

    @property
    def program(self):
        """The traced program (before the lowering passes)."""
        return self.entry.program

    @property
    def optimized_program(self):
        """The program after DCE, constant folding and CSE (what the code implements)."""
        return getattr(self.entry.executable, "program", self.entry.program)

    @property
    def source(self):
        """The generated Python source (None for interpreted programs)."""
        return getattr(self.entry.executable, "source", None)

    def as_text(self):
        text = "# program\n" + str(self.entry.program)
        opt = getattr(self.entry.executable, "program", None)
        if opt is not None and opt is not self.entry.program:
            text += "\n\n# after passes (DCE, constant folding, CSE)\n" + str(opt)
        steps = getattr(self.entry.executable, "steps", None)
        groups = [s for s in steps or () if type(s).__name__ == "FusionGroup"]
        if groups:
            text += "\n\n# fused elementwise groups\n" + "\n".join(f"# {g!r}" for g in groups)
        if self.source:
            text += "\n\n# generated code\n" + self.source
        for k, c_source in enumerate(getattr(self.entry.executable, "native_sources", ())):
            text += f"\n\n# native loop {k} (C, gcc)\n" + c_source
        return text

    def __str__(self):
        return self.as_text()

    def explain(self):
        """The `fflow.explain` report for this program."""
        from fflow.explain import Report

        return Report(self.entry)

    def compile(self):
        """The executable (trace and code generation already happened)."""
        return Compiled(self.entry)


class Compiled:
    """The executable of a Lowered program; call it with the same argument structure."""

    def __init__(self, entry):
        self.entry = entry

    def __call__(self, *args, **kwargs):
        leaves, _ = tree_flatten((args, kwargs))
        leaves = [as_value(x) for x in leaves]
        if self.entry.executable is None:
            raise RuntimeError("this program has no executable (it closes over traced values)")
        outs = self.entry.executable(*leaves)
        return tree_unflatten(self.entry.out_tree, outs)

    def as_text(self):
        return Lowered(self.entry).as_text()

    def __str__(self):
        return self.as_text()
