"""The per-worker engine: Kineto traces read into Arrow tables, a worker's summary, critical
path, GPU breakdown and hardware-sample statistics; Parquet I/O. Used by the agent on each
worker and by the analyzer."""
