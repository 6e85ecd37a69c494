"""The CPU step-time model against hand-computed numbers and the public figures it is
calibrated to (docs/design.md section 8)."""

from __future__ import annotations

import pytest

from hicache.spec.shapes import SHAPES
from hicache.spec.step_time import StepTimeModel, roofline

L8, L70 = SHAPES["llama3-8b"], SHAPES["llama3-70b"]


def test_linear_model_by_hand():
    m = StepTimeModel(prefill_base_ms=2.0, prefill_ms_per_token=0.01, decode_base_ms=5.0,
                      decode_ms_per_ktoken=0.5)
    assert m.forward_ms(256, 0, 0) == pytest.approx(2.0 + 2.56)
    assert m.forward_ms(256, 40, 9999) == pytest.approx(4.56)  # a prefill step: prefill cost
    assert m.forward_ms(0, 40, 28000) == pytest.approx(5.0 + 14.0)
    assert m.forward_ms(0, 0, 0) == 0.0  # idle step
    assert m.enabled and not StepTimeModel().enabled
    with pytest.raises(ValueError, match="decode_base_ms"):
        StepTimeModel(decode_base_ms=-1)


def test_roofline_llama3_8b_tp1_h100_by_hand():
    m = roofline(L8, 1, "h100")
    bytes_per_ms = 3.35e9 * 0.64
    assert m.decode_base_ms == pytest.approx(7504658432 * 2 / bytes_per_ms)
    assert m.decode_ms_per_ktoken == pytest.approx(1000 * 131072 / bytes_per_ms)
    assert m.prefill_ms_per_token == pytest.approx(2 * 7504658432 / (989e9 * 0.5))


def test_roofline_matches_public_decode_figures():
    m = roofline(L8, 1, "h100")
    assert m.forward_ms(0, 1, 700) == pytest.approx(7.0, rel=0.05)  # SGLang PR #1401
    assert m.forward_ms(0, 10, 7000) == pytest.approx(7.6, rel=0.05)  # vLLM ShareGPT
    assert m.forward_ms(0, 40, 28000) == pytest.approx(8.8, rel=0.05)


def test_roofline_tp_and_gpu():
    one, two = roofline(L8, 1), roofline(L8, 2)
    # half the weights per rank, plus 2 all-reduces x 32 layers x 0.015 ms
    assert two.decode_base_ms == pytest.approx(one.decode_base_ms / 2 + 0.96)
    assert two.decode_ms_per_ktoken == pytest.approx(one.decode_ms_per_ktoken / 2)
    assert roofline(L8, 1, "h200").decode_base_ms < one.decode_base_ms
    # Llama-3-70B at TP4: within the 15-25 ms band of published TP4 decode steps
    assert 15 < roofline(L70, 4).forward_ms(0, 1, 1000) < 25
    with pytest.raises(ValueError, match="unknown gpu"):
        roofline(L8, 1, "tpu")
