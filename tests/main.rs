//! The integration tests, one module per behaviour, each stating its rule in its first line.
//! One binary, so that the suite links tokio, kameo and proptest once.

mod acquisition_spans;
mod actor_death;
mod blocking;
mod bounds;
mod cancel_safety;
// Not a behaviour: the registry configurations a test runs in when it must hold in each.
#[cfg(feature = "postgres")]
mod cluster_blocking;
#[cfg(feature = "postgres")]
mod cluster_jobs;
#[cfg(feature = "postgres")]
mod cluster_lock_all;
#[cfg(feature = "postgres")]
mod cluster_permits;
#[cfg(feature = "postgres")]
mod cluster_processes;
#[cfg(feature = "postgres")]
mod cluster_rate_limit;
#[cfg(feature = "postgres")]
mod cluster_registry;
#[cfg(feature = "postgres")]
mod cluster_tls;
#[cfg(feature = "postgres")]
mod cluster_try_lock;
#[cfg(feature = "postgres")]
mod cluster_view;
mod configurations;
mod cooperative;
mod every_exit_releases;
// Not a behaviour: where the tests that run an example as a process find its binary.
mod example_binary;
mod exhaustive_small_scope;
mod fencing_tokens;
mod fifo;
mod journal;
mod lock_all;
mod message_api;
#[cfg(feature = "metrics")]
mod metrics_facade;
mod mutual_exclusion;
mod no_leak;
mod ordering;
mod payments_load;
mod payments_locks;
mod permits;
mod quickstart_scenario;
// Not a behaviour: the one model of the table's rules that `table_model` and
// `exhaustive_small_scope` check the real table against.
mod reference_model;
// Not a behaviour: a `tracing` layer that records events and spans, for the tests of what the
// registry reports.
mod recorder;
mod replay;
mod replay_fuzz;
mod replay_regressions;
mod run_on_caller;
mod shards;
mod shutdown;
mod shutdown_final;
mod snapshot;
mod stall_warnings;
mod table_model;
mod trace_json_lines;
mod tracing_events;
mod try_lock;
mod waiter_cancelled_after_release;
