# The two commands of the README. Both set up .venv first (scripts/setup.sh, idempotent).
.PHONY: setup demo test test-slow

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/minirl train configs/demo.yaml

test: setup
	.venv/bin/python -m pytest

test-slow: setup
	.venv/bin/python -m pytest -m slow
