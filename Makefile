# The two commands: `make run` serves on 127.0.0.1:50051, `make test` runs every test.
# Both install PostgreSQL and Redis from Debian's packages when missing and start private
# instances under .local/ on their own ports.

SERVICES := deploy/local/services.sh

.PHONY: run test drill model model-mutants bench bench-compare lab chaos lint stop build clients

run: ## Start PostgreSQL and Redis, migrate, seed demo SKUs and serve (Ctrl-C stops all)
	@$(SERVICES) run

test: ## Run the whole test suite against throwaway PostgreSQL and Redis
	@$(SERVICES) test

drill: ## The restore drill alone: base backup and WAL archive under traffic, point-in-time recovery into a new cluster, the service on it (part of `make test` too)
	@TEST_FILTER=drill:: $(SERVICES) test

model: ## The reference model's long run: MODEL_RUNS=200 sequences of MODEL_CALLS=80 calls from a random MODEL_SEED (printed first; MODEL_STRICT=1 adds the stricter rules)
	@$(SERVICES) model

model-mutants: ## The mutation score: each hand-written defect of crates/inventory-model/mutants.txt in a scratch copy of HEAD, caught or missed by the model's sequential short profile (~30 s a mutant after the first build)
	@$(SERVICES) model-mutants

bench: ## Benchmark suite: pgbench's raw-SQL ceiling against the service, as ratios, medians of BENCH_ROUNDS=3 rounds (~30 min)
	@$(SERVICES) bench

bench-compare: ## The service now against git revision BASELINE, sides alternating, as ratios (BENCH_ROUNDS=3, BENCH_CLIENTS=, BENCH_SCENARIOS=uniform,hot, BENCH_REPLICAS=1)
	@$(SERVICES) bench-compare "$(BASELINE)"

lab: ## The failure lab: the last unit sold twice the naive way, never by the service (timelines, target/lab/index.html)
	@$(SERVICES) lab

chaos: ## Fault suite: 3 replicas, Redis single/Sentinel/Cluster and PostgreSQL failover (pg-failover), seeded faults, history checker (DURATION=3m per topology, SEED=, TOPOLOGIES=; TOPOLOGIES=rolling-upgrade rolls from PREVIOUS, default the commit before the newest migration)
	@$(SERVICES) chaos

lint: ## Formatting, clippy (warnings denied), the proto (buf lint and breaking), Dockerfile, manifests and alert rules
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	@$(SERVICES) lint-proto
	@$(SERVICES) lint-deploy

clients: ## Python and TypeScript clients (clients/): install their pinned dependencies, generate their code from proto/
	@$(SERVICES) clients

stop: ## Stop what `make run`, `make test` or `make bench` started
	@$(SERVICES) stop

build:
	cargo build --workspace --locked
