"""engine_native.aligned_buffers: 64-byte aligned result views carved from one buffer, and the
buffer's reuse once nothing references it (not while a view, or anything over one, lives)."""
import numpy as np

from engine_native import aligned_buffers


def _likes():
    return [np.zeros((3, 5), np.float32), np.zeros(7, np.float64), np.zeros((0, 2), np.int8),
            np.zeros((), np.int16)]


def test_views_are_aligned_and_shaped_like_the_inputs():
    outs = aligned_buffers.aligned_outputs(_likes())
    for out, like in zip(outs, _likes()):
        assert out.shape == like.shape and out.dtype == like.dtype
        assert out.flags.c_contiguous and out.flags.writeable
        if out.size:  # numpy may give an empty view any address; no byte is read there
            assert out.ctypes.data % aligned_buffers.ALIGNMENT == 0
    # carved in order from one buffer: each starts after the previous one's padded bytes
    assert outs[1].ctypes.data - outs[0].ctypes.data == 64
    assert outs[0].base is outs[1].base


def test_a_buffer_is_reused_only_when_nothing_references_it():
    first = aligned_buffers.aligned_outputs(_likes())
    address = first[0].ctypes.data
    held = aligned_buffers.aligned_outputs(_likes())  # `first` is alive: a new buffer
    assert held[0].ctypes.data != address
    keep_one_view = first[3]
    del first
    assert aligned_buffers.aligned_outputs(_likes())[0].ctypes.data != address
    wrapped = memoryview(keep_one_view)  # anything over a view keeps the buffer too
    del keep_one_view
    assert aligned_buffers.aligned_outputs(_likes())[0].ctypes.data != address
    del wrapped
    assert aligned_buffers.aligned_outputs(_likes())[0].ctypes.data == address
    del held


def test_writes_into_a_reused_buffer_never_reach_a_live_result():
    results = aligned_buffers.aligned_outputs(_likes())
    results[0][...] = 1.0
    for _ in range(2 * aligned_buffers._MAX_BUFFERS):
        aligned_buffers.aligned_outputs(_likes())[0][...] = 7.0
    assert np.all(results[0] == 1.0)
