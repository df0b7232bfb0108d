"""The data gate: the run's prepared data against the champion's, before any training.

`check_data` compares the new statistics (every split) with the champion's (its training run's
`data/statistics.json`), as the pipeline's `validation:` declares (`ValidationSpec`):

- schema (against the champion's): the same features with the same kinds, an image's shape,
  a categorical feature's vocabulary, the label classes, and no class left without examples in
  the training split;
- drift (against the champion's training split): each feature and the labels of the new
  training split, by the declared distance (`stratoflow.data.drift`), within its bound;
- anomalies (every split, also on a first run): missing values over their bound, values out of a
  declared range.

Without a champion (a first run, or a champion trained before statistics were kept) only the
anomalies are checked, and the report says so. `accept_drift` (a run setting) lets the run train
despite what the gate found: the findings stay in the report, the run is tagged as accepted.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Any

from stratoflow.config.parsing import SpecError
from stratoflow.config.validation import DISTANCE_NAMES, ValidationSpec
from stratoflow.data import drift
from stratoflow.data.statistics import (
    CATEGORICAL,
    IMAGE,
    LABEL,
    DatasetStatistics,
    FeatureStatistics,
)

SCHEMA = "schema"
DRIFT = "drift"
MISSING = "missing"
RANGE = "range"


class DataGateError(SpecError):
    """The data gate refused the run's data: the data and the spec decide it, so retrying
    cannot help (a refusal: the task fails without a retry)."""


@dataclass(frozen=True)
class Anomaly:
    """One finding of the data gate.

    Attributes:
        check: `schema`, `drift`, `missing` or `range`.
        feature: the feature (`label` for the labels or target).
        split: the split it was found in.
        message: what is wrong, with the values and the bound.
    """

    check: str
    feature: str
    split: str
    message: str

    def describe(self) -> str:
        """`check: message`, e.g. `missing: bill_length_mm in train: 20.0% missing (bound ...)`."""
        return f"{self.check}: {self.message}"


@dataclass(frozen=True)
class DriftRow:
    """The drift of one feature (or the labels) of the training split from the champion's."""

    feature: str
    distance: str
    value: float | None
    bound: float
    drifted: bool


