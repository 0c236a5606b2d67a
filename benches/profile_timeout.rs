//! The timeout storm's lock call alone, for profilers: what one waiter that times out costs,
//! without a second worker, a timer or a scheduler in the way.
//!
//! One task, on a current-thread runtime, holds key 0 and times 200,000 rounds. Each round a
//! new `lock(0)` future is polled once (it queues) and gets a lifetime of 50 to 750 rounds
//! (seeded); the waiters whose lifetime ends are polled again (the last look a
//! `tokio::time::timeout` takes when its time is up) and dropped (the cancel). So each round is
//! one timed-out call, about 400 waiters are queued at any time, and most cancels land in the
//! middle of the queue, as the storm's timeouts of 0.2 to 3 ms make them land
//! (`benches/timeout_storm.rs`). It prints the time per call for every contender that queues,
//! ours first. Two are left out: `naive-actor` loses the grants of waiters that gave up, so the
//! key would stay held after the holder's release; and our actor mode, whose requests wait for
//! an actor task that never runs while this one task keeps polling, so that its figure would
//! be the inbox's alone. The polls run under `tokio::task::unconstrained`, so that no
//! contender's tokio budget turns a poll into a refusal partway.
//!
//! ```sh
//! cargo bench --bench profile_timeout
//! cargo bench --bench profile_timeout -- --contender keyed-locks --contender single-owner-owned
//! ```

mod command_line;
// Shared with the other benchmarks, which use the rest of it (their runtime, for one).
#[allow(dead_code)]
mod contenders;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use clap::Parser;
use contenders::Contender;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Rounds timed per contender.
const ROUNDS: u32 = 200_000;
/// The lifetimes of the queued waiters, in rounds: the longest 15 times the shortest, as the
/// storm's timeouts of 0.2 to 3 ms.
const LIFETIME: std::ops::Range<u32> = 50..750;

/// The timeout storm's lock call alone: time per timed-out call (queue, poll, cancel).
#[derive(Debug, Parser)]
#[command(args_override_self = true)]
struct Cli {
    /// Only these contenders (by name, repeatable) [default: every one that queues]
    #[arg(long, value_name = "NAME")]
    contender: Vec<String>,
    #[command(flatten)]
    runner: command_line::Runner,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli: Cli = command_line::parse();
    if !cli.runner.picks_this_program() {
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let wanted = |name: &str| {
        !["naive-actor", "keyed-locks-actor"].contains(&name)
            && (cli.contender.is_empty() || cli.contender.iter().any(|c| c == name))
    };
    let mut found = false;
    for_each_contender!(C => {
        if wanted(C::NAME) {
            found = true;
            match runtime.block_on(tokio::task::unconstrained(per_round::<C>()))? {
                Some(per_round) => println!(
                    "{}: {per_round:?} per timed-out call (queue, poll, cancel; about 400 \
                     queued)",
                    C::NAME
                ),
                None => println!("{}: does not queue (its lock never waits)", C::NAME),
            }
        }
    });
    if found {
        Ok(())
    } else {
        Err(format!("no contender is named {:?}", cli.contender).into())
    }
}

/// The time per round (one timed-out call) on a fresh `C`; `None` if its lock of a held key
/// does not wait; an error if it leaves entries behind.
async fn per_round<C: Contender>() -> Result<Option<Duration>, String> {
    let contender = C::new(1);
    let mut cx = Context::from_waker(Waker::noop());
    let held = contender.lock(0).await;
    let Some(per_round) = time_rounds(&contender, &mut cx) else {
        return Ok(None);
    };
    drop(held);
    let left = contender.entries().await;
    contender.close().await;
    match left {
        Some(0) | None => Ok(Some(per_round)),
        Some(left) => Err(format!("{} left {left} entries behind", C::NAME)),
    }
}

/// Times the rounds on `contender`, whose key 0 is held; `None` if a waiter's poll found the
/// key granted or its lock did not wait.
fn time_rounds<C: Contender>(contender: &C, cx: &mut Context<'_>) -> Option<Duration> {
    // Drawn before the clock starts; the same for every contender. The first `LIFETIME.end`
    // rounds fill the queue and are not timed.
    let warm_up = LIFETIME.end;
    let mut rng = StdRng::seed_from_u64(0);
    let lifetimes: Vec<u32> = (0..warm_up + ROUNDS)
        .map(|_| rng.random_range(LIFETIME))
        .collect();
    // The queued waiters by the round that drops them, round modulo the longest lifetime.
    let mut due: Vec<Vec<_>> = (0..LIFETIME.end).map(|_| Vec::new()).collect();
    let mut start = Instant::now();
    for (round, lifetime) in (0..).zip(lifetimes) {
        if round == warm_up {
            start = Instant::now();
        }
        due[((round + lifetime) % LIFETIME.end) as usize].push(queue(contender, cx)?);
        for mut timed_out in due[(round % LIFETIME.end) as usize].drain(..) {
            if timed_out.as_mut().poll(cx).is_ready() {
                return None;
            }
        }
    }
    Some(start.elapsed() / ROUNDS)
}

/// A `lock(0)` future of `contender`, polled once: `None` if that poll did not leave it
/// waiting.
fn queue<'c, C: Contender>(
    contender: &'c C,
    cx: &mut Context<'_>,
) -> Option<Pin<Box<impl Future<Output = C::Guard<'c>> + 'c>>> {
    let mut future = Box::pin(contender.lock(0));
    match future.as_mut().poll(cx) {
        Poll::Pending => Some(future),
        Poll::Ready(_) => None,
    }
}
