"""TFDS builder `stratoflow_digits` (importing it registers the builder)."""

from stratoflow.data.tfds_builders.stratoflow_digits.builder import StratoflowDigits

__all__ = ["StratoflowDigits"]
