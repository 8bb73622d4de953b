"""What users run from YAML: run config, sources, prepare, train, evaluate, artifacts, report, tracking, CLI.

Built on `blocksync.engine`; `stages` holds prepare/train/evaluate/run over one run directory.
"""
