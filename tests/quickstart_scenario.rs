//! The quickstart's story: two tasks for user 42, the second starting 10 ms after the first, run one
//! after the other, and no lock is left in memory afterwards.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyed_locks::LockRegistry;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn two_requests_for_one_user_run_one_after_the_other_and_leave_no_lock() {
    let registry = LockRegistry::spawn();
    let log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();

    let process = |registry: LockRegistry<u64>, log: Arc<Mutex<Vec<String>>>| async move {
        let _guard = registry.lock(42).await.unwrap();
        let at = |what: &str| format!("{what} at {}ms", start.elapsed().as_millis());
        log.lock().unwrap().push(at("start"));
        tokio::time::sleep(Duration::from_millis(500)).await;
        log.lock().unwrap().push(at("finish"));
    };

    let first = tokio::spawn(process(registry.clone(), log.clone()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second = tokio::spawn(process(registry.clone(), log.clone()));
    first.await.unwrap();
    second.await.unwrap();

    assert_eq!(
        *log.lock().unwrap(),
        [
            "start at 0ms",
            "finish at 500ms",
            "start at 500ms",
            "finish at 1000ms"
        ]
    );
    assert_eq!(registry.stats().await.unwrap().keys, 0);
}
