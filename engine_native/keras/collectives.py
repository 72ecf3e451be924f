"""Horovod's keras helpers on values: ``allreduce``, ``allgather``, ``broadcast``,
``reducescatter``, ``broadcast_global_variables``. A value is anything
``keras.ops.convert_to_tensor`` takes; the result is a backend tensor (see backend_glue)."""
import keras

from engine_native._dtypes import Average, Sum
from engine_native.basics import global_process_set
from engine_native.horovod_args import resolve_op
from engine_native.keras import backend_glue
from engine_native.keras.compression import Compression


def _tensor(value, op: str):
    """``value`` as a backend tensor. What ``keras.ops.convert_to_tensor`` refuses (a dict, an
    arbitrary object) is a TypeError naming the call and what it got: the backends' own errors
    differ in type and can say as little as "Invalid dtype: object" (torch). Raised before
    anything is submitted, so the ranks' next collective is unaffected."""
    try:
        return keras.ops.convert_to_tensor(value)
    except (TypeError, ValueError) as exc:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise TypeError(f"{op}(): expected a tensor, a NumPy array or a number, got "
                        f"{type(value).__name__} {shown} ({exc})") from exc


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none, process_set=global_process_set):
    """Reduce ``value`` across ranks (Average unless ``op`` says otherwise)."""
    tensor, ctx = compression.compress(_tensor(value, "allreduce"))
    reduced, = backend_glue.grouped_allreduce([tensor], resolve_op(op, average),
                                              prescale_factor, postscale_factor, process_set,
                                              name=name)
    return compression.decompress(reduced, ctx)


def allgather(value, name=None, process_set=global_process_set):
    """Every rank's ``value`` concatenated along the first dimension (sizes may differ)."""
    return backend_glue.allgather(_tensor(value, "allgather"), name, process_set)


def broadcast(value, root_rank, name=None, process_set=global_process_set):
    """``root_rank``'s ``value`` on every rank."""
    return backend_glue.broadcast(_tensor(value, "broadcast"), root_rank, name, process_set)


def reducescatter(value, name=None, op=Average, process_set=global_process_set):
    """``value`` reduced across ranks (Average or Sum), this rank's rows of dimension 0 (the
    first ``dim0 % size`` ranks get one more row, as in Horovod)."""
    if op not in (Average, Sum):  # checked here: each backend's binding has its own error type
        raise ValueError(f"reducescatter(): op {op!r} is not supported; use hvd.Average or "
                         "hvd.Sum")
    return backend_glue.reducescatter(_tensor(value, "reducescatter"), op, name, process_set)


def broadcast_variables(variables, root_rank, name=None, process_set=global_process_set):
    """Assign ``root_rank``'s values to ``variables`` (keras.Variable) on every rank."""
    prefix = name or "broadcast_variables"
    for i, variable in enumerate(variables):
        variable.assign(broadcast(variable.value, root_rank, f"{prefix}.{i}", process_set))


def broadcast_model(model, root_rank, optimizer=None):
    """Broadcast ``model``'s variables and its optimizer's (built first, so they exist)."""
    optimizer = optimizer or getattr(model, "optimizer", None)
    broadcast_variables(model.variables, root_rank, name="model")
    if optimizer is not None:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        broadcast_variables(optimizer.variables, root_rank, name="optimizer")


def broadcast_global_variables(root_rank):
    """Horovod's TF1-era call has no Keras 3 equivalent (there are no global variables)."""
    raise RuntimeError("broadcast_global_variables(): Keras 3 has no global variables; "
                       "use hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) "
                       "or hvd.broadcast_variables(model.variables, root_rank)")
