# stop_gradient in a TD(0) update (from the stop_gradient section of the autodiff docs)
import jax
import jax.numpy as jnp

value_fn = lambda theta, state: jnp.dot(theta, state)
theta = jnp.array([0.1, -0.1, 0.0])
s_tm1 = jnp.array([1.0, 2.0, -1.0])
r_t = jnp.array(1.0)
s_t = jnp.array([2.0, 1.0, 0.0])


def td_loss(theta, s_tm1, r_t, s_t):
    v_tm1 = value_fn(theta, s_tm1)
    target = r_t + value_fn(theta, s_t)
    return -0.5 * ((jax.lax.stop_gradient(target) - v_tm1) ** 2)


td_update = jax.grad(td_loss)
straight_through = jax.grad(lambda x: jnp.sum(x + jax.lax.stop_gradient(jnp.round(x) - x)))
result = (td_update(theta, s_tm1, r_t, s_t), straight_through(jnp.array([0.2, 1.7])))
