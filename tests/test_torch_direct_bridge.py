"""A torch tensor passed straight to a C++ operator (no to_torch) is read one of two ways
(include/opbuilder/detail/dlpack_exchange.h): through DLPack's C exchange table, after torch's is_neg,
or, once to_torch's C++ bridge is loaded in the process, by the bridge's ForeignApi::peek (torch's own
C++: a few field reads). Which one a test file meets depends on whether something loaded the bridge
before it, so the direct route's tests run here once per way, pinned: "exchange" hides the bridge from
the runtime for the test (its slot cleared, then put back), "peek" loads it. Both must keep every rule:
memory without a copy, torch's version counter, views DLPack cannot describe, and torch's refusals.
"""
from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'opbuilder[torch]')")

from runtime import _native  # noqa: E402

# the direct route's tests, collected again here under both ways (their fixtures come with them)
from test_interop_torch_direct import *  # noqa: E402,F401,F403
from test_interop_torch_direct import seed_ops  # noqa: E402,F401
from test_torch_routes_semantics import (  # noqa: E402,F401
    parity_ops, test_a_direct_read_of_a_torch_tensor_that_requires_grad_still_works,
    test_a_direct_write_into_a_negative_view_is_refused_in_to_torchs_words,
    test_a_direct_write_into_a_no_grad_view_of_a_leaf_is_refused,
    test_a_direct_write_into_a_torch_tensor_that_requires_grad_is_refused_before_it_writes,
    test_a_direct_write_into_an_inference_tensor_is_refused,
    test_a_direct_write_under_no_grad_or_without_grad_is_done_and_counted)

pytestmark = pytest.mark.build


@pytest.fixture(autouse=True, params=["exchange", "peek"])
def direct_way(request):
    """The way the direct route reads torch tensors in this test (see the module's docstring)."""
    slot = ctypes.c_void_p.from_address(_native.bridge_slot_address())
    if request.param == "peek":
        request.getfixturevalue("torch_bridge")
        assert slot.value, "the bridge is loaded but its table is not in the runtime's slot"
        yield request.param
        return
    kept = slot.value
    slot.value = None
    try:
        yield request.param
    finally:
        slot.value = kept

