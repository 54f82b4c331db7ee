//! Every collective of the MPI backend on every group, checked; run under `mpirun`.
//!
//! ```text
//! mpirun -np 4 target/release/examples/mpi_collectives --ranks-per-node 2
//! ```
//!
//! Each rank runs every collective on every group for U8, F32 and BF16 buffers of
//! rank-dependent data, and checks each result against the values computed here (the formulas
//! of crates/comm/tests/local.rs). It then runs the same sequence on a local world of the same
//! topology ([`comm::run_local`], threads of this process) and checks that its MPI results and
//! byte counters equal its local twin's bit for bit, and that the counters equal the logical
//! formulas of [`comm::ByteCounters`]. It prints `rank R ok`, or the first problem and exits 1.
//!
//! Faults, for the tests of what a job does when a rank fails (all hit rank 2 just before its
//! K-th collective, counting from 1): `--die-at K` exits with code 9 without finalising MPI;
//! `--hang-at K` sleeps for ever (the peers' watchdogs fire, after `--timeout S` seconds);
//! `--abort-at K` calls [`Communicator::abort`].

use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use comm::{run_local, ByteCounters, Communicator, FailureReport, Group, MpiComm, Topology};

const GROUPS: [Group; 3] = [Group::World, Group::IntraNode, Group::InterNode];
const DTYPES: [DType; 3] = [DType::U8, DType::F32, DType::BF16];
/// The rank the faults hit.
const FAULTY: usize = 2;

#[derive(Default)]
struct Args {
    ranks_per_node: Option<usize>,
    die_at: Option<usize>,
    hang_at: Option<usize>,
    abort_at: Option<usize>,
    timeout_s: Option<u64>,
}

fn parse_args(argv: Vec<String>) -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = argv.into_iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number: u64 = value
            .parse()
            .map_err(|_| format!("{flag} {value}: not a number"))?;
        match flag.as_str() {
            "--ranks-per-node" => args.ranks_per_node = Some(number as usize),
            "--die-at" => args.die_at = Some(number as usize),
            "--hang-at" => args.hang_at = Some(number as usize),
            "--abort-at" => args.abort_at = Some(number as usize),
            "--timeout" => args.timeout_s = Some(number),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(args)
}

/// Byte-sized value i of world rank r's all-gather (and broadcast) contribution.
fn gather_value(r: usize, i: usize) -> f32 {
    ((r * 31 + i * 7 + 1) % 251) as f32
}

/// Value k of the chunk world rank r sends to group rank j in an all-to-all.
fn a2a_value(r: usize, j: usize, k: usize) -> f32 {
    ((r * 17 + j * 5 + k + 3) % 251) as f32
}

/// Element i of world rank r's reduction input: sums over 4 ranks stay below 256, exact in
/// u8, bf16 and f32.
fn value(r: usize, i: usize) -> f32 {
    ((r * 8 + i) % 50) as f32
}

#[path = "../tests/support/noisy.rs"]
mod support;
use support::noisy;

/// The results (as f32 bits: exact for u8 and bf16) and counters of one rank's sequence.
#[derive(Debug, PartialEq)]
struct Outcome {
    results: Vec<Vec<u32>>,
    counters: ByteCounters,
}

/// Runs the sequence on `comm`, calling `before(k)` before the k-th collective (from 1).
struct Runner<'a> {
    comm: &'a dyn Communicator,
    before: &'a dyn Fn(usize),
    issued: usize,
    results: Vec<Vec<u32>>,
    /// The counters the logical formulas give for what ran so far.
    expected: ByteCounters,
}

