//! The MPI backend under `mpirun -np 4` (2 simulated nodes x 2 ranks on this host): every
//! collective checked, and what the job does when a rank dies, hangs or aborts.
//!
//! The ranks are this test binary itself: it compiles in examples/mpi_collectives.rs, and
//! `mpirun` starts it with the ignored test [`rank_process`] selected, which runs the example's
//! code with the arguments in `MPI_COLLECTIVES_ARGS`. So `cargo test --test mpi` needs no
//! other build, and the ranks always run the code under test. Jobs run one at a time: 4 ranks
//! already oversubscribe a 2-core machine.
//!
//! Needs OpenMPI's `mpirun` on the PATH (Debian: openmpi-bin, libopenmpi-dev).

#[allow(dead_code)]
#[path = "../examples/mpi_collectives.rs"]
mod collectives;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The environment variable that carries a rank's arguments.
const RANK_ARGS: &str = "MPI_COLLECTIVES_ARGS";

/// How long a job may take, failures included, before the test gives up on it.
const JOB_LIMIT: Duration = Duration::from_secs(60);

static ONE_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Not a test of its own: the body of each rank of the jobs that the tests start.
#[test]
#[ignore = "run by mpirun as the ranks of the other tests' jobs"]
fn rank_process() {
    let Ok(args) = std::env::var(RANK_ARGS) else {
        return;
    };
    let code = collectives::run_rank(args.split_whitespace().map(String::from).collect());
    std::process::exit(code);
}

/// How a job ended.
struct Job {
    /// mpirun's exit code (`None`: killed by a signal, or by this test at [`JOB_LIMIT`]).
    code: Option<i32>,
    /// stdout and stderr of mpirun and every rank, interleaved by line.
    output: String,
    took: Duration,
}

impl Job {
    /// Ranks that printed `rank R ok` (after the harness's "test rank_process ... ").
    fn ok_lines(&self) -> usize {
        (0..4)
            .filter(|r| {
                let ok = format!("rank {r} ok");
                self.output.lines().any(|l| l.ends_with(&ok))
            })
            .count()
    }
}

/// Runs `mpirun -np 4` of the ranks with `args`; `watch` sees the output so far every 50 ms
/// while the job runs (to act on it, such as killing a rank).
fn mpirun(args: &str, mut watch: impl FnMut(&str)) -> Job {
    let _one = ONE_JOB_AT_A_TIME
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let me = std::env::current_exe().expect("the test binary's path");
    let start = Instant::now();
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .args(["-x", RANK_ARGS])
        .arg(&me)
        .args(["rank_process", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(RANK_ARGS, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts (install openmpi-bin)");
    let output = Arc::new(Mutex::new(String::new()));
    let readers: Vec<_> = [
        Box::new(child.stdout.take().expect("piped")) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().expect("piped")),
    ]
    .into_iter()
    .map(|pipe| {
        let output = output.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(|l| l.ok()) {
                let mut out = output.lock().unwrap_or_else(PoisonError::into_inner);
                out.push_str(&line);
                out.push('\n');
            }
        })
    })
    .collect();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break Some(status);
        }
        if start.elapsed() > JOB_LIMIT {
            // mpirun is ours; killing it tears its ranks down.
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        watch(&output.lock().unwrap_or_else(PoisonError::into_inner));
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = start.elapsed();
    for reader in readers {
        let _ = reader.join();
    }
    let output = output
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Job {
        code: status.and_then(|s| s.code()),
        output,
        took,
    }
}

/// Asserts that the job failed, within [`JOB_LIMIT`], and that its output contains `needles`.
fn assert_failed(job: &Job, needles: &[&str]) {
    assert!(
        job.took < JOB_LIMIT,
        "the job still ran after {:?}:\n{}",
        job.took,
        job.output
    );
    assert_ne!(job.code, Some(0), "the job succeeded:\n{}", job.output);
    assert!(job.ok_lines() < 4, "every rank finished:\n{}", job.output);
    for needle in needles {
        assert!(
            job.output.contains(needle),
            "no {needle:?} in the output:\n{}",
            job.output
        );
    }
}

#[test]
fn every_collective_on_every_group_matches_the_local_backend() {
    let job = mpirun("--ranks-per-node 2", |_| {});
    assert_eq!(job.code, Some(0), "mpirun failed:\n{}", job.output);
    assert_eq!(job.ok_lines(), 4, "not every rank is ok:\n{}", job.output);
}

#[test]
fn one_host_is_one_node_without_ranks_per_node() {
    let job = mpirun("", |_| {});
    assert_eq!(job.code, Some(0), "mpirun failed:\n{}", job.output);
    assert_eq!(job.ok_lines(), 4, "not every rank is ok:\n{}", job.output);
}

#[test]
fn a_world_that_does_not_split_into_nodes_fails_on_every_rank() {
    let job = mpirun("--ranks-per-node 3", |_| {});
    assert_failed(
        &job,
        &["invalid topology: world size 4 is not a positive multiple of 3 ranks per node"],
    );
}

#[test]
fn a_rank_that_exits_ends_the_job() {
    let job = mpirun("--ranks-per-node 2 --die-at 3", |_| {});
    assert_failed(
        &job,
        &[
            "rank 2 exits with code 9 before its collective #3",
            "non-zero",
        ],
    );
}

#[test]
fn a_rank_killed_by_a_signal_ends_the_job() {
    // Rank 2 hangs (the peers wait in a collective, watchdog at its 600 s default); kill -9 it.
    let mut killed = false;
    let job = mpirun("--ranks-per-node 2 --hang-at 3", |out| {
        if killed {
            return;
        }
        let Some(pid) = out
            .lines()
            .find_map(|l| l.strip_prefix("rank 2 (pid "))
            .and_then(|rest| rest.split(')').next())
        else {
            return;
        };
        let status = Command::new("kill").args(["-9", pid]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -9 {pid}");
        killed = true;
    });
    assert!(killed, "rank 2 never said it hangs:\n{}", job.output);
    assert_failed(&job, &["signal 9"]);
}

#[test]
fn the_watchdog_aborts_a_job_whose_rank_hangs() {
    let job = mpirun("--ranks-per-node 2 --hang-at 3 --timeout 2", |_| {});
    // Rank 2 hangs before its 3rd collective, a reduce_scatter on the world. Its peers' watchdogs
    // call MPI_Abort, which ends the job (assert_failed: within JOB_LIMIT, non-zero). mpirun's
    // own "MPI_ABORT was invoked" notice is not asserted: when several ranks abort at once,
    // OpenMPI 4 may print "ORTE_ERROR_LOG: Data unpack had inadequate space" in its place.
    assert_failed(
        &job,
        &[
            "reduce_scatter #",
            "on World waited 2 s for its peers (a peer died or hung); aborting MPI",
        ],
    );
}

#[test]
fn abort_ends_the_job_with_its_reason() {
    let job = mpirun("--ranks-per-node 2 --abort-at 3", |_| {});
    assert_failed(
        &job,
        &["error: rank 2 aborts the MPI job: asked to abort before collective #3"],
    );
}
