#!/usr/bin/env bash
# Measures what local hand-off (lock cohorting) saves in cluster mode: three processes of
# `examples/cluster_load.rs` (8 tasks each, 50 locks per task, 1 ms held) contend on one key,
# once with the default bound of 15 local hand-offs per lease and once with none (every lock
# a round trip to the database). Prints, per run, the lease acquisitions (the row's fence),
# the wall time, and each process's longest wait.
#
# Needs PostgreSQL on 127.0.0.1:5432 (or DATABASE_URL) and psql. Usage:
#   bash scripts/cluster-cohorting.sh
set -euo pipefail
cd "$(dirname "$0")/.."
url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
# Cargo says where the binary is: `CARGO_TARGET_DIR` may put it anywhere.
binary="$(cargo build --quiet --release --features postgres --example cluster_load \
  --message-format=json | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')"
for handoffs in 15 0; do
  prefix="keyed_locks_cohorting_${handoffs}_"
  psql -q "$url" -c "DROP TABLE IF EXISTS ${prefix}leases, ${prefix}fences, ${prefix}run" 2>/dev/null
  start=$(date +%s%N)
  for _ in 1 2 3; do
    "$binary" --database-url "$url" --prefix "$prefix" --key hot \
      --tasks 8 --locks 50 --max-local-handoffs "$handoffs" &
  done
  wait
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  fence=$(psql -tA "$url" -c "SELECT fence FROM ${prefix}leases WHERE key = 'hot'")
  echo "max_local_handoffs=$handoffs grants=1200 lease_acquisitions=$fence wall_ms=$elapsed_ms"
done
