"""TFDS builder `stratoflow_generated` (importing it registers the builder); see `builder.py`."""

from benchmarks.generated_data.builder import NAME, StratoflowGenerated, build

__all__ = ["NAME", "StratoflowGenerated", "build"]
