"""AMP policies: which dtype each class of primitive computes in.

A primitive's AMP class sits next to its definition (`prim.amp_class`):

- ``"low"``: runs in the policy's compute dtype (bf16/fp16) — matmul-like
  contractions, whose hardware throughput is what mixed precision is for. They
  still accumulate in fp32 (see `amp_rules` in transforms/amp.py).
- ``"fp32"``: always runs in (at least) fp32 — exp, log, pow, sums and products,
  cumulative sums: the ops whose range or accumulated rounding error fp16/bf16
  cannot hold. softmax, log_softmax, logsumexp, norms and losses are Python
  functions over these primitives, so they are caught through them.
- ``"follow"``: runs in the widest floating dtype among its inputs (reshape,
  transpose, add, select, max, ...). Python scalars and constants built from
  them do not widen anything: they follow the other inputs.
- ``"keep"``: runs in exactly the dtypes of the un-rewritten program (the
  fallback for primitives without a class, e.g. control flow with sub-programs).

OneFlow's AMP lists map onto these: allow/white = "low", deny/black = "fp32",
gray and clear = "follow".
"""

import numpy as np

from fflow import core, dtypes
from fflow import lax_ops as lax
from fflow.errors import user_error
from fflow.tree_util import tree_map

LOW, FP32, FOLLOW, KEEP = "low", "fp32", "follow", "keep"
CLASSES = (LOW, FP32, FOLLOW, KEEP)
_ALIASES = {
    "allow": LOW,
    "white": LOW,
    "deny": FP32,
    "black": FP32,
    "float32": FP32,
    "gray": FOLLOW,
    "grey": FOLLOW,
    "clear": FOLLOW,
}

_NAMED = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "f32": "float32",
    "float32": "float32",
}


def _canonical_class(value, key):
    name = _ALIASES.get(value, value) if isinstance(value, str) else None
    if name not in CLASSES:
        raise user_error(
            ValueError,
            f"amp Policy override {key!r}: {value!r} is not an AMP class. "
            f"Fix: use one of {', '.join(CLASSES)} (or allow/deny/gray/clear).",
        )
    return name


def _dtype_or_none(d, what):
    if d is None:
        return None
    if isinstance(d, str) and d in _NAMED:
        d = _NAMED[d]
    d = dtypes.canonicalize(d)
    if not dtypes.is_float(d):
        raise user_error(TypeError, f"amp Policy: {what} must be a floating dtype, got {d.name}")
    return d


