# The two commands of the README. Both set up what they need first (scripts/setup.sh).
PY := .venv/bin/python

.PHONY: setup demo test lint typecheck unit

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/perfdiag demo $(SCENARIO)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

typecheck: setup
	scripts/typecheck.sh

test: setup lint typecheck
	scripts/run-tests.sh
