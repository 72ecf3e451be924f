"""runtime/host_output_pool.cc (Note [Host output reuse]): a host output whose block alone is
larger than the pool's 256 MiB bound is still reused by the next op of its size, instead of
being freed on return (which made every np=4, 64 MiB allgather fault in a fresh 256 MiB
block), and smaller blocks cached beside it give way to it."""
from multiproc.harness import run_ranks

MIB = 1 << 20


def reuse():
    import resource

    import numpy as np

    import engine_native as hvd
    hvd.init()
    small = np.ones(3 * MIB // 4, np.float32)    # a 4 MiB block, cached beside the big one
    x = np.ones(300 * MIB // 4, np.float32)      # a 512 MiB block: over the bound alone
    hvd.allgather(small, name="small")           # dropped at once: now cached
    hvd.allgather(x, name="big.0")               # faults its 300 MiB in once
    # The same address could come back from a fresh mmap; page faults tell reuse apart: a
    # fresh block faults in each of its 76800 written pages again.
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = hvd.allgather(x, name="big.1")
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    ok = bool(out[0] == 1 and out[-1] == 1)
    hvd.shutdown()
    return faults, ok


def test_block_over_the_bound_is_reused():
    faults, ok = run_ranks(reuse, 1, timeout=120)[0].value
    assert ok
    assert faults < 300 * MIB // 4096 // 10, f"{faults} page faults: the 512 MiB block was not reused"
