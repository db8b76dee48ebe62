# A neural ODE by hand: an RK4 integrator in lax.scan, gradients of a trajectory loss
# through the solver with respect to the vector field's parameters
import jax
import jax.numpy as jnp


def field(params, y, t):
    h = jnp.tanh(params["w1"] @ y + params["b1"] + t)
    return params["w2"] @ h


def rk4(params, y0, ts):
    def step(y, t_pair):
        t0, t1 = t_pair
        dt = t1 - t0
        k1 = field(params, y, t0)
        k2 = field(params, y + dt * k1 / 2, t0 + dt / 2)
        k3 = field(params, y + dt * k2 / 2, t0 + dt / 2)
        k4 = field(params, y + dt * k3, t1)
        y = y + dt * (k1 + 2 * k2 + 2 * k3 + k4) / 6
        return y, y

    _, ys = jax.lax.scan(step, y0, (ts[:-1], ts[1:]))
    return jnp.concatenate([y0[None], ys])


key = jax.random.PRNGKey(5)
k1, k2 = jax.random.split(key)
params = {
    "w1": jax.random.normal(k1, (8, 2)) * 0.5,
    "b1": jnp.zeros(8),
    "w2": jax.random.normal(k2, (2, 8)) * 0.5,
}
ts = jnp.linspace(0.0, 1.0, 11)
y0 = jnp.array([1.0, 0.0])
target = jnp.stack([jnp.cos(ts), -jnp.sin(ts)], axis=1)


def loss(params):
    return jnp.mean((rk4(params, y0, ts) - target) ** 2)


g = jax.jit(jax.grad(loss))(params)
traj = jax.jit(rk4)(params, y0, ts)
batched = jax.vmap(rk4, in_axes=(None, 0, None))(params, jnp.eye(2), ts)
result = (traj[::5], loss(params), g["w2"][:, :3], g["b1"][:3], batched[:, -1])
