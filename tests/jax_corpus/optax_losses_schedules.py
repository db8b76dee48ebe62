# optax's losses and schedules as numbers
import jax.numpy as jnp
import optax

logits = jnp.array([[2.0, 1.0, 0.1], [0.5, 2.5, -1.0]])
labels = jnp.array([0, 2])
sched = optax.warmup_cosine_decay_schedule(0.0, 1.0, 3, 10, 0.1)
result = (
    optax.softmax_cross_entropy_with_integer_labels(logits, labels),
    optax.softmax_cross_entropy(logits, jnp.eye(3)[labels]),
    optax.sigmoid_binary_cross_entropy(logits, jnp.ones_like(logits) * 0.5),
    optax.l2_loss(logits, jnp.zeros_like(logits)),
    optax.huber_loss(logits, jnp.ones_like(logits)),
    jnp.array([sched(i) for i in range(0, 11, 2)]),
    optax.linear_schedule(1.0, 0.0, 4)(2),
    optax.global_norm({"a": jnp.ones(3), "b": jnp.ones(2) * 2}),
    optax.cosine_similarity(logits[0], logits[1]),
)
