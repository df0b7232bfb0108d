"""Pipeline `diabetes` (pipeline.yaml and its own code).

A package so that the layering contracts (pyproject.toml) see its modules. The pipeline loader
imports them as `stratoflow_pipeline_diabetes.<module>` and never runs this file.
"""
