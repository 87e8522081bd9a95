# The two commands of the README: `make study` and `make test`. Both create .venv when it is missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PLAN ?= plans/default.yaml
# an emoji build that differs from the published one writes a published study's outputs beside its runs, unless
# `make study PUBLISH_DIFFERENT_BUILD=1` (dmlstudy/paths.py: different_build)
ifdef PUBLISH_DIFFERENT_BUILD
export DMLSTUDY_PUBLISH_DIFFERENT_BUILD := $(PUBLISH_DIFFERENT_BUILD)
endif

.PHONY: study publish teach test lint install lab data smoke full clean-runs notebooks notebook-outputs tune robustness robustness-partitions robustness-budget robustness-224 robustness-designers robustness-epochs30 robustness-table robustness-power

$(STAMP): pyproject.toml requirements.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e . || $(BIN)/python -m pip install --quiet --no-deps -e .
	-@git config filter.notebook-outputs.clean "$(BIN)/python -m dmlstudy.experiments.notebooks strip" 2>/dev/null
	-@$(BIN)/dmlstudy list methods > /dev/null  # caches the CLI's catalogue of names (dmlstudy/catalog.py)
	@touch $(STAMP)

install: $(STAMP)

## the default study: datasets, every default run, tables, figures and the executed notebooks in published/
## (make study PLAN=plans/embedded.yaml: the generated sets). Run again, it executes only the notebooks whose
## source changed (their finished runs are loaded) and publishes again.
study: $(STAMP)
	@start=$$(date +%s); \
	$(BIN)/dmlstudy data generate --plan $(PLAN) && \
	$(BIN)/dmlstudy study run $(PLAN); status=$$?; \
	[ $$status -ge 128 ] || $(BIN)/dmlstudy study table $$(basename $(PLAN) .yaml) --by dataset method || status=1; \
	[ $$status -ge 128 ] || $(BIN)/dmlstudy study publish $(PLAN) || status=1; \
	echo "study $$( [ $$status -ge 128 ] && echo stopped after || echo finished in ) $$(( $$(date +%s) - start )) s (status $$status)"; \
	echo "runs: runs/   tables: results/   figures: figures/   executed notebooks: published/"; \
	exit $$status

## the teaching preset (plans/teach.yaml): each paper notebook on emoji with EfficientNet-Lite0 at one seed, in
## minutes once the data is built; `make teach ONLY=crt` for one notebook (an entry name, or a regular expression).
## Executed notebooks: runs/teach/<entry>/, cleaned copies: runs/teach/published/
teach: $(STAMP)
	$(BIN)/dmlstudy data generate --plan plans/teach.yaml
	$(BIN)/dmlstudy study run plans/teach.yaml $(if $(ONLY),--only '$(ONLY)')
	$(BIN)/dmlstudy study publish plans/teach.yaml

## publish the executed notebooks of a plan that has run (no training, no execution): published/ for the default study
publish: $(STAMP)
	$(BIN)/dmlstudy study publish $(PLAN)

## per-method Optuna tuning on validation classes, in every regime (make tune PLAN=plans/tune_smoke.yaml for the CI-sized one): plans/tuned/<dataset>.yaml, plans/tuned/<regime>/<dataset>.yaml and their best-so-far figures
tune: PLAN = plans/tune_imagenet.yaml plans/tune.yaml plans/tune_pretrained.yaml
tune: $(STAMP)
	@start=$$(date +%s); status=0; \
	$(BIN)/dmlstudy data generate synbirds glyphs emoji || status=$$?; \
	for plan in $(PLAN); do [ $$status -eq 0 ] || break; $(BIN)/dmlstudy tune $$plan || status=$$?; done; \
	echo "tune finished in $$(( $$(date +%s) - start )) s (status $$status)"; \
	exit $$status

## ruff lint rules and formatting, as configured in pyproject.toml (`ruff format` + `ruff check --fix` repair most)
LINT_PATHS := $(wildcard dmlstudy tests benchmarks examples notebooks)
lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

