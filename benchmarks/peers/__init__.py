"""Rank-side adapters for the peer systems (MPI via mpi4py, torch.distributed gloo, Horovod)."""
