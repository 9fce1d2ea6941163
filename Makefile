# latentstruct — `make help` lists every target.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Installed before the package so that pip never resolves a newer, multi-GB CUDA build of torch.
TORCH ?= torch==2.13.0
JOBS ?= $(shell nproc)
RUNS := multirun
# Seeds of the Figure 3 grid (the sweep's own default is 301-304; fewer make a labelled, reduced figure).
INNER_SEEDS ?= 301,302,303,304
# Repetitions of the sorting table (the sweep's own default is 10 seeds; the paper repeats 200 times).
SORT_SEEDS ?= range(301,311)
# The k-NN table's dataset (mnist, fashion_mnist, cifar10) and extra overrides, e.g. a reduced run:
# KNN_ARGS='trainer.max_steps=150 trainer.eval_every=150' (the table's provenance lists the steps that ran).
KNN_DATASET ?= mnist
KNN_ARGS ?=
# Seeds and extra overrides of the SST / SNLI tables (Table 3 of seed 001), e.g. a reduced run:
# SST_SEEDS=301 SST_ARGS='trainer.max_epochs=2'; the embeddings: SST_ARGS='embedding.pretrained=<GloVe file>'.
SST_SEEDS ?= 301,302,303
SST_ARGS ?=
# The sentence of seed 001 Figure 6, drawn with each method's seed-301 model into results/spigot/trees/.
SST_TREE ?= A taut, intelligent psychological drama.
SNLI_SEEDS ?= 301,302,303
SNLI_ARGS ?=
# The semi-supervised VAE table (seed 003): dataset (semisupervised_mnist or semisupervised_fashion_mnist), seeds and
# extra overrides, e.g. a shortened schedule: VAE_ARGS='trainer.phases.1.epochs=20 task.anneal_rate=2e-4'.
VAE_DATASET ?= semisupervised_mnist
VAE_SEEDS ?= 301
VAE_ARGS ?=
# The ListOps table (issue #7): seeds of the merge-parser / LSTM runs and of the chart runs, extra overrides of all
# runs and of the chart runs only. The reduced CPU run of results/listops/table.md: LISTOPS_ARGS=+preset=listops_cpu
# LISTOPS_SEEDS=301,302 LISTOPS_CHART_SEEDS=301 LISTOPS_CHART_ARGS='trainer.max_steps=500 task.checkpoint=false'.
LISTOPS_SEEDS ?= 301,302,303
LISTOPS_CHART_SEEDS ?= 301,302,303
LISTOPS_ARGS ?=
LISTOPS_CHART_ARGS ?=
# The multi-label energy table (seed 004 Table 1 / 5): datasets, seeds, extra overrides.
MLC_DATASETS ?= bibtex,delicious
MLC_SEEDS ?= 301,302,303
MLC_ARGS ?=
# The NER table (seed 004 Table 3) and the Twitter POS table (Table 9): seeds and extra overrides, e.g. the reduced
# CPU runs of results/energy/: NER_ARGS=+preset=ner_cpu NER_SEEDS=301, POS_ARGS=+preset=pos_cpu POS_SEEDS=301.
NER_SEEDS ?= 301,302,303
NER_ARGS ?=
POS_SEEDS ?= 301,302,303
POS_ARGS ?=
# Real datasets (see README); the shared copy beside the checkout when it exists, else the package's default (data/).
ifneq ($(wildcard ../shared/data),)
export LATENTSTRUCT_DATA ?= $(abspath ../shared/data)
endif
# Reference libraries for the benchmarks only (never dependencies of latentstruct), installed beside .venv.
BENCH_DEPS := .bench
BENCH_DEVICE ?= cpu
# bench-structures / bench-layers: a git revision to time beside the current tree (empty: the current tree only),
# e.g. BENCH_BASELINE=645b4f9 for the before / after tables; BENCH_LAYERS_ARGS: more options of bench/layers.py.
BENCH_BASELINE ?=
BENCH_LAYERS_ARGS ?=
SWEEP := hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS) trainer.threads=1 trainer.progress=false \
	trainer.resume=true paths.multirun_dir=$(RUNS)

