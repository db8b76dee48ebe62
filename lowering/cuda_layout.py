"""GEMM operand layouts for the CUDA backend: a transposed operand of a dot_general
(`x @ w.T` as in PyTorch's Linear, `q @ k.transpose(0, 1, 3, 2)` in a hand-written
attention) is read by cuBLAS in place (OP_T) instead of being materialized by a
transpose kernel first.

`fold_operand_transposes` rewrites `dot_general(transpose(y, perm), ...)` into a
dot_general of `y` itself with its batch / contracting dimensions renumbered, when
that leaves the output unchanged (the operand's free dimensions keep their order)
and cuBLAS can stride over the result (cuda_gemm.dims: layout "N" or "T").
"""

from fflow.lowering import cuda_gemm, passes


def fold_operand_transposes(program):
    transposes = {e.outputs[0]: e for e in program.eqns if e.primitive.name == "transpose"}
    if not transposes:
        return program
    eqns, changed = [], False
    for e in program.eqns:
        if e.primitive.name == "dot_general":
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
