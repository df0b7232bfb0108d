"""TFDS builder `stratoflow_mnist5k` (importing it registers the builder)."""

from stratoflow.data.tfds_builders.stratoflow_mnist5k.builder import StratoflowMnist5k

__all__ = ["StratoflowMnist5k"]
