# latentstruct — `make help` lists every target.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Installed before the package so that pip never resolves a newer, multi-GB CUDA build of torch.
TORCH ?= torch==2.13.0
JOBS ?= $(shell nproc)
# make test: pytest-xdist workers (each test runs on one torch thread)
TEST_JOBS ?= $(shell nproc)
RUNS := multirun
# make table: T=<paper>/<table> of experiments/ (its spec's `reproduce` block: sweeps, then tables, figures and extra
# steps; latentstruct/report/reproduce.py). SEEDS: trainer.seed of its sweeps (default: the spec's). ARGS: more Hydra
# overrides; one written <sweep>:<override> sets that sweep only (ListOps: ARGS='listops_chart:trainer.seed=301').
# RESULTS: where the tables and figures go. Default: results/ for the spec's own protocol (no SEEDS, no ARGS), else
# the git-ignored scratch/results/, so that a trial never overwrites a committed table (RESULTS=results: on purpose).
# `make -n table T=...` prints the commands. A table ends by refreshing <that folder>/README.md from the tables' JSON
# sidecars, as `make report` does, and says where it wrote; each table's "regenerate with" is the command that made it.
# The aliases (table-spigot-sst, ...) take the same SEEDS / ARGS; table-spigot-synthetic and table-direct-sorting pass
# them to both their parts.
T ?=
SEEDS ?=
ARGS ?=
RESULTS ?=
# The folder make table writes to (as latentstruct.report.reproduce.results_dir decides), for the targets beside it.
RESULTS_DIR = $(or $(RESULTS),$(if $(strip $(SEEDS)$(ARGS)),scratch/results,results))
# ONLY=steps: the tables of the runs already there, no run launched (runs brought back from a GPU machine);
# ONLY=sweeps: the runs alone. FROM: a folder of files a device call brought back (make gpu-results, gpu-unpack).
ONLY ?=
FROM ?=
export SEEDS ARGS
DRY = $(if $(findstring n,$(firstword -$(MAKEFLAGS))),--dry-run)
$(if $(filter table,$(MAKECMDGOALS)),$(if $(T),,$(error usage: make table T=<paper>/<table> [SEEDS=...] [ARGS='...'] (make help lists T))))
# The per-table variables these targets took before `make table` stop make, not silently run the full protocol.
REPLACED := INNER_SEEDS SORT_SEEDS KNN_DATASET KNN_ARGS SST_SEEDS SST_ARGS SST_TREE SNLI_SEEDS SNLI_ARGS VAE_DATASET \
	VAE_SEEDS VAE_ARGS LISTOPS_SEEDS LISTOPS_CHART_SEEDS LISTOPS_ARGS LISTOPS_CHART_ARGS MLC_DATASETS MLC_SEEDS MLC_ARGS \
	NER_SEEDS NER_ARGS POS_SEEDS POS_ARGS
$(foreach v,$(REPLACED),$(if $(filter command line environment,$(origin $(v))),\
	$(error $(v) is gone: SEEDS=... and ARGS='...' replace it (a dataset: ARGS=dataset=...); see docs/reference.md)))
# Real datasets: one rule for make, python -m, the library and the tests: $LATENTSTRUCT_DATA, else paths.data_dir
# (default data/ under the working directory); make sets neither (docs/reference.md, Data).
# Reference libraries for the benchmarks only (never dependencies of latentstruct), installed beside .venv.
BENCH_DEPS := .bench
BENCH_DEVICE ?= cpu
# bench-structures / bench-layers: a git revision to time beside the current tree (empty: the current tree only),
# e.g. BENCH_BASELINE=645b4f9 for the before / after tables; BENCH_LAYERS_ARGS: more options of bench/layers.py
# (--only ner: the NER rows); BENCH_LAYERS_OUT: its page.
BENCH_BASELINE ?=
BENCH_LAYERS_ARGS ?=
BENCH_LAYERS_OUT ?= results/bench/layers.md
# bench-cpu: more options of bench/tables.py, e.g. BENCH_CPU_ARGS='--tables listops/table --config-seconds 900'
BENCH_CPU_ARGS ?=
# bench-implicit: more options of bench/implicit.py (e.g. --datasets bibtex --rounds 5), and the page it writes
BENCH_IMPLICIT_ARGS ?=
BENCH_IMPLICIT_OUT ?= results/bench/implicit.md

