"""Horovod's build queries (``gloo_built``, ``nccl_built``, ...), the same for every binding:
what this installation can run. The core is never compiled against Gloo, MPI, CUDA or NCCL;
MPI (``engine_native.basics.mpi_built``) only launches and bootstraps ranks, and CUDA and NCCL
are found at run time, so the answers describe what loads here, not compile-time switches."""
from engine_native import gpu


def gloo_enabled():
    """False: engine_native has its own transports, not Gloo."""
    return False


def gloo_built():
    """False: engine_native is not built with Gloo."""
    return False


def nccl_built():
    """Version code of the NCCL the core loads for CUDA tensors (e.g. 22809 for 2.28.9), or 0
    when none is usable (Horovod returns an int). Loads NCCL if it is not loaded yet; it never
    initialises CUDA. Without NCCL, CUDA collectives take the staged path."""
    return int(gpu.nccl_info()['version'])


def ddl_built():
    """False: no IBM DDL support."""
    return False


def ccl_built():
    """False: no oneCCL support."""
    return False


def cuda_built():
    """True when the core can run collectives on CUDA tensors: a usable CUDA runtime loads
    (the core is never compiled against CUDA; it finds it at run time)."""
    return bool(gpu.cuda_runtime_info()['loaded'])


def rocm_built():
    """False: no ROCm support."""
    return False