.DEFAULT_GOAL := help
.PHONY: help install run test lint table-spigot-synthetic spigot-table2 spigot-inner-steps \
	table-direct-sorting direct-sorting direct-sorting-time table-direct-knn table-direct-vae table-listops table-energy-mlc table-energy-ner table-energy-pos table-spigot-sst table-spigot-snli \
	bench-structures bench-layers clean

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-26s %s\n", $$1, $$2}'

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(TORCH)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,sweep,slurm]'
	touch $@

install: $(BIN)/.installed ## create .venv (if absent) and install torch, then latentstruct with its dev, sweep and slurm extras

run: install ## install if needed, then run the default experiment (synthetic clusters, SPIGOT, CPU, < 1 min)
	$(BIN)/python -m latentstruct.train

test: install ## install if needed, then run the fast test suite (< 10 min on 2 cores)
	$(BIN)/python -m pytest

lint: install ## ruff on the package and the tests
	$(BIN)/ruff check latentstruct tests

table-spigot-synthetic: spigot-table2 spigot-inner-steps ## seed 001 Table 2 + Figures 2-3 into results/spigot/

spigot-table2: install ## Table 2 (13 methods x K in {3,10} x 4 seeds) and Figure 2 (learning curves)
	$(BIN)/python -m latentstruct.train --multirun +sweep=spigot_table2 $(SWEEP)
	$(BIN)/python -m latentstruct.tables experiments/spigot/table2.yaml --runs $(RUNS)/spigot_table2 \
		--out results/spigot/table2.md
	$(BIN)/python -m latentstruct.figures learning-curves --runs $(RUNS)/spigot_table2 \
		--out results/spigot/figure2_learning_curves.png

spigot-inner-steps: install ## Figure 3: k in {1,5,10} inner steps x eta grid, best eta per k, at K = 10
	$(BIN)/python -m latentstruct.train --multirun +sweep=spigot_inner_steps trainer.seed=$(INNER_SEEDS) $(SWEEP)
	$(BIN)/python -m latentstruct.figures inner-steps --runs $(RUNS)/spigot_inner_steps \
		--out results/spigot/figure3_inner_steps.png

table-spigot-sst: install ## seed 001 Table 3, SST: 9 methods x SST_SEEDS -> results/spigot/table3_sst.md (+ _time.md)
	$(BIN)/python -m latentstruct.train --multirun +sweep=spigot_sst 'trainer.seed=$(SST_SEEDS)' $(SST_ARGS) $(SWEEP)
	$(BIN)/python -m latentstruct.tables experiments/spigot/table3_sst.yaml --runs $(RUNS)/spigot_sst
	$(BIN)/python -m latentstruct.tables experiments/spigot/table3_sst_time.yaml --runs $(RUNS)/spigot_sst
	mkdir -p results/spigot/trees
	for m in marginals sparsemap perturb_and_map ste_s ste_i spigot spigot_ce spigot_eg; do \
		run=$$(ls -d "$(RUNS)/spigot_sst/+experiment=sst/$$m,"*trainer.seed=301 2>/dev/null | head -1); \
		[ -z "$$run" ] || { echo "run: $$run"; $(BIN)/python -m latentstruct.show_trees "$$run" "$(SST_TREE)" \
			--out results/spigot/trees/$$m.png; } > results/spigot/trees/$$m.txt; \
	done

