"""The random programs through ``engine_native.torch`` (random_programs.py --api torch): the
names random_program_rank.py and random_program_p2p.py call on the NumPy API, each done by the
torch binding on tensors made from the program's arrays, its results turned back into arrays,
so the same programs and checks cover the binding most users call. What the torch API does not
have, as Horovod's has not, goes to the NumPy API on the same core: ``init`` with a rank and
size, joining a process set (torch's ``join`` takes the global set only), ``abort`` and
``metrics``.
"""
from __future__ import annotations

import numpy as np
import torch

import engine_native as numpy_api
import engine_native.torch as hvd
from multiproc import checks

HorovodInternalError = hvd.HorovodInternalError
Sum, Average, Min, Max, Product = hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product
shutdown, barrier = hvd.shutdown, hvd.barrier
add_process_set, remove_process_set = hvd.add_process_set, hvd.remove_process_set
abort, metrics = numpy_api.abort, numpy_api.metrics
init = numpy_api.init  # with rank= and size=: a world the kills shrank is renumbered


def __getattr__(name):
    if name == "global_process_set":  # the current one: init() replaces it
        return hvd.global_process_set
    raise AttributeError(name)


def _ps(process_set):
    return hvd.global_process_set if process_set is None else process_set


def tensor(x: np.ndarray) -> torch.Tensor:
    """``x`` as a tensor sharing its memory (bfloat16 through its 16-bit pattern)."""
    x = np.ascontiguousarray(x) if x.ndim else x
    if x.dtype == checks.BFLOAT16:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def array(t):
    """A result back as arrays: a tensor, or a tuple or list of them."""
    if isinstance(t, (tuple, list)):
        return type(t)(array(x) for x in t)
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(checks.BFLOAT16)
    return t.numpy()


def _alltoall_result(result, process_set):
    """(output, received splits), as the NumPy API returns: torch gives the splits only when
    they were passed; an even split received output rows / set size from each rank."""
    if isinstance(result, (tuple, list)):
        return array(result[0]), array(result[1])
    out = array(result)
    k = process_set.size()
    return out, np.full(k, out.shape[0] // k if out.ndim else 0, np.int32)


class _Handle:
    """An async collective: its torch handle, and how its result becomes arrays."""

    def __init__(self, handle, convert=array):
        self.handle, self.convert = handle, convert


def synchronize(handle: _Handle):
    return handle.convert(hvd.synchronize(handle.handle))


def poll(handle: _Handle) -> bool:
    return hvd.poll(handle.handle)


def allreduce(x, op=Sum, name=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=None):
    return array(hvd.allreduce(tensor(x), op=op, name=name, prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor, process_set=_ps(process_set)))


def allreduce_async(x, op=Sum, name=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=None):
    return _Handle(hvd.allreduce_async(tensor(x), op=op, name=name,
                                       prescale_factor=prescale_factor,
                                       postscale_factor=postscale_factor,
                                       process_set=_ps(process_set)))


def grouped_allreduce(xs, op=Sum, name=None, process_set=None):
    return array(hvd.grouped_allreduce([tensor(x) for x in xs], op=op, name=name,
                                       process_set=_ps(process_set)))


def grouped_allreduce_async(xs, op=Sum, name=None, process_set=None):
    return _Handle(hvd.grouped_allreduce_async([tensor(x) for x in xs], op=op, name=name,
                                               process_set=_ps(process_set)))


def allgather(x, name=None, process_set=None):
    return array(hvd.allgather(tensor(x), name=name, process_set=_ps(process_set)))


def allgather_async(x, name=None, process_set=None):
    return _Handle(hvd.allgather_async(tensor(x), name=name, process_set=_ps(process_set)))


def broadcast(x, root, name=None, process_set=None):
    return array(hvd.broadcast(tensor(x), root, name=name, process_set=_ps(process_set)))


def broadcast_async(x, root, name=None, process_set=None):
    return _Handle(hvd.broadcast_async(tensor(x), root, name=name, process_set=_ps(process_set)))


def alltoall(x, splits=None, name=None, process_set=None):
    result = hvd.alltoall(tensor(x), splits=_splits(splits), name=name,
                          process_set=_ps(process_set))
    return _alltoall_result(result, _ps(process_set))


def alltoall_async(x, splits=None, name=None, process_set=None):
    handle = hvd.alltoall_async(tensor(x), splits=_splits(splits), name=name,
                                process_set=_ps(process_set))
    return _Handle(handle, lambda result: _alltoall_result(result, _ps(process_set)))


def _splits(splits):
    return None if splits is None else torch.tensor(splits, dtype=torch.int32)


def reducescatter(x, op=Sum, name=None, process_set=None):
    return array(hvd.reducescatter(tensor(x), op=op, name=name, process_set=_ps(process_set)))


def reducescatter_async(x, op=Sum, name=None, process_set=None):
    return _Handle(hvd.reducescatter_async(tensor(x), op=op, name=name,
                                           process_set=_ps(process_set)))


def join(process_set=None) -> int:
    if process_set is None or process_set is hvd.global_process_set:
        return hvd.join()
    return numpy_api.join(process_set)


# -- point-to-point: arrays in, arrays out; a receive into out= returns that very array ------

class _Request:
    """A send or receive in flight; a receive into ``out`` must give back that tensor, which
    then stands for ``out`` (the array it shares memory with)."""

    def __init__(self, request, out=None, out_tensor=None):
        self.request, self.out, self.out_tensor = request, out, out_tensor

    def wait(self):
        return _received(self.request.wait(), self.out, self.out_tensor)


def _received(result, out, out_tensor):
    if out is not None and result is out_tensor:
        return out
    return array(result)  # (for out=: another array, which the check reports)


def isend(x, dst, tag):
    return _Request(hvd.isend(tensor(x), dst, tag))


def irecv(src, tag, out=None):
    out_tensor = None if out is None else tensor(out)
    return _Request(hvd.irecv(src, tag, out=out_tensor), out, out_tensor)


def send(x, dst, tag):
    hvd.send(tensor(x), dst, tag)


def recv(src, tag, out=None):
    out_tensor = None if out is None else tensor(out)
    return _received(hvd.recv(src, tag, out=out_tensor), out, out_tensor)


class P2POp:
    def __init__(self, op, x, peer, tag):
        self.op, self.x, self.peer, self.tag = op, x, peer, tag


def batch_isend_irecv(ops):
    tensors = [tensor(op.x) for op in ops]
    torch_ops = [hvd.P2POp(hvd.isend if op.op is isend else hvd.irecv, t, op.peer, op.tag)
                 for op, t in zip(ops, tensors)]
    return [_Request(request) if op.op is isend else _Request(request, op.x, t)
            for op, t, request in zip(ops, tensors, hvd.batch_isend_irecv(torch_ops))]
