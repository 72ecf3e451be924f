"""Random multi-rank programs (issue #35 item 6), the bounded CI pass.

Per world size, a fixed selection of seeds (the first whose programs inject these failures in
this order) runs one program after another in the same rank processes: a program without a
failure, then an abort, a raise, a stopped rank and a killed rank, then one more program on the
survivors of the kill. Every collective's result is checked against NumPy on every rank (every
point-to-point message bit for bit), every injected failure must reach every live rank as an
exception within HVD_TIMEOUT + 1 s, and a hang is reported with the seed and each rank's step
(random_program_rank.py); at np 3 also through the torch binding. The long run, with its
figures, is benchmarks/random_programs.py.
"""
import pytest

from multiproc import random_program_batch as batch

HVD_TIMEOUT = 5.0  # the long run's 3 s, with room for two busy xdist workers on two cores
KINDS = [None, "abort", "raise", "stop", "kill", None]


@pytest.mark.parametrize("size, api", [(2, "numpy"), (3, "numpy"), (4, "numpy"), (3, "torch")],
                         ids=["np2", "np3", "np4", "np3-torch"])
def test_random_programs(size, api):
    """``torch``: the same programs and checks through engine_native.torch, the binding most
    users call (random_program_torch.py); np 3 only, for the time budget."""
    seeds = batch.plan_seeds(size, KINDS)
    result = batch.run_seeds(seeds, size, HVD_TIMEOUT, api=api)
    assert not result.problems, "\n\n".join(result.problems)
    got = [(o.seed, o.np, o.failure) for o in result.outcomes]
    sizes = [size] * (len(KINDS) - 1) + [size - 1]  # the last runs on the kill's survivors
    assert got == list(zip(seeds, sizes, KINDS)), f"programs run: {got}"