.DEFAULT_GOAL := help
.PHONY: help install run test lint campaign table table-spigot-synthetic spigot-table2 spigot-inner-steps table-direct-sorting \
	direct-sorting direct-sorting-time table-direct-knn table-direct-vae table-direct-vae-unsupervised ablation-vae-direct-anneal ablation-sorting-sigma-lr table-listops \
	table-energy-mlc table-energy-ner table-energy-pos table-energy-citation ablation-citation-lambda ablation-citation-energies ablation-ner-infnet ablation-pos-infnet ablation-ner-infnet-energies ablation-pos-infnet-energies table-spigot-sst ablation-spigot-ce table-spigot-snli report reliability \
	table-lab-gradients table-lab-matrix table-lab-planted bench-structures bench-layers bench-replay bench-compose bench-cpu bench-implicit bench-suite \
	device-bundle gpu-check-dry gpu-results gpu-unpack \
	gpu-stage clean

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-26s %s\n", $$1, $$2}'
	@echo "  T of make table: $$(grep -l '^reproduce:' experiments/*/*.yaml | sed 's|^experiments/||; s|\.yaml$$||' | xargs)"

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(TORCH)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,sweep,slurm,wandb]'
	touch $@

install: $(BIN)/.installed ## create .venv (if absent) and install torch, then latentstruct with its dev, sweep, slurm and wandb extras

run: install ## install if needed, then run the default experiment (synthetic clusters, SPIGOT, CPU, < 1 min)
	$(BIN)/python -m latentstruct.train

campaign: install ## the reproduction campaign, each table at its pinned commit (docs/reference.md#the-campaign): C='run spigot/table3_sst' (default: status)
	$(BIN)/python -m scripts.campaign $(or $(C),status)

test: install ## install if needed, then run the fast test suite, one worker per core (< 8 min on 2 cores)
	$(BIN)/python -m pytest -n $(TEST_JOBS) --durations=15

lint: install ## ruff on the package and the tests
	$(BIN)/ruff check latentstruct tests reliability

table: install ## any table from its spec: make table T=spigot/table3_sst SEEDS=301 ARGS='trainer.max_epochs=2'
	+$(BIN)/python -m latentstruct.report.reproduce $(T) --seeds "$$SEEDS" --args "$$ARGS" --runs $(RUNS) \
		$(if $(RESULTS),--results $(RESULTS)) --jobs $(JOBS) $(if $(ONLY),--only $(ONLY)) --made-by make $(DRY)

table-spigot-synthetic: spigot-table2 spigot-inner-steps ## seed 001 Table 2 + Figures 2-3 into results/spigot/

spigot-table2: ## Table 2 (13 methods x K in {3,10} x 4 seeds) and Figure 2 (learning curves)
	@$(MAKE) --no-print-directory table T=spigot/table2

spigot-inner-steps: ## Figure 3: k in {1,5,10} inner steps x eta grid, best eta per k, at K = 10 (seeds 301-304)
	@$(MAKE) --no-print-directory table T=spigot/figure3_inner_steps

table-spigot-sst: ## seed 001 Table 3, SST: 9 methods x seeds 301-303 -> results/spigot/table3_sst.md (+ _time.md, trees/)
	@$(MAKE) --no-print-directory table T=spigot/table3_sst

ablation-spigot-ce: install ## SST's SPIGOT-CE row ablated (its projection's cap): interior / zero pull-backs at the table's pinned code, ~1.5 CPU-h; ONLY=summary runs none -> results/spigot/table3_sst_spigot_ce_ablation.md
	nice -n 5 $(BIN)/python scripts/spigot_ce_probe.py ablation $(if $(ONLY),--only $(ONLY))

table-spigot-snli: ## seed 001 Table 3, SNLI (needs SNLI 1.0 train) -> results/spigot/table3_snli.md (+ _time.md)
	@$(MAKE) --no-print-directory table T=spigot/table3_snli

table-direct-sorting: direct-sorting direct-sorting-time ## seed 002 sorting numbers: accuracy by d and time per step -> results/direct/

