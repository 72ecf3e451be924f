"""A JAX training script written for engine_native.jax, run unchanged by hvdrun: a linear
model fitted with optax, gradients averaged across ranks inside a jitted step."""
import jax
import jax.numpy as jnp
import optax

import engine_native.jax as hvd

hvd.init()
key = jax.random.PRNGKey(0)
X = jax.random.normal(key, (64, 3))
y = X @ jnp.array([1.0, -2.0, 0.5])
mine = slice(hvd.rank() * 64 // hvd.size(), (hvd.rank() + 1) * 64 // hvd.size())
params = hvd.broadcast_parameters(jnp.full(3, float(hvd.rank())), root_rank=0)
tx = hvd.DistributedGradientTransformation(optax.sgd(0.1))
state = tx.init(params)


@jax.jit
def step(params, state, x, y):
    grads = jax.grad(lambda p: jnp.mean((x @ p - y) ** 2))(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state


for _ in range(200):
    params, state = step(params, state, X[mine], y[mine])
print(f"rank {hvd.rank()} of {hvd.size()}: weights {[round(float(w), 3) for w in params]}")
