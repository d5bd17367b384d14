"""The fidelity comparison's one excuse, the output cap, never covers a call that timed out."""

from __future__ import annotations

from bench.fidelity import intended
from workbench.hands.observing import TIMED_OUT


def test_a_cut_output_is_the_intended_cap_but_a_timed_out_call_is_not():
    cut = {"truncated": ["[the output was truncated: 2,000,000 characters dropped]"]}
    assert intended(cut, "x" * 10, "x") == "output cap"
    assert intended({"truncated": []}, "a", "b… characters cut here: 9") == "output cap"
    timed_out = {"truncated": [*cut["truncated"], TIMED_OUT.format(timeout=120)]}
    assert intended(timed_out, "x" * 10, "x") == ""
    assert intended({"truncated": [TIMED_OUT.format(timeout=1.5)]}, "a", "b… characters cut here: 9") == ""
    assert intended({}, "a", "b") == ""
