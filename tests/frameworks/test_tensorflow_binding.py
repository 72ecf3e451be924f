"""engine_native.tensorflow on 2 and 3 ranks: every collective and dtype by value (eager and in
tf.function), process sets, program order, bad input (tensorflow_collective_checks.py), and a
custom training loop that equals single-process training on the global batch
(tensorflow_training_checks.py), the gradients through the collectives
(tensorflow_gradient_checks.py), the TF1 API in tf.compat.v1 graphs and sessions
(tensorflow_v1_checks.py) and hvd.elastic (tensorflow_elastic_checks.py: last, it
re-initializes the core).

One launch of ranks per world size runs every check (importing TensorFlow costs 5-10 s a
rank); each rank returns the list of what failed and the test shows every rank's list.
"""
import pytest

from multiproc.harness import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.tensorflow]

# Quiet logs; oneDNN off so that the reference and the distributed step sum alike.
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


def rank_checks():
    import numpy as np
    import tensorflow as tf

    import engine_native.tensorflow as hvd
    from frameworks import (tensorflow_collective_checks, tensorflow_elastic_checks,
                            tensorflow_gradient_checks, tensorflow_training_checks,
                            tensorflow_v1_checks)
    hvd.init()
    failures = []
    tensorflow_collective_checks.run_all(hvd, tf, np, failures)
    tensorflow_gradient_checks.run_all(hvd, tf, np, failures)
    tensorflow_training_checks.check_training(hvd, tf, np, failures)
    tensorflow_training_checks.check_tape_groups(hvd, tf, np, failures)
    tensorflow_training_checks.check_tape_options(hvd, tf, np, failures)
    tensorflow_v1_checks.run_all(hvd, tf, np, failures)
    tensorflow_elastic_checks.run_all(hvd, tf, np, failures)
    hvd.shutdown()
    return failures


@pytest.mark.parametrize("np_", [2, 3])
def test_tensorflow_binding(np_):
    results = run_ranks(rank_checks, np=np_, env=TF_ENV, timeout=150)
    failures = [f"rank {r.rank}: {f}" for r in results for f in r.value]
    assert not failures, "\n".join(failures)