table-spigot-snli: install ## seed 001 Table 3, SNLI (needs SNLI 1.0 train) -> results/spigot/table3_snli.md (+ _time.md)
	@# Failed runs (e.g. without the SNLI training split) still make a table, which lists their errors.
	$(BIN)/python -m latentstruct.train --multirun +sweep=spigot_snli 'trainer.seed=$(SNLI_SEEDS)' $(SNLI_ARGS) $(SWEEP) \
		|| echo "*** some SNLI runs failed: see the table's list of errors"
	$(BIN)/python -m latentstruct.tables experiments/spigot/table3_snli.yaml --runs $(RUNS)/spigot_snli --allow-empty
	$(BIN)/python -m latentstruct.tables experiments/spigot/table3_snli_time.yaml --runs $(RUNS)/spigot_snli \
		--allow-empty

table-direct-sorting: direct-sorting direct-sorting-time ## seed 002 sorting numbers: accuracy by d and time per step -> results/direct/

direct-sorting: install ## 4 methods x d in {5,...,100} x SORT_SEEDS repetitions -> results/direct/sorting.md
	$(BIN)/python -m latentstruct.train --multirun +sweep=direct_sorting 'trainer.seed=$(SORT_SEEDS)' $(SWEEP)
	$(BIN)/python -m latentstruct.tables experiments/direct/sorting.yaml --runs $(RUNS)/direct_sorting
	$(BIN)/python -m latentstruct.figures setting-curves --spec experiments/direct/sorting.yaml --runs $(RUNS)/direct_sorting \
		--metric test/acc --out results/direct/sorting.png

direct-sorting-time: install ## 200 timed steps per method at d in {10,40,100}, one run at a time -> results/direct/sorting_time.md
	$(BIN)/python -m latentstruct.train --multirun +sweep=direct_sorting_time hydra/launcher=joblib hydra.launcher.n_jobs=1 \
		trainer.threads=1 trainer.progress=false trainer.resume=true paths.multirun_dir=$(RUNS)
	$(BIN)/python -m latentstruct.tables experiments/direct/sorting_time.yaml --runs $(RUNS)/direct_sorting_time

table-direct-knn: install ## seed 002 k-NN: 5 methods x k in {1,3,5,9} on KNN_DATASET -> results/direct/knn.md, knn_time.md
	$(BIN)/python -m latentstruct.train --multirun +sweep=direct_knn dataset=$(KNN_DATASET) $(KNN_ARGS) $(SWEEP)
	$(BIN)/python -m latentstruct.tables experiments/direct/knn.yaml --runs $(RUNS)/direct_knn
	$(BIN)/python -m latentstruct.tables experiments/direct/knn_time.yaml --runs $(RUNS)/direct_knn
	$(BIN)/python -m latentstruct.figures setting-curves --spec experiments/direct/knn.yaml --runs $(RUNS)/direct_knn \
		--metric test/acc --out results/direct/knn.png

table-direct-vae: install ## seed 003 semi-supervised VAE: direct vs GSM x 5 label counts on VAE_DATASET -> results/direct/vae.md
	$(BIN)/python -m latentstruct.train --multirun +sweep=direct_vae dataset=$(VAE_DATASET) 'trainer.seed=$(VAE_SEEDS)' $(VAE_ARGS) $(SWEEP)
	$(BIN)/python -m latentstruct.tables experiments/direct/vae.yaml --runs $(RUNS)/direct_vae
	$(BIN)/python -m latentstruct.figures setting-curves --spec experiments/direct/vae.yaml --runs $(RUNS)/direct_vae \
		--metric test/acc --out results/direct/vae.png

table-listops: install ## issue #7 ListOps: LSTM, gold trees, merge parsers, chart x 7 estimators -> results/listops/
	$(BIN)/python -m latentstruct.train --multirun +sweep=listops_chart 'trainer.seed=$(LISTOPS_CHART_SEEDS)' $(LISTOPS_ARGS) \
		$(LISTOPS_CHART_ARGS) $(SWEEP)
	$(BIN)/python -m latentstruct.train --multirun +sweep=listops 'trainer.seed=$(LISTOPS_SEEDS)' $(LISTOPS_ARGS) $(SWEEP)
	$(BIN)/python -m latentstruct.listops_report self-f1 --runs $(RUNS)/listops
	$(BIN)/python -m latentstruct.tables experiments/listops/table.yaml --runs $(RUNS)/listops
	$(BIN)/python -m latentstruct.listops_report reference-trees --runs $(RUNS)/listops --out results/listops/reference_trees.md
	$(BIN)/python -m latentstruct.listops_report figure --runs $(RUNS)/listops --out results/listops/trees.png