impl Runner<'_> {
    fn tick(&mut self) {
        self.issued += 1;
        (self.before)(self.issued);
    }

    /// Counts `bytes` to every other member of `group`, split by node.
    fn expect(&mut self, group: Group, bytes: usize) {
        let t = self.comm.topology();
        let r = self.comm.rank();
        for m in t.members(group, r) {
            if m == r {
                continue;
            }
            if t.node_of(m) == t.node_of(r) {
                self.expected.intra += bytes as u64;
            } else {
                self.expected.inter += bytes as u64;
            }
        }
    }

    /// Reads `got` back, checks its dtype and (if given) its values, and records it.
    fn check(
        &mut self,
        what: String,
        got: Tensor,
        dtype: DType,
        want: Option<Vec<f32>>,
    ) -> Result<(), String> {
        if got.dtype() != dtype {
            return Err(format!(
                "{what}: dtype {:?}, expected {dtype:?}",
                got.dtype()
            ));
        }
        let values = got
            .to_dtype(DType::F32)
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| format!("{what}: {e}"))?;
        if let Some(want) = want {
            if values != want {
                return Err(format!("{what}: got {values:?}, expected {want:?}"));
            }
        }
        self.results
            .push(values.iter().map(|x| x.to_bits()).collect());
        Ok(())
    }

    fn run(&mut self) -> Result<(), String> {
        let comm = self.comm;
        let t = comm.topology();
        let r = comm.rank();
        let tensor = |v: Vec<f32>, dtype: DType| {
            let n = v.len();
            Tensor::from_vec(v, n, &Device::Cpu)
                .and_then(|x| x.to_dtype(dtype))
                .map_err(|e| e.to_string())
        };
        let wait = |what: &str, p: comm::Pending<Tensor>| {
            p.wait().map_err(|e| format!("{what} on rank {r}: {e}"))
        };
        for g in GROUPS {
            let members = t.members(g, r);
            let n = members.len();
            let me = t.group_rank(g, r);
            for dt in DTYPES {
                let size = dt.size_in_bytes();
                let label = |op: &str| format!("{op} {dt:?} on {g:?}, rank {r}");

                self.tick();
                let send = (0..5).map(|i| gather_value(r, i)).collect();
                let got = wait("all_gather", comm.all_gather(g, tensor(send, dt)?))?;
                let want = members
                    .iter()
                    .flat_map(|&m| (0..5).map(move |i| gather_value(m, i)))
                    .collect();
                self.check(label("all_gather"), got, dt, Some(want))?;
                self.expect(g, 5 * size);

                self.tick();
                let c = 3;
                let send = (0..n)
                    .flat_map(|j| (0..c).map(move |k| a2a_value(r, j, k)))
                    .collect();
                let got = wait("all_to_all", comm.all_to_all(g, tensor(send, dt)?))?;
                let want = members
                    .iter()
                    .flat_map(|&m| (0..c).map(move |k| a2a_value(m, me, k)))
                    .collect();
                self.check(label("all_to_all"), got, dt, Some(want))?;
                self.expect(g, c * size);

                self.tick();
                let c = 4;
                let send = (0..n * c).map(|i| value(r, i)).collect();
                let got = wait("reduce_scatter", comm.reduce_scatter(g, tensor(send, dt)?))?;
                let want = (me * c..(me + 1) * c)
                    .map(|i| members.iter().map(|&m| value(m, i)).sum())
                    .collect();
                self.check(label("reduce_scatter"), got, dt, Some(want))?;
                self.expect(g, c * size);

                self.tick();
                let send = (0..7).map(|i| value(r, i)).collect();
                let got = wait("all_reduce", comm.all_reduce(g, tensor(send, dt)?))?;
                let want = (0..7)
                    .map(|i| members.iter().map(|&m| value(m, i)).sum())
                    .collect();
                self.check(label("all_reduce"), got, dt, Some(want))?;
                self.expect(g, 7 * size);

                self.tick();
                let root = n - 1;
                let send = (0..6).map(|i| gather_value(r, i)).collect();
                let got = wait("broadcast", comm.broadcast(g, root, tensor(send, dt)?))?;
                let want = (0..6).map(|i| gather_value(members[root], i)).collect();
                self.check(label("broadcast"), got, dt, Some(want))?;
                if me == root {
                    self.expect(g, 6 * size);
                }

                self.tick();
                comm.barrier(g)
                    .wait()
                    .map_err(|e| format!("barrier on {g:?}, rank {r}: {e}"))?;
            }
            // Sums whose rounding depends on the order: compared with the local backend only.
            for (call, dt) in [DType::F32, DType::BF16].into_iter().enumerate() {
                let size = dt.size_in_bytes();
                self.tick();
                let send = tensor(noisy(r, call, n * 33), dt)?;
                let got = wait("reduce_scatter", comm.reduce_scatter(g, send))?;
                let what = format!("noisy reduce_scatter {dt:?} on {g:?}, rank {r}");
                self.check(what, got, dt, None)?;
                self.expect(g, 33 * size);

                self.tick();
                let send = tensor(noisy(r, call + 10, 17), dt)?;
                let got = wait("all_reduce", comm.all_reduce(g, send))?;
                let what = format!("noisy all_reduce {dt:?} on {g:?}, rank {r}");
                self.check(what, got, dt, None)?;
                self.expect(g, 17 * size);
            }
        }
        let counters = comm.counters();
        if counters != self.expected {
            return Err(format!(
                "rank {r}: counters {counters:?}, the logical formulas give {:?}",
                self.expected
            ));
        }
        Ok(())
    }
}

