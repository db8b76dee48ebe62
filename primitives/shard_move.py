"""`shard_move`: a value moving to another placement inside one sharded program.

`with_sbp(x, sbp, placement=other)` inside `shard` binds it; `shard` then cuts the
program at its moves into one sharded program per placement
(transforms/shard_mixed.py), and the move runs as a point-to-point transfer of
global arrays (transforms/shard_transfer.py). Params: `dst`/`sbp` the target
placement and SBP; `src`/`src_sbp` where the value comes from (None while tracing,
filled in when the program is cut). On local values (e.g. inside a jitted
program) it is the identity: a local value is the whole logical value.

It is linear: the tangent moves the same way, and the cotangent moves back to
`src` in `src_sbp`'s dual (a partial sum's cotangent is broadcast).
"""

from fflow.transforms import vmap as _vmap
from fflow.transforms.autodiff import Zero, deflinear
from fflow.transforms.shard_rules import def_broadcast_only

from fflow.core import Primitive, ShapedArray
from fflow.sbp import B

shard_move_p = Primitive("shard_move")
shard_move_p.amp_class = "follow"


@shard_move_p.def_impl
def _shard_move_impl(x, *, dst, sbp, src=None, src_sbp=None):
    return x


@shard_move_p.def_abstract_eval
def _shard_move_abstract_eval(x, *, dst, sbp, src=None, src_sbp=None):
    return ShapedArray(x.shape, x.dtype, x.weak_type)


def _shard_move_transpose(ct, x, *, dst, sbp, src=None, src_sbp=None):
    if type(ct) is Zero:
        return [None]
    if src is None:
        return [ct]
    back = tuple(B if s.is_partial() else s for s in src_sbp)
    return [shard_move_p.bind(ct, dst=src, sbp=back, src=dst, src_sbp=sbp)]


deflinear(shard_move_p, _shard_move_transpose)

_vmap.no_batch_rule[shard_move_p] = (
    "a move between placements runs on global arrays; vmap the function inside shard instead"
)
def_broadcast_only(
    shard_move_p, "shard cuts its program at moves between placements; it is never planned"
)
