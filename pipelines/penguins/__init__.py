"""Pipeline `penguins` (pipeline.yaml and its own code).

A package so that the layering contracts (pyproject.toml) see its modules. The pipeline loader
imports them as `stratoflow_pipeline_penguins.<module>` and never runs this file.
"""
