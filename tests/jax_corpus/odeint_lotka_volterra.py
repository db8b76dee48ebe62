# jax.experimental.ode.odeint on Lotka-Volterra (the JAX docs' example): the solution and
# its gradient with respect to a parameter through the adjoint
import jax
import jax.numpy as jnp
from jax.experimental.ode import odeint


def lv(y, t, a, b, c, d):
    prey, pred = y
    return jnp.stack([a * prey - b * prey * pred, c * prey * pred - d * pred])


y0 = jnp.array([1.0, 0.5])
ts = jnp.linspace(0.0, 2.0, 5)
ys = odeint(lv, y0, ts, 1.0, 0.5, 0.3, 0.8, rtol=1e-6, atol=1e-6)
g = jax.grad(lambda a: odeint(lv, y0, ts, a, 0.5, 0.3, 0.8, rtol=1e-6, atol=1e-6)[-1, 0])(1.0)
result = (ys, g)
