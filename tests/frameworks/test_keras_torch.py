"""engine_native.keras on the torch backend, as a user runs it: one launch of ranks per world
size runs every check (importing keras costs seconds a rank) and reports them all.

Checks: model.fit with DistributedOptimizer equals single-process training on the global
batch, with one fused grouped allreduce per update (the core's metrics), also with
backward_passes_per_step, with groups=2 (two per update), with Compression.fp16 (float16
crossing the core) and on a process set with gradient_predivide_factor; and the checks every
backend runs (keras_checks): the value collectives, each callback by value, load_model (at
np 2 and 3), bad input on every rank (a second DistributedOptimizer, bad groups, a non-array
argument, mismatched dtypes) with the next op working, KerasState and the elastic callbacks,
and hvd.elastic.run's retry after a real failed collective inside fit.
"""
import os

import pytest

from frameworks import keras_checks as checks
from frameworks import keras_training as kt
from multiproc.checks import Failures
from multiproc.harness import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.keras]


def rank_torch_suite(path):
    """Every check; ``path``: where rank 0 saves the model for load_model (every rank reads
    it)."""
    hvd, keras = kt.start("torch")
    fails = Failures()
    checks.collectives(fails, hvd, keras)
    kt.fit_matches_single_process(fails, hvd, keras, "fit")
    kt.fit_matches_single_process(fails, hvd, keras, "fit, backward_passes_per_step=2", bpps=2)
    kt.fit_matches_single_process(fails, hvd, keras, "fit, groups=2", groups=2, fused=(2, 4))
    checks.fp16_fit(fails, hvd, keras, "fit")
    if hvd.size() > 2:  # ranks 0 and 1 train alone; 2 stays out
        pair = hvd.add_process_set([0, 1])
        if hvd.rank() in pair.ranks:
            kt.fit_matches_single_process(fails, hvd, keras, "fit on process set [0, 1], "
                                          "gradient_predivide_factor=2", process_set=pair,
                                          gradient_predivide_factor=2.0)
        hvd.remove_process_set(pair)
    checks.callbacks(fails, hvd, keras)
    checks.load_model(fails, hvd, keras, path)
    checks.errors(fails, hvd, keras)
    checks.elastic(fails, hvd, keras)
    return fails.raise_if_any()


@pytest.mark.parametrize("np_", [2, 3])
def test_keras_torch_backend(np_, tmp_path):
    results = run_ranks(rank_torch_suite, np_, env={"KERAS_BACKEND": "torch"},
                        args=(os.path.join(tmp_path, "model.keras"),), timeout=120)
    assert all(r.value > 20 for r in results), [r.value for r in results]
