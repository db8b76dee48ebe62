"""GEMM operand layouts for the CUDA backend: a transposed operand of a dot_general
(`x @ w.T` as in PyTorch's Linear, `q @ k.transpose(0, 1, 3, 2)` in a hand-written
attention) is read by cuBLAS in place (OP_T) instead of being materialized by a
transpose kernel first.

`fold_operand_transposes` rewrites `dot_general(transpose(y, perm), ...)` into a
dot_general of `y` itself with its batch / contracting dimensions renumbered, when
that leaves the output unchanged (the operand's free dimensions keep their order)
and cuBLAS can stride over the result (cuda_gemm.dims: layout "N" or "T").
"""

import numpy as np
from fflow.lowering import cuda_gemm, passes
from fflow.lowering.pad_sums import use_counts
from fflow.primitives.convert import convert_element_type_p
from fflow.primitives.dot import dot_general_p
from fflow.primitives.shape import transpose_p


def fold_operand_transposes(program):
    program = fold_output_casts(fold_output_transposes(program))
    transposes = {e.outputs[0]: e for e in program.eqns if e.primitive is transpose_p}
    if not transposes:
        return program
    eqns, changed = [], False
    for e in program.eqns:
        if e.primitive is dot_general_p:
            for side in (0, 1):
                t = transposes.get(e.inputs[side])
                folded = _fold(e, side, t) if t is not None else None
                if folded is not None and cuda_gemm.dims(folded)[4 + side] != "copy":
                    e, changed = folded, True
        eqns.append(e)
    return passes.dce(program.replace(eqns=eqns)) if changed else program


def _fold(e, side, t):
    perm = tuple(t.params["permutation"])
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    c, b = (lc, rc)[side], (lb, rb)[side]
    free = [d for d in range(len(perm)) if d not in c and d not in b]
    moved = [perm[d] for d in free]
    if moved != sorted(moved):
        return None  # the output's dims would come out in another order
    c2, b2 = tuple(perm[d] for d in c), tuple(perm[d] for d in b)
    dn = ((c2, rc), (b2, rb)) if side == 0 else ((lc, c2), (lb, b2))
    inputs = list(e.inputs)
    inputs[side] = t.inputs[0]
    return e.replace(inputs=inputs, params=dict(e.params, dimension_numbers=dn))


def fold_output_transposes(program):
    """`transpose(dot_general(a, b))` that puts b's free dims first -> `dot_general(b, a)`.

    Weight gradients come out of reverse mode as dot(dy, x) over the batch dims, then a
    transpose to the weight's layout ([in, out]); with 3-D activations ([b, s, d]) the
    passes' 2-D rule does not apply and the transpose would be a kernel over the whole
    gradient. Swapping the operands writes the gradient in its layout directly.
    """
    uses = use_counts(program)
    dots = {e.outputs[0]: e for e in program.eqns if e.primitive is dot_general_p}
    swapped, dead = {}, set()
    for e in program.eqns:
        if e.primitive is not transpose_p or e.inputs[0] not in dots or uses.get(e.inputs[0]) != 1:
            continue
        dot = dots[e.inputs[0]]
        (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
        if lb or rb:
            continue
        a, b = dot.inputs
        nl, nr = a.aval.ndim - len(lc), b.aval.ndim - len(rc)
        if tuple(e.params["permutation"]) != tuple(range(nl, nl + nr)) + tuple(range(nl)):
            continue
        params = dict(dot.params, dimension_numbers=((tuple(rc), tuple(lc)), ((), ())))
        swapped[id(e)] = dot.replace(inputs=[b, a], params=params, outputs=e.outputs)
        dead.add(id(dot))
    if not swapped:
        return program
    eqns = [swapped.get(id(e), e) for e in program.eqns if id(e) not in dead]
    return program.replace(eqns=eqns)  # the swapped dot sits where the transpose was


def fold_output_casts(program):
    """`convert(dot(a, b) -> f32, bf16)` of 16-bit operands -> `dot(a, b) -> bf16`.

    amp's GEMMs accumulate in fp32 and cast the product back to bf16 / fp16: cuBLAS
    writes the 16-bit result itself (fp32 accumulation, one rounding at the store, as
    the cast does), so the fp32 product is never written and read back.
    """
    uses = use_counts(program)
    dots = {e.outputs[0]: e for e in program.eqns if e.primitive is dot_general_p}
    folded, dead = {}, set()
    for e in program.eqns:
        x = e.inputs[0] if e.inputs else None
        if e.primitive is not convert_element_type_p or x not in dots or uses.get(x) != 1:
            continue
        dot = dots[x]
        a, b = dot.inputs
        want = np.dtype(e.outputs[0].aval.dtype)
        if not (np.dtype(a.aval.dtype) == np.dtype(b.aval.dtype) == want):
            continue
        if want.name not in ("bfloat16", "float16") or np.dtype(x.aval.dtype) != np.float32:
            continue
        params = dict(dot.params, preferred_element_type=want)
        folded[id(e)] = dot.replace(params=params, outputs=e.outputs)
        dead.add(id(dot))
    if not folded:
        return program
    eqns = [folded.get(id(e), e) for e in program.eqns if id(e) not in dead]
    return program.replace(eqns=eqns)
