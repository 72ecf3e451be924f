"""The framework-neutral compressors (engine_native.compression) with numpy hooks, and each
binding's FP16Compressor filled in (torch here; keras and tensorflow in tests/frameworks)."""
import numpy as np
import pytest

from engine_native import compression


class NumpyFP16(compression.FP16Compressor):
    float16 = np.float16

    @staticmethod
    def wider_float_dtype(tensor):
        kind = tensor.dtype
        return kind if kind.kind == "f" and kind != np.float16 else None

    @staticmethod
    def cast(tensor, dtype):
        return tensor.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fp16_sends_float16_and_restores_the_dtype(dtype):
    x = np.arange(4, dtype=dtype) / 3
    sent, ctx = NumpyFP16.compress(x)
    assert sent.dtype == np.float16
    back = NumpyFP16.decompress(sent, ctx)
    assert back.dtype == dtype and np.allclose(back, x, atol=1e-3)


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.bool_])
def test_fp16_passes_other_dtypes_through(dtype):
    x = np.ones(3, dtype=dtype)
    sent, ctx = NumpyFP16.compress(x)
    assert sent is x and NumpyFP16.decompress(sent, ctx) is x


def test_none_and_the_interface():
    x = np.ones(2)
    assert compression.Compression.none.compress(x) == (x, None)
    assert compression.NoneCompressor.decompress(x, None) is x
    with pytest.raises(NotImplementedError):
        compression.Compressor.compress(x)


def test_torch_binding_fills_the_hooks():
    torch = pytest.importorskip("torch")
    from engine_native.torch.compression import Compression, Compressor
    assert issubclass(Compression.fp16, Compressor)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.ones(3, dtype=dtype, requires_grad=True)
        sent, ctx = Compression.fp16.compress(x)
        assert sent.dtype == torch.float16
        back = Compression.fp16.decompress(sent, ctx)
        assert back.dtype == dtype
        back.sum().backward()  # the casts stay differentiable
        assert torch.equal(x.grad, torch.ones(3, dtype=dtype))
    half = torch.ones(2, dtype=torch.float16)
    assert Compression.fp16.compress(half)[0] is half
