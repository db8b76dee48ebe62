"""benchmarks/jax_hlo.py (bench_planner's JAX column) on HLO lines as JAX 0.10.2 prints
them after compiling the Megatron step: counts per op and per carried value, bytes in
fflow's convention (summed over devices: all-reduce 2(p-1) x the array, all-gather
(p-1) x its result, reduce-scatter (p-1)p x its result), worked out by hand below."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
from jax_hlo import counts_text, hlo_collectives  # noqa: E402

ONE_D = """
  %all-reduce = f32[4,128,256]{2,1,0} all-reduce(%bitcast.9), channel_id=1, replica_groups=mesh['axis_0'=1,'axis_1'=1,'axis_2'=4] {'axis_2'}, use_global_device_ids=true, to_apply=%add.clone
  %wrapped_add = f32[4,128,256]{2,1,0} fusion(%param, %all-reduce), kind=kLoop, calls=%wrapped_add_computation
  %all-reduce.6 = (f32[4,128,256]{2,1,0}, f32[4,128,256]{2,1,0}, f32[4,128,256]{2,1,0}) all-reduce(%bitcast.34, %bitcast.26, %bitcast.32), channel_id=6, replica_groups=mesh['axis_0'=1,'axis_1'=1,'axis_2'=4] {'axis_2'}, use_global_device_ids=true
  %get-tuple-element = f32[4,128,256]{2,1,0} get-tuple-element(%all-reduce.6), index=0
"""  # noqa: E501

TWO_D = """
  %all-reduce = f32[2,128,256]{2,1,0} all-reduce(%bitcast.5), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add.clone
  %all-reduce.17 = (f32[], f32[256]{0}, f32[256]{0}, /*index=5*/f32[512,256]{1,0}) all-reduce(%a, %b, %c, %d), channel_id=7, replica_groups={{0,2},{1,3}}, use_global_device_ids=true
  %all-gather = f32[8,64]{1,0} all-gather(f32[4,64]{1,0} %x), channel_id=8, replica_groups={{0,1},{2,3}}, dimensions={0}
  %ag-start = (f32[4,64]{1,0}, f32[8,64]{1,0}) all-gather-start(f32[4,64]{1,0} %y), channel_id=9, replica_groups=[2,2]<=[4], dimensions={0}
  %reduce-scatter = bf16[2,64]{1,0} reduce-scatter(bf16[4,64]{1,0} %z), channel_id=10, replica_groups={{0,1},{2,3}}, dimensions={0}
"""  # noqa: E501


def test_one_d_megatron_hlo():
    counts, nbytes = hlo_collectives(ONE_D, 4)
    act = 4 * 128 * 256 * 4  # one (b, t, d) f32 activation
    assert counts == {"all-reduce": [2, 4]}  # one op of one value, one of three (q, k, v)
    assert nbytes == 4 * 2 * 3 * act  # four values on one group of p = 4
    assert counts_text(counts) == "all-reduce:2 (4 values)"


def test_two_d_groups_tuples_and_async_forms():
    counts, nbytes = hlo_collectives(TWO_D, 4)
    assert counts == {
        "all-reduce": [2, 5],
        "all-gather": [2, 2],
        "reduce-scatter": [1, 1],
    }
    g, p = 2, 2  # two groups of two devices
    ar = (2 * 128 * 256 * 4 + 4 + 256 * 4 * 2 + 512 * 256 * 4) * g * 2 * (p - 1)
    ag = 2 * (8 * 64 * 4) * g * (p - 1)  # (the async form counted by its result only)
    rs = 2 * 64 * 2 * g * (p - 1) * p
    assert nbytes == ar + ag + rs
