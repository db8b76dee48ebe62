"""`jax.scipy.integrate.trapezoid` (the trapezoid rule, `fflow.numpy.trapezoid`)."""

from fflow.numpy import trapezoid

__all__ = ["trapezoid"]