direct-sorting: ## 4 methods x d in {5,...,100} x seeds 301-310 -> results/direct/sorting.md
	@$(MAKE) --no-print-directory table T=direct/sorting

direct-sorting-time: ## 200 timed steps per method at d in {10,40,100}, one run at a time -> results/direct/sorting_time.md
	@$(MAKE) --no-print-directory table T=direct/sorting_time

table-direct-knn: ## seed 002 k-NN: 5 methods x k in {1,3,5,9} on MNIST (ARGS=dataset=...) -> results/direct/knn.md, knn_time.md
	@$(MAKE) --no-print-directory table T=direct/knn

table-direct-vae: ## seed 003 semi-supervised VAE: direct vs GSM x 5 label counts on MNIST and Fashion-MNIST -> results/direct/vae.md
	@$(MAKE) --no-print-directory table T=direct/vae

table-direct-vae-unsupervised: ## seed 003 unsupervised discrete VAE: direct, GSM, ST, exact, SFE x K=10,50; bits -> results/direct/vae_unsupervised.md
	@$(MAKE) --no-print-directory table T=direct/vae_unsupervised

ablation-vae-direct-anneal: install ## the unsupervised VAE's direct rows with |eps| annealed faster (rates 1e-4, 3.5e-4 at K = 10, 50; 3.5e-4 on 20 bits; 20 epochs) at the table's pinned code, ~0.8 CPU-h; ONLY=summary runs none -> results/direct/vae_unsupervised_direct_anneal.md
	nice -n 5 $(BIN)/python -m scripts.ablation vae-direct-anneal $(if $(ONLY),--only $(ONLY))

ablation-ner-infnet: install ## NER's InfNet (seeds 301-303) forked at the end of pretraining: 6 method epochs as run, with the energy frozen, with the inference networks' lr 1e-4, with their cross-entropy (InfNet+), at the first commit with trainer.init_from, ~3 CPU-h; SEEDS=301,302 those alone; ONLY=summary runs none -> results/energy/ner_infnet_ablation.md
	nice -n 5 $(BIN)/python -m scripts.ablation ner-infnet $(if $(ONLY),--only $(ONLY)) $(if $(SEEDS),--seeds $(SEEDS))

ablation-pos-infnet: install ## the same ablation of Twitter POS's InfNet (seeds 301-303; 42 batches an epoch), ~15 CPU-min; ONLY=summary runs none -> results/energy/pos_infnet_ablation.md
	nice -n 5 $(BIN)/python -m scripts.ablation pos-infnet $(if $(ONLY),--only $(ONLY)) $(if $(SEEDS),--seeds $(SEEDS))

ablation-ner-infnet-energies: install ## where the energy of ablation-ner-infnet's runs puts its minimum (scripts/energy_probe.py: A's and the energy's exact minimum's F1 and token accuracy, where the energy ranks the gold, per arm at its last step, and of the as-run arm after one method epoch: a fork of each base stopped there, 3 runs); trains only those where the runs' weights are here (~15 min), else makes every run again (~3 CPU-h); ONLY=summary refuses to -> results/energy/ner_infnet_energies.md
	nice -n 5 $(BIN)/python -m scripts.ablation ner-infnet-energies $(if $(ONLY),--only $(ONLY))

ablation-pos-infnet-energies: install ## the same probe of ablation-pos-infnet's runs, of the as-run arm at each method epoch (forks of the base stopped there) and of four arms of its own (lambda 0, cost per token, the energy's lr 1e-4, the inference networks' lr 1e-2): 27 runs, ~45 CPU-min -> results/energy/pos_infnet_energies.md
	nice -n 5 $(BIN)/python -m scripts.ablation pos-infnet-energies $(if $(ONLY),--only $(ONLY))

ablation-sorting-sigma-lr: install ## sorting's learned sigma with its SGD lr raised (1e-4, 1e-2; d = 100, seeds 301-303) at the table's pinned code, ~0.5 CPU-h; ONLY=summary runs none -> results/direct/sorting_sigma_lr.md
	nice -n 5 $(BIN)/python -m scripts.ablation sorting-sigma-lr $(if $(ONLY),--only $(ONLY))

