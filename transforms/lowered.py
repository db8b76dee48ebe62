"""JAX's ahead-of-time API shape: `jit(f).lower(*args)` -> Lowered -> `.compile()`."""


class Lowered:
    """A traced and lowered program: `.as_text()` shows the program and generated code."""

    def __init__(self, entry):
        self.entry = entry

    @property
    def program(self):
        return self.entry.program

    def as_text(self):
        text = str(self.entry.program)
        source = getattr(self.entry.executable, "source", None)
        if source:
            text += "\n\n# generated code\n" + source
        return text

    def __str__(self):
        return self.as_text()

    def compile(self):
        return Compiled(self.entry)


class Compiled:
    """The executable of a Lowered program; call it with the flat arguments' pytree."""

    def __init__(self, entry):
        self.entry = entry

    def __call__(self, *args, **kwargs):
        from fflow.api_util import as_value
        from fflow.tree_util import tree_flatten, tree_unflatten

        leaves, _ = tree_flatten((args, kwargs))
        outs = self.entry.executable(*[as_value(x) for x in leaves])
        return tree_unflatten(self.entry.out_tree, outs)

    def as_text(self):
        return Lowered(self.entry).as_text()