@dataclass(frozen=True)
class DataGateReport:
    """What the data gate found and decided.

    Attributes:
        passed: no anomaly, or `accept_drift` accepted them.
        accepted_drift: the run's `accept_drift` let anomalies through.
        champion: the champion version compared with, or None (anomalies checked only).
        notes: what the gate could not check, and why.
        anomalies: every finding.
        drift: each feature's and the labels' drift (empty without a champion).
    """

    passed: bool
    accepted_drift: bool
    champion: str | None
    notes: list[str] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    drift: list[DriftRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON types (the artifact `data/gate.json`)."""
        return asdict(self)

    def summary(self) -> str:
        """One line: the decision and every anomaly."""
        if not self.anomalies:
            return "data gate passed: no anomaly" + (f" ({self.notes[0]})" if self.notes else "")
        found = "; ".join(anomaly.describe() for anomaly in self.anomalies)
        count = f"{len(self.anomalies)} {'anomaly' if len(self.anomalies) == 1 else 'anomalies'}"
        if self.accepted_drift:
            return f"data gate: {count} accepted by accept_drift: {found}"
        return (
            f"data gate failed, {count}: {found}. Nothing was trained; "
            "if the change is expected, rerun with accept_drift=true"
        )


def check_data(
    new: DatasetStatistics,
    champion: DatasetStatistics | None,
    validation: ValidationSpec,
    *,
    accept_drift: bool = False,
    champion_version: str | None = None,
) -> DataGateReport:
    """Check the run's data (`new`) against the champion's (`champion`) and the declared bounds.

    Args:
        new: the statistics of the run's prepared splits.
        champion: the statistics the champion was trained on, or None (none to compare with).
        validation: the pipeline's `validation:` section.
        accept_drift: the run accepts what the gate finds (recorded in the report).
        champion_version: the champion's version, for the report.
    """
    notes: list[str] = []
    anomalies: list[Anomaly] = []
    rows: list[DriftRow] = []
    if champion is None:
        notes.append(
            "no champion statistics to compare with: schema and drift not checked, only "
            "missing values and declared ranges"
        )
    else:
        if validation.check_schema:
            anomalies += _schema(new, champion)
        rows = _drift(new, champion, validation)
        anomalies += [
            Anomaly(
                DRIFT,
                row.feature,
                "train",
                f"{row.feature}: {DISTANCE_NAMES[row.distance]} {row.value:.3f} from the "
                f"champion's training data, above its bound {row.bound:g}",
            )
            for row in rows
            if row.drifted and row.value is not None
        ]
    anomalies += _missing_and_ranges(new, validation)
    return DataGateReport(
        passed=not anomalies or accept_drift,
        accepted_drift=bool(anomalies) and accept_drift,
        champion=champion_version if champion is not None else None,
        notes=notes,
        anomalies=anomalies,
        drift=rows,
    )


def _schema(new: DatasetStatistics, champion: DatasetStatistics) -> list[Anomaly]:
    found: list[Anomaly] = []
    ours, theirs = new.train, champion.train

    def add(feature: str, message: str) -> None:
        found.append(Anomaly(SCHEMA, feature, "train", message))

    for name in theirs.features:
        if name not in ours.features:
            add(name, f"feature {name!r} is missing (the champion's data had it)")
    for name in ours.features:
        if name not in theirs.features:
            add(name, f"feature {name!r} is new (the champion's data had no such feature)")
    for name, now in ours.features.items():
        before = theirs.features.get(name)
        if before is None:
            continue
        if now.kind != before.kind:
            add(name, f"feature {name!r} is {now.kind}, the champion's was {before.kind}")
        elif now.kind == IMAGE and now.shape != before.shape:
            add(
                name,
                f"feature {name!r} has shape {list(now.shape)}, the champion's "
                f"{list(before.shape)}",
            )
        elif now.kind == CATEGORICAL and now.vocabulary != before.vocabulary:
            add(
                name,
                f"feature {name!r} has values {list(now.vocabulary)}, the champion's "
                f"{list(before.vocabulary)}",
            )
    if ours.label.kind != theirs.label.kind:
        add(LABEL, f"the label is {ours.label.kind}, the champion's was {theirs.label.kind}")
    elif ours.label.kind == CATEGORICAL:
        if ours.label.vocabulary != theirs.label.vocabulary:
            add(
                LABEL,
                f"the label classes are {list(ours.label.vocabulary)}, the champion's "
                f"{list(theirs.label.vocabulary)}",
            )
        else:
            before_counts = theirs.label.frequency_of()
            for name, count in ours.label.frequency_of().items():
                if count == 0 and before_counts.get(name, 0) > 0:
                    add(
                        LABEL,
                        f"class {name!r} has no examples in the training split (the "
                        f"champion's had {before_counts[name]})",
                    )
    return found


def _drift(
    new: DatasetStatistics, champion: DatasetStatistics, validation: ValidationSpec
) -> list[DriftRow]:
    rows = []
    pairs: list[tuple[str, FeatureStatistics, FeatureStatistics]] = [
        (name, champion.train.features[name], now)
        for name, now in new.train.features.items()
        if name in champion.train.features
    ]
    pairs.append((LABEL, champion.train.label, new.train.label))
    for name, before, now in pairs:
        value = drift.distance(validation.distance, before, now)
        bound = validation.drift_bound(name)
        rows.append(
            DriftRow(name, validation.distance, value, bound, value is not None and value > bound)
        )
    return rows


def _missing_and_ranges(new: DatasetStatistics, validation: ValidationSpec) -> list[Anomaly]:
    found = []
    for role, split in new.splits.items():
        for name, feature in [*split.features.items(), (LABEL, split.label)]:
            bound = validation.missing_bound(name)
            if feature.missing_share > bound:
                found.append(
                    Anomaly(
                        MISSING,
                        name,
                        role,
                        f"{name} in {role}: {feature.missing_share:.1%} missing "
                        f"({feature.missing} of {feature.count}; bound {bound:.1%})",
                    )
                )
            low, high = validation.range_of(name)
            if low is not None and feature.min is not None and feature.min < low:
                found.append(
                    Anomaly(
                        RANGE,
                        name,
                        role,
                        f"{name} in {role}: min {feature.min:g} is below the declared min {low:g}",
                    )
                )
            if high is not None and feature.max is not None and feature.max > high:
                found.append(
                    Anomaly(
                        RANGE,
                        name,
                        role,
                        f"{name} in {role}: max {feature.max:g} is above the declared max {high:g}",
                    )
                )
    return found


# --- readable reports -------------------------------------------------------------------------

_STYLE = (
    "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#eee}"
    ".bad{background:#fdd}.ok{background:#dfd}</style>"
)


def report_html(report: DataGateReport, pipeline: str) -> str:
    """The gate's report as one HTML page (the artifact `data/gate.html`)."""
    state = (
        "passed"
        if report.passed and not report.accepted_drift
        else "accepted (accept_drift)"
        if report.passed
        else "FAILED"
    )
    against = f"champion version {report.champion}" if report.champion else "no champion"
    parts = [
        f"<html><head><meta charset='utf-8'><title>{html.escape(pipeline)}: data gate</title>"
        f"{_STYLE}</head><body>",
        f"<h1>{html.escape(pipeline)}: data gate {state}</h1><p>Compared with {against}.</p>",
    ]
    parts += [f"<p><em>{html.escape(note)}</em></p>" for note in report.notes]
    parts.append("<h2>Anomalies</h2>")
    if report.anomalies:
        parts.append("<table><tr><th>check</th><th>feature</th><th>split</th><th>what</th></tr>")
        parts += [
            f"<tr class='bad'><td>{a.check}</td><td>{html.escape(a.feature)}</td>"
            f"<td>{a.split}</td><td style='text-align:left'>{html.escape(a.message)}</td></tr>"
            for a in report.anomalies
        ]
        parts.append("</table>")
    else:
        parts.append("<p>None.</p>")
    if report.drift:
        parts.append(
            "<h2>Drift of the training split from the champion's</h2><table>"
            "<tr><th>feature</th><th>distance</th><th>value</th><th>bound</th></tr>"
        )
        for row in report.drift:
            value = "n/a" if row.value is None else f"{row.value:.4f}"
            parts.append(
                f"<tr class='{'bad' if row.drifted else 'ok'}'><td>{html.escape(row.feature)}"
                f"</td><td>{row.distance}</td><td>{value}</td><td>{row.bound:g}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def statistics_html(statistics: DatasetStatistics) -> str:
    """Every split's statistics as one HTML page (the artifact `data/statistics.html`)."""
    parts = [
        f"<html><head><meta charset='utf-8'><title>{html.escape(statistics.dataset)}: "
        f"statistics</title>{_STYLE}</head><body>",
        f"<h1>{html.escape(statistics.dataset)}</h1><p>fingerprint "
        f"{statistics.fingerprint[:16]}, {statistics.problem_type}</p>",
    ]
    for role, split in statistics.splits.items():
        parts.append(
            f"<h2>{role}: {split.examples} examples</h2><table><tr><th>feature</th>"
            "<th>kind</th><th>count</th><th>missing</th><th>min</th><th>max</th>"
            "<th>mean</th><th>std</th><th>p25 / p50 / p75</th>"
            "<th style='text-align:left'>values / shape</th></tr>"
        )
        for feature in [*split.features.values(), split.label]:
            parts.append(_feature_row(feature))
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _feature_row(feature: FeatureStatistics) -> str:
    def number(value: float | None) -> str:
        return "" if value is None else f"{value:.4g}"

    middle = (
        " / ".join(number(feature.quantiles[p]) for p in (25, 50, 75)) if feature.quantiles else ""
    )
    if feature.kind == CATEGORICAL:
        detail = ", ".join(f"{name}: {count}" for name, count in feature.frequency_of().items())
    elif feature.kind == IMAGE:
        detail = f"shape {list(feature.shape)}"
    else:
        detail = ""
    cells = [
        feature.name,
        feature.kind,
        str(feature.count),
        str(feature.missing),
        number(feature.min),
        number(feature.max),
        number(feature.mean),
        number(feature.std),
        middle,
    ]
    return (
        "<tr>"
        + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells)
        + f"<td style='text-align:left'>{html.escape(detail)}</td></tr>"
    )