table-listops: ## issue #7 ListOps: LSTM, gold trees, merge parsers, chart x 7 estimators -> results/listops/
	@$(MAKE) --no-print-directory table T=listops/table

table-energy-mlc: ## seed 004 Table 1 + 5: 7 methods x bibtex, delicious x 3 seeds -> results/energy/mlc.md, mlc_time.md, mlc_curves.png
	@$(MAKE) --no-print-directory table T=energy/mlc

table-energy-ner: ## seed 004 Table 3: 9 methods x NER / NER+ x 3 seeds on CoNLL-2003 -> results/energy/ner.md, ner_curves.png
	@$(MAKE) --no-print-directory table T=energy/ner

table-energy-pos: ## seed 004 Table 9: 9 methods x 3 seeds on Twitter POS -> results/energy/pos.md, pos_curves.png
	@$(MAKE) --no-print-directory table T=energy/pos

table-energy-citation: ## seed 004 Table 4: floor, GE, R-SPEN, L_DVN, L_CD x 5/10/50 labelled Cora citations x 3 seeds -> results/energy/citation.md, citation_rules.md
	$(BIN)/python -m latentstruct.data.citation_rules --out $(RESULTS_DIR)/energy/citation_rules.md
	@$(MAKE) --no-print-directory table T=energy/citation

ablation-citation-lambda: install ## L_CD at 5, 10 and 50 labelled citations without eq. 6's lambda E(x, A(x)), without the implicit term alone, and with a von Neumann series (20 terms) for MINRES, at the citation table's pinned code, ~2.5 CPU-h; ONLY=summary runs none -> results/energy/citation_lambda_ablation.md
	nice -n 5 $(BIN)/python -m scripts.ablation citation-lambda $(if $(ONLY),--only $(ONLY))

ablation-citation-energies: install ## what the citation table's trained energies prefer (their exact minima, the gold's and A's rank): its L_CD and floor runs and the citation-lambda variants, at the table's pinned code; trains nothing where the runs' weights are here, ~2 min -> results/energy/citation_energies.md
	nice -n 5 $(BIN)/python -m scripts.ablation citation-energies $(if $(ONLY),--only $(ONLY))

table-lab-gradients: install ## the gradient microscope: every estimator x structure against the exact expected-loss gradient, at the enumerable sizes and n = 10, 30 (tags, trees; ~40-60 min) -> results/lab/gradients.md, .csv, .png
	$(BIN)/python -m latentstruct.diagnose --sizes 10 30 --out results/lab/gradients.md

table-lab-planted: install ## the planted tasks' calibration: gold, symmetry-moved and random latents through the data's read-out -> results/lab/planted.md
	$(BIN)/python -m latentstruct.data.planted --out results/lab/planted.md

table-lab-matrix: install ## every estimator x planted structure, lr/eta chosen on valid, 4 seeds; reruns only what is missing -> results/lab/matrix.md, .csv, .png
	+$(BIN)/python -m latentstruct.report.matrix --runs $(RUNS) --results $(or $(RESULTS),results) --jobs $(JOBS) $(DRY)

reliability: install ## fault-injection suite: kills, stop signals, kills mid-write, concurrent launchers, damaged files, bad values -> results/reliability.md (~12 min)
	$(BIN)/python -m reliability --out results/reliability.md

report: install ## results/README.md: a line per table (status vs the paper's protocol, cells within tolerance, headline) from the JSON beside each table
	$(BIN)/python -m latentstruct.report.report --results $(or $(RESULTS),results) $(if $(BEFORE),--before $(BEFORE))

$(BENCH_DEPS)/.installed:
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --target $(BENCH_DEPS) \
		supar==1.1.4 torch-struct==0.5 nltk dill regex
	touch $@

bench-structures: install $(BENCH_DEPS)/.installed ## time every structure vs SuPar / torch-struct -> results/bench/ (BENCH_DEVICE=cuda on a GPU; BENCH_BASELINE=645b4f9: before / after)
	PYTHONPATH=$(BENCH_DEPS) $(BIN)/python -W ignore::UserWarning bench/structures.py --device $(BENCH_DEVICE) \
		$(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE)) --out results/bench/structures$(if $(filter-out cpu,$(BENCH_DEVICE)),_$(BENCH_DEVICE)).md

