"""The `promotion:` section of a pipeline spec: whether a person approves a move of `champion`.

```yaml
promotion:
  approval: required   # or `none` (the default): the gate alone moves champion
  timeout: 3d          # how long the approval waits: 90s, 30m, 12h, 3d
```

With `approval: required` the retrain DAG asks a person in the Airflow UI (a human-in-the-loop
task) before it moves `champion`; a rejection or a timeout leaves `champion` where it was.
Light: the standard library only (DAG parsing reads it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stratoflow.config.parsing import SpecError

APPROVAL_NONE = "none"
APPROVAL_REQUIRED = "required"
APPROVALS = (APPROVAL_NONE, APPROVAL_REQUIRED)
# The approver's options in the Airflow UI; "Reject" is also the answer when the timeout passes.
APPROVE = "Approve"
REJECT = "Reject"
# Long enough for a weekend; a run waiting for approval holds its DAG's only run slot.
DEFAULT_TIMEOUT = "3d"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")


@dataclass(frozen=True)
class PromotionSpec:
    """Who moves `champion` once the gate passed.

    Attributes:
        approval: `none` (the gate alone) or `required` (a person approves in the Airflow UI).
        timeout: how long a run waits for the approval before it gives up, leaving `champion`
            where it was: a whole number with a unit `s`, `m`, `h` or `d` (seconds without).
    """

    approval: str = APPROVAL_NONE
    timeout: str = DEFAULT_TIMEOUT

    @property
    def approval_required(self) -> bool:
        """True when a person must approve each move of `champion`."""
        return self.approval == APPROVAL_REQUIRED

    @property
    def timeout_seconds(self) -> int:
        """The timeout in seconds (the spec is checked: `check_promotion`)."""
        return parse_duration(self.timeout, "promotion.timeout")


def parse_duration(value: str, where: str) -> int:
    """Seconds of a duration written `<number><unit>` (unit s, m, h or d; seconds without).

    Raises:
        SpecError: not such a duration, or not positive; the message names `where`.
    """
    match = _DURATION.match(value) if isinstance(value, str) else None
    seconds = int(match.group(1)) * _UNITS[match.group(2) or "s"] if match else 0
    if seconds <= 0:
        raise SpecError(
            f"{where}: {value!r} is not a positive duration; write a whole number with a unit: "
            "s, m, h or d (e.g. 90s, 30m, 12h, 3d)"
        )
    return seconds


def check_promotion(promotion: PromotionSpec, source: str) -> None:
    """Refuse an unknown `approval` or a timeout that is not a positive duration.

    Raises:
        SpecError: naming `source`, the field and the allowed values.
    """
    if promotion.approval not in APPROVALS:
        raise SpecError(
            f"{source}: promotion.approval {promotion.approval!r} is not allowed; allowed: "
            f"{', '.join(APPROVALS)}"
        )
    parse_duration(promotion.timeout, f"{source}: promotion.timeout")
