"""JAX's `jax.example_libraries` (`stax`, `optimizers`): the small neural-network and
optimizer libraries JAX's own examples (mnist_classifier.py, mnist_vae.py) are written
with, over fflow."""
