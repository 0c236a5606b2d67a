//! Not a behaviour: where the tests that run an example as a process find its binary.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The binary of example `name`, next to this test binary's directory
/// (`target/<profile>/examples`). `cargo test` builds the examples with everything else;
/// `cargo test --test main` alone does not, so this refuses a binary that is missing or older
/// than one of the example's sources (`examples/<name>.rs`, or the files of
/// `examples/<name>/`). `features` is what to build it with, for the message.
pub fn example_binary(name: &str, features: &str) -> PathBuf {
    let build_it = format!(
        "run `cargo build --example {name}{features}` first (`cargo test{features}` builds the \
         examples itself; `cargo test --test main` does not)"
    );
    let test_binary = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test_binary
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let binary = profile_dir.join("examples").join(name);
    let built =
        modified(&binary).unwrap_or_else(|| panic!("{} is missing: {build_it}", binary.display()));
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let single_file = examples.join(format!("{name}.rs"));
    let sources: Vec<PathBuf> = if single_file.exists() {
        vec![single_file]
    } else {
        std::fs::read_dir(examples.join(name))
            .expect("the example's sources")
            .map(|source| source.expect("a source file").path())
            .collect()
    };
    for source in sources {
        assert!(
            modified(&source) <= Some(built),
            "{} is older than {}: {build_it}",
            binary.display(),
            source.display()
        );
    }
    binary
}

fn modified(path: &Path) -> Option<SystemTime> {
    path.metadata()
        .and_then(|metadata| metadata.modified())
        .ok()
}
