"""transpose and broadcast_to of 0-d values keep shape () under the reference executor."""
import numpy as np

import gcompile as gc


def test_scalar_transpose_and_broadcast_keep_shape():
    x = gc.placeholder("x", (3,))
    s = gc.reduce_sum(x)
    outputs = [gc.transpose(s), gc.broadcast_to(s, ()), gc.broadcast_to(s, (2,))]
    values = gc.NumpyExecutor(outputs).run({x: np.array([1.0, 2.0, 4.0])})
    assert [v.shape for v in values] == [(), (), (2,)]
    np.testing.assert_array_equal(values[2], [7.0, 7.0])


def test_transpose_result_is_c_contiguous():
    x = gc.placeholder("x", (2, 3))
    (t,) = gc.NumpyExecutor([gc.transpose(x)]).run({x: np.arange(6.0).reshape(2, 3)})
    assert t.flags.c_contiguous
    np.testing.assert_array_equal(t, np.arange(6.0).reshape(2, 3).T)
