# The two commands a newcomer needs: `make run` and `make test`. Each creates .venv and
# installs what it needs on first use (and again when a requirements file changes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Python may cache compiled modules (and pytest its rewritten tests) under __pycache__, even
# where the shell says not to: a second `make check` then starts seconds sooner.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test check smoke reset lint lint-template synth deploy diff destroy bench clean

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m local

test: $(STAMP)
	$(PY) -m pytest -n 2

# The fast kinds only (unit and handler tests; no server, no synth, nothing slow): under a
# minute on a 2-core VM (docs/architecture.md, "The inner loop"). tests/infra holds synth tests
# only: not collected, so no worker imports the CDK.
check: $(STAMP)
	$(PY) -m pytest -n 2 -m "(unit or handler) and not slow" --ignore=tests/infra

# The smoke test of a deployed stack (tests/test_smoke.py): make smoke BASE_URL=<ApiUrl output> KEY=<provisioning key>.
# It leaves one org named "smoke-test <time>" behind, secrets rotated away. Without BASE_URL it
# runs against a local server it starts (as make test and CI do).
BASE_URL ?=
KEY ?=

smoke: $(STAMP)
	SMOKE_BASE_URL="$(BASE_URL)" SMOKE_KEY="$(KEY)" $(PY) -m pytest -n 0 -m smoke

reset:
	rm -rf .local

# Infrastructure (docs/infrastructure.md). The CDK CLI comes from npm (package.json pins
# aws-cdk 2.x). deploy, diff and destroy run tools/deploy.py for the stage STAGE (default dev),
# which adds the context the account needs: its Lambda concurrency limit, and on a stage's
# first create a deploy without deletion protection, then one with it; after a deploy, the
# smoke test. More context and cdk flags with CDK_ARGS, e.g.
#   make deploy STAGE=prod CDK_ARGS="-c region=eu-west-1 -c alertEmail=ops@example.com"
# make diff shows the plan and its cdk diff; DEPLOY_ARGS=--no-smoke deploys without the smoke test.
NPM_STAMP := node_modules/.installed
CDK := JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION=1 JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 \
	npx --no-install cdk
CDK_ARGS ?=
STAGE ?=
DEPLOY_ARGS ?=
DEPLOY_TOOL = $(PY) -m tools.deploy $(1) $(if $(STAGE),--stage $(STAGE)) $(DEPLOY_ARGS) -- $(CDK_ARGS)

$(NPM_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $(NPM_STAMP)

synth: $(STAMP) $(NPM_STAMP)
	$(CDK) synth --quiet $(CDK_ARGS)

deploy: $(STAMP) $(NPM_STAMP)
	$(call DEPLOY_TOOL,deploy)

diff: $(STAMP) $(NPM_STAMP)
	$(call DEPLOY_TOOL,diff)

destroy: $(STAMP) $(NPM_STAMP)
	$(call DEPLOY_TOOL,destroy)

# ruff (configured in pyproject.toml): the checks and the formatting, as CI runs them.
# `make lint-template` also runs cfn-lint on the synthesized templates (tests/infra does too).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

lint-template: synth
	$(VENV)/bin/cfn-lint -- cdk.out/*.template.json

# The benchmarks of docs/performance.md: cold starts, local latency, DynamoDB units and monthly
# cost (performance.py, which runs cold_start.py's measure), a burst's quota overshoot, and
# DynamoDB per operation with BENCH_SCOPES active scopes. Cold starts need Python 3.12 (the
# functions' runtime). 21 minutes on the shared 2-core VM under load (performance 8, overshoot
# 8, dynamodb_costs 4.5); BENCH_SCOPES=1000, the figures of docs/performance.md, adds 7.
BENCH_SCOPES ?= 100

bench: $(STAMP)
	$(PY) benchmarks/performance.py
	$(PY) benchmarks/overshoot.py
	$(PY) benchmarks/dynamodb_costs.py --scopes $(BENCH_SCOPES)

clean: reset
	rm -rf $(VENV) cdk.out node_modules .pytest_cache
