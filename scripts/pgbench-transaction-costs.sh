#!/usr/bin/env bash
# What a transaction costs the server next to what a row costs, the reason cluster mode batches:
# `pgbench` (3 clients, 6 s each, prepared statements, commits that do not wait for the disk,
# as the lease statements commit) runs, on a table of 10,000 rows shaped like the lease table:
#   - advisory: `pg_advisory_lock` then `pg_advisory_unlock` of a random key (two statements);
#   - update-1: an UPDATE of one random row (one transaction);
#   - update-8: an UPDATE of eight rows in one statement (one transaction).
# Prints each one's transactions per second.
#
# Needs PostgreSQL on 127.0.0.1:5432 (or DATABASE_URL), psql and pgbench. Usage:
#   bash scripts/pgbench-transaction-costs.sh
set -euo pipefail
url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
table=keyed_locks_pgbench_rows
scripts="$(mktemp -d)"
trap 'rm -rf "$scripts"' EXIT
psql -q "$url" <<SQL
SET client_min_messages = warning;
DROP TABLE IF EXISTS $table;
CREATE TABLE $table (key text PRIMARY KEY, owner text, fence bigint NOT NULL,
                     expires_at timestamptz NOT NULL, wanted boolean NOT NULL DEFAULT false);
INSERT INTO $table SELECT 'k' || n, NULL, 1, clock_timestamp() FROM generate_series(1, 10000) n;
VACUUM ANALYZE $table;
SQL
cat >"$scripts/advisory.sql" <<'SQL'
\set k random(1, 10000)
SELECT pg_advisory_lock(:k);
SELECT pg_advisory_unlock(:k);
SQL
cat >"$scripts/update-1.sql" <<SQL
\set k random(1, 10000)
UPDATE $table SET expires_at = clock_timestamp() WHERE key = 'k' || :k;
SQL
cat >"$scripts/update-8.sql" <<SQL
\set k random(1, 9993)
UPDATE $table SET expires_at = clock_timestamp()
WHERE key = ANY(ARRAY['k' || :k, 'k' || (:k + 1), 'k' || (:k + 2), 'k' || (:k + 3),
                      'k' || (:k + 4), 'k' || (:k + 5), 'k' || (:k + 6), 'k' || (:k + 7)]);
SQL
for name in advisory update-1 update-8; do
  tps=$(PGOPTIONS="-c synchronous_commit=off" pgbench -n -M prepared -c 3 -j 3 -T 6 \
    -f "$scripts/$name.sql" "$url" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  printf '%-9s %s transactions/s\n' "$name" "${tps%.*}"
done
psql -q "$url" -c "DROP TABLE $table"
