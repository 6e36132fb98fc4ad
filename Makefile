# The two commands of the README. Both set up what they need first (scripts/setup.sh).
PY := .venv/bin/python

.PHONY: setup demo test lint typecheck unit cluster

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/perfdiag demo $(SCENARIO)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

typecheck: setup
	scripts/typecheck.sh

# Set-up, lint, types and tests; on a fresh machine the test binaries build beside them.
test:
	@scripts/test-all.sh

# The suite's control plane, MinIO and kubelet with the chart and the operator, in the foreground
# until Ctrl-C (docs/install.md, "Try it without a cluster").
cluster: setup
	PERFDIAG_BIN_DIR=$$(scripts/test-binaries.sh | tail -n 1) .venv/bin/python -P -m perfdiag_testing.devcluster
