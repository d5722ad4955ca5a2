//! Shared by the lab's and the CLI's root-only tests (`#[path]` modules of both).

/// Fails a test that needs root and cannot run here; `reason` says what is missing. Such a test
/// runs only where it was built to run (as root with `CAP_SYS_ADMIN`, or with
/// `BULKCAST_REQUIRE_ROOT=1`: `build/root_tests.rs`) or when `--ignored` asks for it, so it must
/// fail, never pass without running.
pub fn root_test_cannot_run(test: &str, reason: &str) -> ! {
    match option_env!("BULKCAST_ROOT_TESTS_WHY") {
        Some(why) => panic!(
            "{test} did not run: {reason}. It was built to run because {why}, so it fails rather \
             than pass; built without root (or CAP_SYS_ADMIN) and without \
             BULKCAST_REQUIRE_ROOT=1, it is marked ignored instead"
        ),
        None => panic!("{test} did not run: {reason} (it ran because --ignored asked for it)"),
    }
}
