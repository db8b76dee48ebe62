"""`jax.example_libraries.optimizers`: optimizers as `(init_fun, update_fun, get_params)`.

`opt_state = init_fun(params)`, `opt_state = update_fun(step, grads, opt_state)`,
`params = get_params(opt_state)`; params and grads are pytrees, and the state is a
pytree too (it passes through jit). Step sizes are numbers or schedules `step -> size`.

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow.example_libraries import optimizers
    >>> init, update, get_params = optimizers.sgd(0.1)
    >>> state = update(0, {"w": jnp.ones(2)}, init({"w": jnp.zeros(2)}))
    >>> get_params(state)["w"].tolist()
    [-0.10000000149011612, -0.10000000149011612]
"""

import functools

import fflow.numpy as jnp
from fflow.tree_util import register_pytree_node, tree_flatten, tree_map, tree_unflatten


class OptimizerState:
    """The per-leaf states of an optimizer and the parameters' tree structure."""

    def __init__(self, states, treedef):
        self.states, self.treedef = states, treedef


register_pytree_node(
    OptimizerState, lambda s: ((s.states,), s.treedef), lambda t, c: OptimizerState(c[0], t)
)


def optimizer(opt_maker):
    """Lift `init(x) / update(i, g, state) / get(state)` on one array to pytrees."""

    @functools.wraps(opt_maker)
    def tree_opt_maker(*args, **kwargs):
        init, update, get_params = opt_maker(*args, **kwargs)

        def tree_init(x0_tree):
            leaves, treedef = tree_flatten(x0_tree)
            return OptimizerState([init(x0) for x0 in leaves], treedef)

        def tree_update(i, grad_tree, opt_state):
            grads, treedef = tree_flatten(grad_tree)
            if treedef != opt_state.treedef:
                raise TypeError(
                    f"optimizer update: the gradient tree {treedef} is not the parameters' "
                    f"tree {opt_state.treedef}. Fix: take grads of the params get_params gives."
                )
            states = [update(i, g, s) for g, s in zip(grads, opt_state.states)]
            return OptimizerState(states, treedef)

        def tree_get_params(opt_state):
            return tree_unflatten(opt_state.treedef, [get_params(s) for s in opt_state.states])

        return tree_init, tree_update, tree_get_params

    return tree_opt_maker


def constant(step_size):
    return lambda i: step_size


def exponential_decay(step_size, decay_steps, decay_rate):
    return lambda i: step_size * decay_rate ** (i / decay_steps)


def inverse_time_decay(step_size, decay_steps, decay_rate, staircase=False):
    if staircase:
        return lambda i: step_size / (1 + decay_rate * jnp.floor(i / decay_steps))
    return lambda i: step_size / (1 + decay_rate * i / decay_steps)


def polynomial_decay(step_size, decay_steps, final_step_size, power=1.0):
    def schedule(step_num):
        step_num = jnp.minimum(step_num, decay_steps)
        step_mult = (1 - step_num / decay_steps) ** power
        return step_mult * (step_size - final_step_size) + final_step_size

    return schedule


def piecewise_constant(boundaries, values):
    boundaries, values = jnp.array(boundaries), jnp.array(values)
    return lambda i: values[jnp.sum(i > boundaries)]


def make_schedule(scalar_or_schedule):
    return scalar_or_schedule if callable(scalar_or_schedule) else constant(scalar_or_schedule)


@optimizer
def sgd(step_size):
    step_size = make_schedule(step_size)
    return (lambda x0: x0), (lambda i, g, x: x - step_size(i) * g), (lambda x: x)


@optimizer
def momentum(step_size, mass):
    step_size = make_schedule(step_size)

    def update(i, g, state):
        x, velocity = state
        velocity = mass * velocity + g
        return x - step_size(i) * velocity, velocity

    return (lambda x0: (x0, jnp.zeros_like(x0))), update, (lambda state: state[0])


@optimizer
def nesterov(step_size, mass):
    step_size = make_schedule(step_size)

    def update(i, g, state):
        x, velocity = state
        velocity = mass * velocity + g
        return x - step_size(i) * (mass * velocity + g), velocity

    return (lambda x0: (x0, jnp.zeros_like(x0))), update, (lambda state: state[0])


@optimizer
def adagrad(step_size, momentum=0.9):
    step_size = make_schedule(step_size)

    def init(x0):
        return x0, jnp.zeros_like(x0), jnp.zeros_like(x0)

    def update(i, g, state):
        x, g_sq, m = state
        g_sq = g_sq + jnp.square(g)
        g_sq_inv_sqrt = jnp.where(g_sq > 0, 1.0 / jnp.sqrt(g_sq), 0.0)
        m = (1.0 - momentum) * (g * g_sq_inv_sqrt) + momentum * m
        return x - step_size(i) * m, g_sq, m

    return init, update, (lambda state: state[0])


@optimizer
def rmsprop(step_size, gamma=0.9, eps=1e-8):
    step_size = make_schedule(step_size)

    def update(i, g, state):
        x, avg_sq_grad = state
        avg_sq_grad = avg_sq_grad * gamma + jnp.square(g) * (1.0 - gamma)
        return x - step_size(i) * g / jnp.sqrt(avg_sq_grad + eps), avg_sq_grad

    return (lambda x0: (x0, jnp.zeros_like(x0))), update, (lambda state: state[0])


@optimizer
def adam(step_size, b1=0.9, b2=0.999, eps=1e-8):
    step_size = make_schedule(step_size)

    def update(i, g, state):
        x, m, v = state
        m = (1 - b1) * g + b1 * m
        v = (1 - b2) * jnp.square(g) + b2 * v
        mhat = m / (1 - jnp.asarray(b1, m.dtype) ** (i + 1))
        vhat = v / (1 - jnp.asarray(b2, m.dtype) ** (i + 1))
        return x - step_size(i) * mhat / (jnp.sqrt(vhat) + eps), m, v

    def init(x0):
        return x0, jnp.zeros_like(x0), jnp.zeros_like(x0)

    return init, update, (lambda state: state[0])


def l2_norm(tree):
    leaves, _ = tree_flatten(tree)
    return jnp.sqrt(sum(jnp.vdot(x, x) for x in leaves))


def clip_grads(grad_tree, max_norm):
    norm = l2_norm(grad_tree)
    return tree_map(lambda g: jnp.where(norm < max_norm, g, g * (max_norm / norm)), grad_tree)