table-energy-mlc: install ## seed 004 Table 1 + 5: 7 methods x MLC_DATASETS x MLC_SEEDS -> results/energy/mlc.md, mlc_time.md, mlc_curves.png
	$(BIN)/python -m latentstruct.train --multirun +sweep=energy_mlc 'dataset=$(MLC_DATASETS)' 'trainer.seed=$(MLC_SEEDS)' \
		$(MLC_ARGS) $(SWEEP)
	$(BIN)/python -m latentstruct.tables experiments/energy/mlc.yaml --runs $(RUNS)/energy_mlc
	$(BIN)/python -m latentstruct.tables experiments/energy/mlc_time.yaml --runs $(RUNS)/energy_mlc
	$(BIN)/python -m latentstruct.figures row-curves --spec experiments/energy/mlc.yaml --metric valid/acc \
		--runs $(RUNS)/energy_mlc --out results/energy/mlc_curves.png

table-energy-ner: install ## seed 004 Table 3: 9 methods x NER / NER+ x NER_SEEDS on CoNLL-2003 -> results/energy/ner.md, ner_curves.png
	$(BIN)/python -m latentstruct.train --multirun +sweep=energy_ner 'trainer.seed=$(NER_SEEDS)' $(NER_ARGS) $(SWEEP)
	$(BIN)/python -m latentstruct.tables experiments/energy/ner.yaml --runs $(RUNS)/energy_ner
	$(BIN)/python -m latentstruct.figures row-curves --spec experiments/energy/ner.yaml --metric valid/acc \
		--runs $(RUNS)/energy_ner --out results/energy/ner_curves.png

table-energy-pos: install ## seed 004 Table 9: 9 methods x POS_SEEDS on Twitter POS -> results/energy/pos.md, pos_curves.png
	$(BIN)/python -m latentstruct.train --multirun +sweep=energy_pos 'trainer.seed=$(POS_SEEDS)' $(POS_ARGS) $(SWEEP)
	$(BIN)/python -m latentstruct.tables experiments/energy/pos.yaml --runs $(RUNS)/energy_pos
	$(BIN)/python -m latentstruct.figures row-curves --spec experiments/energy/pos.yaml --metric valid/acc \
		--runs $(RUNS)/energy_pos --out results/energy/pos_curves.png

$(BENCH_DEPS)/.installed:
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --target $(BENCH_DEPS) \
		supar==1.1.4 torch-struct==0.5 nltk dill regex
	touch $@

bench-structures: install $(BENCH_DEPS)/.installed ## time every structure vs SuPar / torch-struct -> results/bench/ (BENCH_DEVICE=cuda on a GPU; BENCH_BASELINE=645b4f9: before / after)
	PYTHONPATH=$(BENCH_DEPS) $(BIN)/python -W ignore::UserWarning bench/structures.py --device $(BENCH_DEVICE) \
		$(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE)) --out results/bench/structures$(if $(filter-out cpu,$(BENCH_DEVICE)),_$(BENCH_DEVICE)).md

bench-layers: install ## one training step of the SST / ListOps configurations -> results/bench/layers.md (BENCH_BASELINE=645b4f9: before / after)
	$(BIN)/python bench/layers.py $(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE)) $(BENCH_LAYERS_ARGS) \
		--out results/bench/layers.md

clean: ## remove caches and single-run outputs (keeps .venv and multirun/)
	rm -rf outputs .pytest_cache .ruff_cache
