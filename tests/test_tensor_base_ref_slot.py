"""runtime.Tensor's `_base_ref` is a slot (native code reads it at its offset on every Function<T> call,
include/opbuilder/detail/call_rules.h ReadBaseRefSlot). A slot has no class default, so every way a Tensor
is made must set it: one that did not would fail the next op that reads it with an AttributeError."""
import copy
import pickle

import numpy as np
import pytest

import runtime as rt
from op_util import CUSTOM_SRC
from runtime import Parameter, Tensor, ops


def _no_view(t):
    assert t._base_ref is None


def test_the_slot_is_declared_once_on_tensor():
    assert "_base_ref" in Tensor.__slots__ and type(Tensor.__dict__["_base_ref"]).__name__ == "member_descriptor"


def test_every_python_way_of_making_a_tensor_sets_it():
    x = Tensor(np.arange(6.0), requires_grad=True)
    made = [x, Parameter(np.ones(2)), Tensor._from_array(np.ones(2)), x.detach(), rt.from_numpy(np.ones(3)),
            x * 2, x + 1.0, ops.sum(x), copy.copy(x), copy.deepcopy(x), pickle.loads(pickle.dumps(x))]
    for t in made:
        _no_view(t)
    g, = rt.autograd.grad((x * x).sum(), x)
    _no_view(g)
    v = (x * 1)[1:3]
    assert v._base_ref is not None and v._base_ref() is not None  # a view knows its base


@pytest.mark.build  # compiles custom_src/function_ops.cpp and an aot kernel (tests/build_guard.py)
def test_tensors_made_by_native_code_set_it(my_ops):
    x, y = Tensor(np.ones(3)), Tensor(np.ones(3) * 2, requires_grad=True)
    _no_view(my_ops.mul(x, y))  # runtime_bridge.h NewPyTensor
    add = ops.Custom(f"{CUSTOM_SRC / 'aot_add.cpp'}:CustomAdd", out_shape=[3], out_dtype=rt.float32,
                     func_type="aot")
    a = Tensor(np.ones(3, np.float32))
    _no_view(add(a, a))  # runtime/ops/aot_call.cpp Wrap
    assert np.array_equal(add(a, a).asnumpy(), np.full(3, 2, np.float32))


# `_data` is a slot too (runtime_bridge.h DataOf, NewPyTensor): read and set at its offset, so a tensor an
# op returns needs no instance dict.

def test_data_is_a_slot_and_every_way_of_making_a_tensor_sets_it():
    assert "_data" in Tensor.__slots__ and type(Tensor.__dict__["_data"]).__name__ == "member_descriptor"
    x = Tensor(np.arange(6.0), requires_grad=True)
    for t in (x, Parameter(np.ones(2)), x.detach(), x * 2, copy.copy(x), copy.deepcopy(x),
              pickle.loads(pickle.dumps(x)), (x * 1)[1:3]):
        assert isinstance(t._data, np.ndarray)
    assert np.array_equal(pickle.loads(pickle.dumps(x))._data, x._data)
    assert copy.deepcopy(x)._data is not x._data and copy.copy(x)._data is x._data


@pytest.mark.build  # compiles custom_src/function_ops.cpp (tests/build_guard.py)
def test_native_code_reads_and_sets_the_data_slot(my_ops):
    class Sub(Tensor):
        pass
    x, y = Sub(np.ones(3)), Tensor(np.arange(3.0), requires_grad=True)
    z = my_ops.mul(x, y)
    assert type(z) is Tensor and np.array_equal(z.asnumpy(), np.arange(3.0))
    assert "_data" not in vars(z)  # set in its slot, not in a dict
    z.sum().backward()
    assert np.array_equal(y.grad.asnumpy(), np.ones(3))
    bare = Tensor.__new__(Tensor)  # made without __init__: no array
    with pytest.raises(AttributeError, match="^'Tensor' object has no attribute '_data'$"):
        my_ops.mul(bare, y)


# A Tensor and a Parameter pickled by 735177a (protocol 4), when `_data` lived in the instance dict.
_OLD_PICKLE = (
    "gASVZAEAAAAAAACMDnJ1bnRpbWUudGVuc29ylIwGVGVuc29ylJOUKYGUfZSMBV9kYXRhlIwWbnVtcHkuX2NvcmUubXVsdGlhcnJheZSM"
    "DF9yZWNvbnN0cnVjdJSTlIwFbnVtcHmUjAduZGFycmF5lJOUSwCFlEMBYpSHlFKUKEsBSwOFlGgJjAVkdHlwZZSTlIwCZjSUiYiHlFKU"
    "KEsDjAE8lE5OTkr/////Sv////9LAHSUYolDDAAAgD8AAABAAABAQJR0lGJzfZSMCV9iYXNlX3JlZpROc4aUYmgAjAlQYXJhbWV0ZXKU"
    "k5QpgZR9lChoBWgIaAtLAIWUaA2HlFKUKEsBSwFLAoaUaBKMAmY4lImIh5RSlChLA2gWTk5OSv////9K/////0sAdJRiiUMQAAAAAAAA"
    "8D8AAAAAAAAAQJR0lGKMBG5hbWWUjAF3lIwNcmVxdWlyZXNfZ3JhZJSIdX2UaBtOc4aUYoaULg==")


def test_a_pickle_from_before_the_data_slot_loads_into_it():
    import base64
    t, p = pickle.loads(base64.b64decode(_OLD_PICKLE))
    assert np.array_equal(t.asnumpy(), np.array([1, 2, 3], np.float32)) and "_data" not in vars(t)
    assert np.array_equal((t * 2).asnumpy(), [2, 4, 6])
    assert isinstance(p, Parameter) and p.name == "w" and p.requires_grad and p._base_ref is None
    (p * p).sum().backward()
    assert np.array_equal(p.grad.asnumpy(), [[2.0, 4.0]])
