"""Device sort for lines longer than a block's shared memory (cuda_scatter_sort.SORT_MAX):
a bitonic sort of each line's indices in a global buffer, in passes.

The line's indices (padded to a power of two P, the padding sorting last) are
sorted with the comparison of the short sort (keys lexicographic, NaN last, the
original index breaking ties: stable). Bitonic stages whose partner is within a
segment of SEG indices run in shared memory, one kernel for all of them per stage
size; wider partners take one kernel per (stage, distance) pass over global
memory. Then every operand is gathered through the sorted indices. A line of 2^20
is 1 + 9 segment kernels + 45 global passes + 1 gather (all captured in one CUDA
graph on a GPU).
"""

import numpy as np
from fflow.lowering.cuda_kernels import KernelSource, size_of
from fflow.lowering.cuda_scatter_sort import after_helper, line_offset

from fflow.core import ShapedArray, Var

SEG = 2048  # indices sorted per block in shared memory
BLOCK = 1024
MAX_LENGTH = 1 << 24  # int indices; longer lines sort on the host
MAX_LINES = 65535  # gridDim.y


def supported(eqn):
    shape = eqn.inputs[0].aval.shape
    length = shape[eqn.params["dimension"]]
    return SEG < length <= MAX_LENGTH and size_of(shape) // length <= MAX_LINES


def sort_kernels(eqn, wide=False):
    """The kernels of a device sort of every line along eqn's dimension."""
    ops = eqn.inputs
    shape = ops[0].aval.shape
    dim = eqn.params["dimension"]
    length = shape[dim]
    post = size_of(shape[dim + 1 :])
    nlines = size_of(shape) // length
    p2 = 1
    while p2 < length:
        p2 *= 2
    perm = Var(ShapedArray((nlines, p2), np.int32))
    nseg = p2 // SEG

    def source(kind):
        k = KernelSource(kind, {}, wide)
        names = [k.input(v) for v in ops]
        call = after_helper(k, eqn, names)
        head = [
            f"const {k.idx_t} line = blockIdx.y;",
            f"const {k.idx_t} base = {line_offset(k, length, post)};",
        ]
        return k, names, call, head

    def exchange(call, arr, i, ixj, kk):
        return [
            f"{{ const int a = {arr}[{i}], b = {arr}[{ixj}];",
            f"  const bool up = ((seg0 + {i}) & {kk}) == 0;",
            f"  if (up ? {call}a, b) : {call}b, a)) {{ {arr}[{i}] = b; {arr}[{ixj}] = a; }} }}",
        ]

    def segment_kernel(first, kk):
        """Stages within segments: all of them (first), or the distances < SEG of stage kk."""
        k, _, call, head = source("sortseg")
        p = k.output(perm)
        row = f"{p}[line * {p2}{k.lit} + seg0 + i]"
        body = head + [
            f"__shared__ int ps[{SEG}];",
            f"const int seg0 = blockIdx.x * {SEG};",
            f"for (int i = threadIdx.x; i < {SEG}; i += blockDim.x) "
            f"ps[i] = {'seg0 + i' if first else row};",
            "__syncthreads();",
        ]
        stages = (
            f"for (int kk = 2; kk <= {SEG}; kk <<= 1) {{" if first else f"{{ const int kk = {kk};"
        )
        inner = [
            f"for (int j = {'kk >> 1' if first else SEG // 2}; j > 0; j >>= 1) {{",
            f"  for (int i = threadIdx.x; i < {SEG}; i += blockDim.x) {{",
            "    const int ixj = i ^ j;",
            "    if (ixj > i)",
        ]
        inner += ["      " + ln for ln in exchange(call, "ps", "i", "ixj", "kk")]
        inner += ["  }", "  __syncthreads();", "}"]
        body += [stages] + ["  " + ln for ln in inner] + ["}"]
        body += [f"for (int i = threadIdx.x; i < {SEG}; i += blockDim.x) {row} = ps[i];"]
        return k.finish(body, (nseg, nlines), BLOCK)

    def global_pass(kk, j):
        k, _, call, head = source("sortpass")
        p = k.output(perm)
        half = p2 // 2
        body = head + [
            "const int seg0 = 0;",
            "const int t = blockIdx.x * blockDim.x + threadIdx.x;",
            f"if (t < {half}) {{",
            f"  const int i = (t / {j}) * {2 * j} + t % {j};",
            f"  int* pl = {p} + line * {p2}{k.lit};",
        ]
        body += ["  " + ln for ln in exchange(call, "pl", "i", f"i + {j}", kk)] + ["}"]
        return k.finish(body, (-(-half // 256), nlines), 256)

    def gather():
        k, names, _, head = source("sortgat")
        pin = k.input(perm)
        outs = [k.output(v) for v in eqn.outputs]
        t = k.idx_t
        body = head + [
            f"const {t} i = ({t})blockIdx.x * blockDim.x + threadIdx.x;",
            f"if (i < {length}) {{",
            f"  const {t} src = base + ({t}){pin}[line * {p2}{k.lit} + i] * {post}, "
            f"dst = base + i * {post};",
        ]
        body += [f"  {o}[dst] = {n}[src];" for o, n in zip(outs, names)] + ["}"]
        return k.finish(body, (-(-length // 256), nlines), 256)

    kernels = [segment_kernel(True, 0)]
    kk = 2 * SEG
    while kk <= p2:
        j = kk // 2
        while j >= SEG:
            kernels.append(global_pass(kk, j))
            j //= 2
        kernels.append(segment_kernel(False, kk))
        kk *= 2
    return kernels + [gather()]