class Policy:
    """A mixed-precision policy: compute, parameter and output dtypes, plus class overrides.

    Args:
        compute_dtype: the dtype of "low" primitives (bfloat16 or float16).
        param_dtype: floating inputs of the rewritten function are cast to this dtype
            on entry to the rewritten region. The caller's fp32 master weights are
            untouched and their gradients still come back fp32 (the cast's transpose
            casts them back). With "bf16" biases and activations stay bf16 too; None
            (the default) leaves inputs as they come, so a follow-class op mixing a
            bf16 matmul result with an fp32 bias runs in fp32.
        output_dtype: floating outputs are cast to this; None (the default) gives
            each output the dtype the un-rewritten function would return.
        overrides: ``{primitive or its name: class}`` replacing a primitive's
            own AMP class; classes "low", "fp32", "follow", "keep" or OneFlow's
            list names "allow", "deny", "gray", "clear".

    Example:
        >>> import fflow
        >>> p = fflow.amp.Policy("bf16", overrides={"tanh": "fp32"})
        >>> p.compute_dtype.name, p.class_of("tanh"), p.class_of("dot_general")
        ('bfloat16', 'fp32', 'low')
    """

    def __init__(self, compute_dtype, param_dtype=None, output_dtype=None, overrides=None):
        self.compute_dtype = _dtype_or_none(compute_dtype, "compute_dtype")
        if self.compute_dtype is None:
            raise user_error(TypeError, "amp Policy needs a compute_dtype (e.g. 'bf16')")
        self.param_dtype = _dtype_or_none(param_dtype, "param_dtype")
        self.output_dtype = _dtype_or_none(output_dtype, "output_dtype")
        self.overrides = {}
        self._classes = {}  # primitive -> class, filled on first use (per-op lookup cost)
        for key, value in (overrides or {}).items():
            name = key if isinstance(key, str) else getattr(key, "name", None)
            if name not in core.primitives:
                raise user_error(
                    ValueError,
                    f"amp Policy override: {key!r} is not a primitive. Fix: name a "
                    f"primitive (e.g. 'dot_general', 'exp') or pass the primitive object.",
                )
            self.overrides[name] = _canonical_class(value, key)

    @classmethod
    def from_lists(
        cls,
        compute_dtype,
        allow=(),
        deny=(),
        gray=(),
        clear=(),
        param_dtype=None,
        output_dtype=None,
    ):
        """A policy in OneFlow's terms: primitives on the allow list run in low
        precision, on the deny list in fp32, gray and clear ones follow their inputs.

        Example:
            >>> import fflow
            >>> p = fflow.amp.Policy.from_lists("fp16", deny=["tanh"], gray=["dot_general"])
            >>> p.class_of("tanh"), p.class_of("dot_general")
            ('fp32', 'follow')
        """
        overrides = {}
        for names, klass in ((allow, LOW), (deny, FP32), (gray, FOLLOW), (clear, FOLLOW)):
            for name in names:
                overrides[name] = klass
        return cls(compute_dtype, param_dtype, output_dtype, overrides)

    @staticmethod
    def resolve(policy):
        """A Policy from a Policy, "bf16"/"fp16"/"fp32", or "params=f32,compute=bf16,output=f32"."""
        if isinstance(policy, Policy):
            return policy
        if isinstance(policy, str):
            if policy in _NAMED:
                return Policy(_NAMED[policy])
            if "=" in policy:
                return Policy._from_string(policy)
        if isinstance(policy, np.dtype) or (isinstance(policy, type) and policy is not str):
            return Policy(policy)
        raise user_error(
            ValueError,
            f"amp: unknown policy {policy!r}. Fix: pass 'bf16', 'fp16', or "
            f"fflow.amp.Policy(compute_dtype, param_dtype, output_dtype, overrides).",
        )

    @staticmethod
    def _from_string(text):
        # jmp's spelling: "params=float32,compute=bfloat16,output=float32"
        fields = {"params": None, "compute": None, "output": None}
        for part in text.split(","):
            key, _, value = part.partition("=")
            key = {"p": "params", "c": "compute", "o": "output"}.get(key.strip(), key.strip())
            if key not in fields:
                raise user_error(ValueError, f"amp policy string: unknown field {key!r}")
            fields[key] = value.strip()
        return Policy(fields["compute"], fields["params"], fields["output"])

    def class_of(self, prim):
        """The AMP class this policy gives `prim` (a primitive or its name)."""
        cls = self._classes.get(prim)
        if cls is None:
            name = prim if isinstance(prim, str) else prim.name
            if name in self.overrides:
                cls = self.overrides[name]
            else:
                p = core.primitives.get(name) if isinstance(prim, str) else prim
                cls = _canonical_class(getattr(p, "amp_class", KEEP), name)
            self._classes[prim] = cls
        return cls

    def cast_to_compute(self, tree):
        """Cast the floating leaves of `tree` to the compute dtype."""
        return _cast_tree(tree, self.compute_dtype)

    def cast_to_param(self, tree):
        """Cast the floating leaves of `tree` to the param dtype (if the policy has one)."""
        return tree if self.param_dtype is None else _cast_tree(tree, self.param_dtype)

    def cast_to_output(self, tree):
        """Cast the floating leaves of `tree` to the output dtype (if the policy has one)."""
        return tree if self.output_dtype is None else _cast_tree(tree, self.output_dtype)

    def __eq__(self, other):
        return isinstance(other, Policy) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def _key(self):
        return (
            self.compute_dtype,
            self.param_dtype,
            self.output_dtype,
            tuple(sorted(self.overrides.items())),
        )

    def __repr__(self):
        def n(d):
            return None if d is None else d.name

        extra = f", overrides={self.overrides}" if self.overrides else ""
        return (
            f"Policy(compute_dtype={n(self.compute_dtype)}, param_dtype={n(self.param_dtype)}, "
            f"output_dtype={n(self.output_dtype)}{extra})"
        )


def _cast_tree(tree, dtype):

    def cast(x):
        if dtypes.is_float(core.aval_of_value(x).dtype):
            return lax.convert_element_type(x, dtype)
        return x

    return tree_map(cast, tree)
