"""Loading a capture: every worker's files (or a folder of Kineto traces) as one summary table;
which workers were expected, missing or stuck, and where the stuck ones are."""
