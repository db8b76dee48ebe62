"""Golden strings of the program printer (make_jaxpr output, JAX style): constvars,
literals, params, dtypes, multiple and pytree outputs, nested programs, and the
typechecker accepting every printed program."""

import numpy as np
import pytest

import fflow
from fflow import lax
from fflow.typecheck import check_program

C = np.arange(3.0, dtype=np.float32)
F1 = np.float32(1.0)

GOLDEN = {
    "unary_chain": (
        lambda x: lax.sin(lax.cos(x)),
        (F1,),
        "{ lambda ; a:f32[]. let b:f32[] = cos a; c:f32[] = sin b in (c,) }",
    ),
    "constvar_and_literal": (
        lambda x: lax.add(lax.mul(x, C), 1.0),
        (np.ones(3, np.float32),),
        "{ lambda a:f32[3]; b:f32[3]. let\n"
        "    c:f32[3] = mul b a\n"
        "    d:f32[3] = broadcast_in_dim[broadcast_dimensions=() shape=(3,)] 1.0:f32[]\n"
        "    e:f32[3] = add c d\n"
        "  in (e,) }",
    ),
    "scalar_literal": (
        lambda x: lax.mul(x, 3.0),
        (F1,),
        "{ lambda ; a:f32[]. let b:f32[] = mul a 3.0:f32[] in (b,) }",
    ),
    "multiple_outputs": (
        lambda x, y: (lax.add(x, y), lax.mul(x, y)),
        (F1, np.float32(2.0)),
        "{ lambda ; a:f32[] b:f32[]. let c:f32[] = add a b; d:f32[] = mul a b in (c, d) }",
    ),
    "params": (
        lambda x: lax.reduce_sum(lax.transpose(x, (1, 0)), (0,)),
        (np.ones((2, 3), np.float32),),
        "{ lambda ; a:f32[2,3]. let\n"
        "    b:f32[3,2] = transpose[permutation=(1, 0)] a\n"
        "    c:f32[2] = reduce_sum[axes=(0,)] b\n"
        "  in (c,) }",
    ),
    "dtypes": (
        lambda x: lax.convert_element_type(x, np.int32),
        (np.ones(2, np.float16),),
        "{ lambda ; a:f16[2]. let b:i32[2] = convert_element_type[new_dtype=i32 weak_type=False] a"
        " in (b,) }",
    ),
    "dot": (
        lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ()))),
        (np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)),
        "{ lambda ; a:f32[2,3] b:f32[3,4]. let\n"
        "    c:f32[2,4] = dot_general[dimension_numbers=(((1,), (0,)), ((), ())) "
        "preferred_element_type=None] a b\n"
        "  in (c,) }",
    ),
    "identity": (lambda x: x, (np.ones(2, np.float32),), "{ lambda ; a:f32[2]. let in (a,) }"),
    "pytree_out_sorted_keys": (
        lambda x: {"b": x, "a": [lax.cos(x)]},
        (F1,),
        "{ lambda ; a:f32[]. let b:f32[] = cos a in (b, a) }",
    ),
    "bool_and_int": (
        lambda x, i: (lax.gt(x, 0.0), lax.add(i, 1)),
        (F1, np.int32(2)),
        "{ lambda ; a:f32[] b:i32[]. let c:bool[] = gt a 0.0:f32[]; d:i32[] = add b 1:i32[]"
        " in (c, d) }",
    ),
    "grad": (
        fflow.grad(lambda x: lax.mul(lax.sin(x), x)),
        (F1,),
        "{ lambda ; a:f32[]. let\n"
        "    b:f32[] = sin a\n"
        "    c:f32[] = cos a\n"
        "    d:f32[] = mul b a\n"
        "    e:f32[] = mul b 1.0:f32[]\n"
        "    f:f32[] = mul 1.0:f32[] a\n"
        "    g:f32[] = mul f c\n"
        "    h:f32[] = add e g\n"
        "  in (h,) }",
    ),
    "nested_checkpoint": (
        fflow.checkpoint(lambda x: lax.sin(lax.mul(x, C))),
        (np.ones(3, np.float32),),
        "{ lambda a:f32[3]; b:f32[3]. let\n"
        "    c:f32[3] = checkpoint[\n"
        "      policy=None\n"
        "      prevent_cse=True\n"
        "      program={ lambda ; d:f32[3] e:f32[3]. let\n"
        "          f:f32[3] = mul e d\n"
        "          g:f32[3] = sin f\n"
        "        in (g,) }\n"
        "    ] a b\n"
        "  in (c,) }",
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden(name):
    f, args, expected = GOLDEN[name]
    program = fflow.make_jaxpr(f)(*args)
    assert str(program) == expected
    assert program.pretty_print() == expected
    check_program(program)


def test_long_programs_name_variables_past_z():
    def f(x):
        for _ in range(30):
            x = lax.sin(x)
        return x

    text = str(fflow.make_jaxpr(f)(F1))
    lines = text.splitlines()
    assert lines[0] == "{ lambda ; a:f32[]. let"
    assert lines[1] == "    b:f32[] = sin a"
    assert "    aa:f32[] = sin z" in lines
    assert lines[-1] == "  in (ae,) }"
    assert len(lines) == 32


def test_custom_jvp_printed_with_rule_name_and_nested_program():
    @fflow.custom_jvp
    def f(x):
        return lax.sin(x)

    @f.defjvp
    def f_rule(primals, tangents):
        return f(primals[0]), tangents[0]

    program = fflow.make_jaxpr(f)(F1)
    check_program(program)
    assert str(program) == (
        "{ lambda ; a:f32[]. let\n"
        "    b:f32[] = custom_jvp_call[\n"
        "      fun=f\n"
        "      jvp=f_rule\n"
        "      num_consts=0\n"
        "      num_nondiff=0\n"
        "      program={ lambda ; c:f32[]. let\n"
        "          d:f32[] = sin c\n"
        "        in (d,) }\n"
        "    ] a\n"
        "  in (b,) }"
    )


def test_printing_is_deterministic_and_independent_of_var_ids():
    f = lambda x: lax.add(lax.exp(x), lax.log(x))  # noqa: E731
    a = str(fflow.make_jaxpr(f)(F1))
    fflow.make_jaxpr(lambda x: lax.sin(x))(F1)  # allocates more Var ids
    assert str(fflow.make_jaxpr(f)(F1)) == a
