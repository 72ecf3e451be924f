"""SyncBatchNorm: batch normalization with statistics over the whole global batch.

Forward: every rank computes per-channel count, mean and biased variance of its local batch;
one allgather of those (``sync_batch_norm.stats``) lets every rank combine them exactly
(parallel-variance formula), normalize, and update running statistics identically.
Backward: one Sum-allreduce of the per-channel sums of ``dy`` and ``dy * x_hat``
(``sync_batch_norm.grads``) gives the global terms of the batch-norm input gradient; weight
and bias gradients stay local, as in Horovod (the DistributedOptimizer averages them).
CUDA input runs both collectives on the device (engine_native.torch's CUDA path); unlike
Horovod's, CPU input is supported too (Horovod's kernel is GPU-only).
"""
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from engine_native.torch import runtime as rt
from engine_native.torch.gather_ops import allgather
from engine_native.torch.reduce_ops import allreduce_
from engine_native.torch.runtime import Sum


def _channels_view(t, ndim):
    return t.view([1, -1] + [1] * (ndim - 2))


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


class _SyncBatchNorm(torch.autograd.Function):

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        x = input.contiguous()
        compute_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        xc = x.to(compute_dtype)
        channels = x.shape[1]
        count = x.numel() // channels if channels else 0
        dims = _reduce_dims(xc)
        if count > 0:
            mean_l = xc.mean(dims)
            var_l = xc.var(dims, unbiased=False)
        else:
            mean_l = xc.new_zeros(channels)
            var_l = xc.new_zeros(channels)
        local = torch.cat([xc.new_tensor([float(count)]), mean_l, var_l]).unsqueeze(0)
        stats = allgather(local, name='sync_batch_norm.stats')
        counts = stats[:, 0:1]
        total = counts.sum()
        if total <= 0:
            raise ValueError('SyncBatchNorm: the global batch is empty')
        means = stats[:, 1:1 + channels]
        variances = stats[:, 1 + channels:]
        mean = (counts * means).sum(0) / total
        var = (counts * (variances + (means - mean) ** 2)).sum(0) / total
        invstd = torch.rsqrt(var + eps)

        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype),
                                                     alpha=momentum)
                unbiased = var * (total / (total - 1)) if total > 1 else var
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype),
                                                    alpha=momentum)

        x_hat = (xc - _channels_view(mean, x.dim())) * _channels_view(invstd, x.dim())
        out = x_hat
        if weight is not None:
            out = out * _channels_view(weight.to(compute_dtype), x.dim())
        if bias is not None:
            out = out + _channels_view(bias.to(compute_dtype), x.dim())
        ctx.save_for_backward(x_hat, weight, invstd)
        ctx.total = float(total)
        ctx.has_bias = bias is not None
        ctx.input_dtype = input.dtype
        return out.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        x_hat, weight, invstd = ctx.saved_tensors
        dy = grad_output.contiguous().to(x_hat.dtype)
        dims = _reduce_dims(dy)
        channels = x_hat.shape[1]
        sums = torch.cat([dy.sum(dims), (dy * x_hat).sum(dims)])
        grad_weight = sums[channels:].clone() if weight is not None else None
        grad_bias = sums[:channels].clone() if ctx.has_bias else None
        allreduce_(sums, op=Sum, name='sync_batch_norm.grads')
        mean_dy = _channels_view(sums[:channels] / ctx.total, dy.dim())
        mean_dy_xhat = _channels_view(sums[channels:] / ctx.total, dy.dim())
        scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
        grad_input = (dy - mean_dy - x_hat * mean_dy_xhat) * _channels_view(scale, dy.dim())
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(weight.dtype if weight is not None else dy.dtype)
        return grad_input.to(ctx.input_dtype), grad_weight, grad_bias, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Applies synchronous version of N-dimensional BatchNorm.

    In this version, normalization parameters are synchronized across workers during forward
    pass. This is very useful in situations where each GPU can fit a very small number of
    examples.

    See https://pytorch.org/docs/stable/nn.html#batchnorm2d for more details about BatchNorm.

    Parameters
    ----------
    num_features : int
        Number of channels ``C`` of an input of shape ``(N, C, ...)``.
    eps : float
        Added to the variance for numerical stability.
    momentum : float or None
        Running-statistics update factor; None means a cumulative moving average.
    affine : bool
        Learnable per-channel weight and bias.
    track_running_stats : bool
        Keep running mean and variance (used in eval mode).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f'expected at least 2D input (got {input.dim()}D input)')

    def _run_bn(self, input, factor, training):
        return torch.nn.functional.batch_norm(
            input, self.running_mean, self.running_var, self.weight, self.bias,
            training, factor, self.eps)

    def forward(self, input):
        self._check_input_dim(input)

        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)

        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats:
            return self._run_bn(input, factor, False)
        if rt.size() == 1:
            return self._run_bn(input, factor, True)
        return _SyncBatchNorm.apply(input, self.weight, self.bias,
                                    self.running_mean if self.training else None,
                                    self.running_var if self.training else None,
                                    self.eps, factor)
