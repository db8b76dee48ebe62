"""The primitive set, one module per family. Importing this registers them all."""

from fflow.primitives import (  # noqa: F401
    attention,
    binary,
    collectives,
    compare,
    control_flow,
    convert,
    cumulative,
    dot,
    fft,
    indexing,
    linalg,
    named_axis,
    pipeline_call,
    random_bits,
    reduction,
    shape,
    shard_move,
    sort,
    special,
    unary,
)
