"""A Keras 3 training script written for engine_native.keras, run unchanged by hvdrun: a linear
model fitted with model.fit on each rank's half of the data, Horovod-style (the backend is
Keras's own choice, KERAS_BACKEND). Every rank starts from its own random weights; the
broadcast callback starts them from rank 0's and DistributedOptimizer averages the gradients,
so every rank ends at the least-squares fit of the whole data."""
import keras
import numpy as np

import engine_native.keras as hvd

hvd.init()
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 2)).astype("float32")
# noisy: each rank's half alone has another least-squares fit than the whole
y = (x @ np.array([[2.0], [-1.0]], dtype="float32") + rng.normal(size=(32, 1)) * 0.5).astype(
    "float32")
mine = slice(hvd.rank(), None, hvd.size())

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss="mse")
start = keras.ops.convert_to_numpy(model.weights[0]).ravel()
print(f"rank {hvd.rank()} of {hvd.size()}: initial weights {[round(float(w), 4) for w in start]}")
model.fit(x[mine], y[mine], epochs=60, batch_size=16, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
weights = keras.ops.convert_to_numpy(model.weights[0]).ravel()
print(f"rank {hvd.rank()} of {hvd.size()}: weights {[round(float(w), 4) for w in weights]}")
