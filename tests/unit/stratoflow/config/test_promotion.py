"""The `promotion:` section of a pipeline spec: no approval by default, and clear refusals."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from stratoflow.config.parsing import SpecError
from stratoflow.config.promotion import PromotionSpec, parse_duration
from stratoflow.config.spec import SPECS_DIR, parse_spec


def _digits_with(promotion: Any) -> dict[str, Any]:
    data = yaml.safe_load((SPECS_DIR / "digits" / "pipeline.yaml").read_text())
    return {**copy.deepcopy(data), "promotion": promotion}


def test_without_a_promotion_section_the_gate_alone_moves_champion() -> None:
    data = yaml.safe_load((SPECS_DIR / "digits" / "pipeline.yaml").read_text())
    spec = parse_spec("digits", data)
    assert spec.promotion == PromotionSpec(approval="none", timeout="3d")
    assert not spec.promotion.approval_required


def test_approval_required_with_its_timeout() -> None:
    spec = parse_spec("digits", _digits_with({"approval": "required", "timeout": "90m"}))
    assert spec.promotion.approval_required
    assert spec.promotion.timeout_seconds == 90 * 60


@pytest.mark.parametrize(
    ("text", "seconds"), [("45", 45), ("45s", 45), ("30m", 1800), ("12h", 43200), ("3d", 259200)]
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text, "promotion.timeout") == seconds


@pytest.mark.parametrize(
    ("promotion", "message"),
    [
        (
            {"approval": "yes"},
            "promotion.approval 'yes' is not allowed; allowed: none, required",
        ),
        (
            {"approval": "required", "timeout": "soon"},
            "promotion.timeout: 'soon' is not a positive duration; write a whole number with a "
            "unit: s, m, h or d (e.g. 90s, 30m, 12h, 3d)",
        ),
        ({"approval": "required", "timeout": "0s"}, "promotion.timeout: '0s' is not a positive"),
        ({"approval": "required", "timeout": 60}, "promotion.timeout: expected str, got int 60"),
        ({"approve": "required"}, "promotion: unknown key 'approve'; allowed: approval, timeout"),
    ],
)
def test_a_wrong_promotion_names_the_file_the_field_and_what_is_allowed(
    promotion: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as refused:
        parse_spec("digits", _digits_with(promotion), source="pipelines/digits/pipeline.yaml")
    assert str(refused.value).startswith("pipelines/digits/pipeline.yaml")
    assert message in str(refused.value)