bench-layers: install ## one training step of the SST / ListOps / NER configurations -> results/bench/layers.md (BENCH_BASELINE=645b4f9: before / after)
	$(BIN)/python bench/layers.py $(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE)) $(BENCH_LAYERS_ARGS) \
		--out $(BENCH_LAYERS_OUT)

bench-replay: install ## ListOps' Tree-LSTM replays (gold trees, PPO's composer): every pair vs the merged pair, one process -> results/bench/replay.md
	$(BIN)/python bench/replay.py --out results/bench/replay.md

bench-compose: install ## one Hydra composition, as Hydra comes and with latentstruct.compose_cache, one process -> results/bench/compose.md
	$(BIN)/python bench/compose.py --out results/bench/compose.md

bench-cpu: install ## the CPU plan: every paper table's configurations timed on one thread, each in its own capped process (resumes) -> results/bench/cpu.md, cpu.json
	nice -n 5 $(BIN)/python bench/tables.py --device cpu --threads 1 --resume --out results/bench/cpu.json $(BENCH_CPU_ARGS)
	$(BIN)/python bench/tables.py --page results/bench/cpu.json > results/bench/cpu.md

bench-suite: install ## .ci/run in a fresh clone of HEAD, idle and with one core busy (SUITE_ARGS='--conditions idle --pause-campaign') -> results/bench/suite.md
	$(BIN)/python bench/suite.py $(SUITE_ARGS) --out results/bench/suite.json
	$(BIN)/python bench/suite.py --page results/bench/suite.json > results/bench/suite.md

# ---- a GPU machine through the device tool (docs/gpu.md)
bench-implicit: install ## the energy methods' implicit gradient on NER, POS, bibtex: HVP, series, solvers' residuals and cost -> results/bench/implicit.md
	OMP_NUM_THREADS=1 $(BIN)/python bench/implicit.py --threads 1 $(BENCH_IMPLICIT_ARGS) --out $(BENCH_IMPLICIT_OUT)

device-bundle: install ## the wheels a GPU machine with torch lacks, the bench references, the data, a commit stamp -> .device/ (git-ignored; needs the package index)
	$(BIN)/python scripts/bundle.py build --out .device

gpu-check-dry: device-bundle ## scripts/gpu_check.sh --device cpu: the GPU check's dry run here, in a venv of the GPU image's packages + the bundle (OUT=<dir>, default a new temporary one)
	out=$${OUT:-$$(mktemp -d)}; OUT=$$out PYTHON=$(BIN)/python scripts/gpu_check.sh --device cpu && echo "the check's files: $$out"

gpu-results: ## results/bench/gpu.md and structures_cuda.md from the files gpu_check.sh brought back (FROM=<dir>; IMPLICIT=<implicit.json> of a later bench/implicit.py --device cuda call, where the check's step failed)
	$(if $(FROM),,$(error usage: make gpu-results FROM=<the folder of gpu_check.sh's files> [IMPLICIT=<implicit.json>] [NAME=gpu_timing]))
	$(BIN)/python scripts/gpu_report.py $(FROM) --out results/bench $(if $(IMPLICIT),--implicit $(IMPLICIT)) $(if $(NAME),--name $(NAME))

gpu-unpack: ## the run records and checkpoints gpu_table.sh brought back into multirun/ (FROM=<dir>); then make table T=... ONLY=steps
	$(if $(FROM),,$(error usage: make gpu-unpack FROM=<the folder of gpu_table.sh's files>))
	$(BIN)/python -m scripts.carry unpack $(FROM) --runs $(RUNS)

gpu-stage: ## what the next gpu_table.sh call on T carries: T's records and the interrupted runs' checkpoints that fit -> .device/state/ (prints the carry list)
	$(if $(T),,$(error usage: make gpu-stage T=<paper>/<table>))
	$(BIN)/python -m scripts.carry stage $(T) --runs $(RUNS)

clean: ## remove caches and single-run outputs (keeps .venv and multirun/)
	rm -rf outputs .pytest_cache .ruff_cache