fn sequence(comm: &dyn Communicator, before: &dyn Fn(usize)) -> Result<Outcome, String> {
    let mut runner = Runner {
        comm,
        before,
        issued: 0,
        results: Vec::new(),
        expected: ByteCounters::default(),
    };
    runner.run()?;
    Ok(Outcome {
        results: runner.results,
        counters: comm.counters(),
    })
}

/// The MPI outcome of this rank against its twin in a local world of the same topology.
fn check_against_local(topology: Topology, rank: usize, mpi: &Outcome) -> Result<(), String> {
    let local = run_local(topology, |c| sequence(&c, &|_| {}))
        .map_err(|e| format!("the local run failed: {e:?}"))?;
    let twin = &local[rank];
    if mpi.counters != twin.counters {
        return Err(format!(
            "rank {rank}: counters {:?}, the local backend's {:?}",
            mpi.counters, twin.counters
        ));
    }
    if let Some(i) = (0..mpi.results.len()).find(|&i| mpi.results[i] != twin.results[i]) {
        return Err(format!(
            "rank {rank}: result #{i} differs from the local backend's: {:?} vs {:?}",
            mpi.results[i], twin.results[i]
        ));
    }
    Ok(())
}

fn main() {
    std::process::exit(run_rank(std::env::args().skip(1).collect()));
}

/// One rank's work for the arguments `argv` (without the program name); the exit code.
/// (crates/comm/tests/mpi.rs compiles this file in and runs it as the ranks of its jobs.)
pub fn run_rank(argv: Vec<String>) -> i32 {
    let args = match parse_args(argv) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    let comm = match MpiComm::init(args.ranks_per_node) {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    if let Some(s) = args.timeout_s {
        comm.set_timeout(Duration::from_secs(s));
    }
    // The backend reports its watchdog and its aborts here, just before `MPI_Abort`.
    comm.set_failure_handler(Some(Arc::new(|report: &FailureReport| {
        eprintln!("error: {report}")
    })));
    let rank = comm.rank();
    let fault = |k: usize| {
        if rank != FAULTY {
            return;
        }
        if args.die_at == Some(k) {
            eprintln!("rank {rank} exits with code 9 before its collective #{k}");
            std::process::exit(9);
        }
        if args.hang_at == Some(k) {
            eprintln!(
                "rank {rank} (pid {}) hangs before its collective #{k}",
                std::process::id()
            );
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        if args.abort_at == Some(k) {
            comm.abort(format!("asked to abort before collective #{k}"));
            // MPI_Abort did not end the process: end it here.
            std::process::exit(1);
        }
    };
    let result = sequence(&comm, &fault)
        .and_then(|outcome| check_against_local(comm.topology(), rank, &outcome));
    drop(comm); // finalises MPI
    match result {
        Ok(()) => {
            println!("rank {rank} ok");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