## the whole test suite: lint, unit tests and every notebook under nbval at CI size, its outputs compared with the
## expected ones in tests/notebook_outputs/ (sanitize.cfg blanks times, paths and progress)
test: $(STAMP) lint
	$(BIN)/python -m pytest --nbval --nbval-sanitize-with tests/notebook_outputs/sanitize.cfg --durations=25 tests

## nbval's expected outputs: every notebook executed at CI size into tests/notebook_outputs/ (after editing one;
## `make notebook-outputs NOTEBOOKS="10_crt"` for some)
notebook-outputs: $(STAMP)
	$(BIN)/python -m dmlstudy.experiments.notebooks expected $(NOTEBOOKS)

smoke: $(STAMP)
	$(BIN)/dmlstudy study run plans/smoke.yaml

full: $(STAMP)
	$(BIN)/dmlstudy data generate synbirds glyphs emoji
	$(BIN)/dmlstudy study run plans/embedded.yaml
	$(BIN)/dmlstudy study run plans/full.yaml

data: $(STAMP)
	$(BIN)/dmlstudy data generate --plan $(PLAN)

## rebuild notebooks/*.ipynb from their sources notebooks/*.py (parameters cells from the config dataclasses)
notebooks: $(STAMP)
	$(BIN)/python -m dmlstudy.experiments.notebooks build

## JupyterLab at the repository root (notebooks/, published/, figures/, results/ and docs/ in reach), on the
## venv's kernel; as root (a container) it passes --allow-root. LAB_ARGS goes to `jupyter lab` as it stands: in a
## container or on a remote machine, `make lab LAB_ARGS="--ip=0.0.0.0 --no-browser"` (add --port=8888 to fix the
## port), then open the printed URL with the machine's address (README.md, "Explore")
LAB_ARGS ?=
lab: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir=. $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(LAB_ARGS)

clean-runs:
	rm -rf runs/

## pretrain the default backbone on the shapes source set: weights/dml_convnet_shapes.safetensors + its card
.PHONY: pretrain pretrain-check
pretrain: $(STAMP)
	$(BIN)/dmlstudy pretrain

## rebuild the committed weights into a temporary folder and compare with their card (hash; else accuracy ± 0.02)
pretrain-check: $(STAMP)
	$(BIN)/dmlstudy pretrain --verify weights/dml_convnet_shapes.md

## the robustness study (docs/protocol.md): the headline claims under each perturbation of the default study, then
## results/robustness/ (after `make study`, whose runs the relatives-out column reads). Each perturbation alone:
## make robustness-partitions (tunes each partition first), robustness-budget, robustness-epochs30, robustness-224,
## robustness-designers
ROBUST_PLANS := designers budget epochs30 partitions 224
robustness: $(STAMP)
	@start=$$(date +%s); status=0; \
	for name in $(ROBUST_PLANS); do $(MAKE) --no-print-directory robustness-$$name || { status=$$?; break; }; done; \
	[ $$status -ne 0 ] || $(BIN)/dmlstudy study robustness || status=$$?; \
	echo "robustness finished in $$(( $$(date +%s) - start )) s (status $$status)"; exit $$status

robustness-partitions: $(STAMP)
	$(BIN)/dmlstudy data generate emoji_p1 emoji_p2
	$(BIN)/dmlstudy tune plans/tune_partitions.yaml
	$(BIN)/dmlstudy study run plans/robust_partitions.yaml

robustness-budget robustness-epochs30 robustness-224 robustness-designers: robustness-%: $(STAMP)
	$(BIN)/dmlstudy data generate --plan plans/robust_$*.yaml
	$(BIN)/dmlstudy study run plans/robust_$*.yaml

robustness-table: $(STAMP)
	$(BIN)/dmlstudy study robustness

## false rate and power of every robustness reading, simulated from the committed per-seed table (seconds)
robustness-power: $(STAMP)
	$(BIN)/dmlstudy study robustness-power
