"""The penguins' preprocessing: measurements to comparable scales (a `tf.data` map function).

`dataset.preprocess: "preprocess:standardize"` applies it to every `(features, target)` pair of
every split, in training and evaluation alike. The centres and scales are fixed constants (about
the mean and standard deviation of each measurement), part of the pipeline's code.
"""

from __future__ import annotations

from typing import Any

CENTRE_AND_SCALE = {
    "bill_length_mm": (44.0, 5.5),
    "bill_depth_mm": (17.0, 2.0),
    "flipper_length_mm": (200.0, 14.0),
    "body_mass_g": (4200.0, 800.0),
}


def standardize(features: dict[str, Any], species: Any) -> tuple[dict[str, Any], Any]:
    """Each measurement as (value - centre) / scale; categorical ids and the label unchanged."""
    scaled = dict(features)
    for name, (centre, scale) in CENTRE_AND_SCALE.items():
        scaled[name] = (features[name] - centre) / scale
    return scaled, species
