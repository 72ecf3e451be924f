"""engine_native.aligned_buffers: 64-byte aligned result views carved in order from one
buffer, each call's views independent of every other call's."""
import numpy as np
import pytest

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


def test_writes_into_later_outputs_never_reach_a_live_result():
    results = aligned_buffers.aligned_outputs(_likes())
    results[0][...] = 1.0
    results[3][...] = 5
    for _ in range(8):
        later = aligned_buffers.aligned_outputs(_likes())
        later[0][...] = 7.0
        later[3][...] = 9
    assert np.all(results[0] == 1.0) and results[3] == 5


def test_a_numpy_scalar_gets_a_zero_dimensional_view():
    """tf.numpy_function hands a 0-d tensor over as a numpy scalar, not an array."""
    out, = aligned_buffers.aligned_outputs((np.float32(2.0),))
    assert out.shape == () and out.dtype == np.float32 and out.flags.writeable


class _Like:
    """Something with a dtype and a shape whose `dtype` getter runs `effect` first."""

    def __init__(self, effect):
        self._effect = effect

    @property
    def dtype(self):
        self._effect()
        return np.dtype(np.float32)

    shape = (2,)


def test_an_interrupt_in_an_items_attribute_is_not_swallowed():
    def interrupt():
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        aligned_buffers.aligned_outputs([_Like(interrupt)])
    with pytest.raises(TypeError, match="no plain"):  # an Exception still means "no dtype"
        aligned_buffers.aligned_outputs([_Like(lambda: 1 / 0)])


def test_items_are_read_from_a_snapshot_not_the_callers_list():
    """A getter that empties the list must not make the carving read past its end."""
    likes = []
    likes += [_Like(likes.clear), np.zeros(5, np.int64)]
    outs = aligned_buffers.aligned_outputs(likes)
    assert [(o.shape, o.dtype) for o in outs] == [((2,), np.float32), ((5,), np.int64)]


def test_a_list_subclass_or_a_generator_is_taken_as_a_list():
    class Params(list):
        pass

    for likes in (Params(_likes()), (like for like in _likes())):
        outs = aligned_buffers.aligned_outputs(likes)
        assert [o.shape for o in outs] == [like.shape for like in _likes()]
