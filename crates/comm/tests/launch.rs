//! Rank discovery from launcher variables, and the TCP rendezvous on 127.0.0.1.

use std::collections::HashMap;
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use comm::bootstrap::rendezvous;
use comm::launch::{LaunchInfo, Launcher};
use comm::{CommError, Topology};

/// Parses a launch from `NAME=VALUE` pairs.
fn parse(pairs: &[(&str, &str)]) -> comm::Result<Option<LaunchInfo>> {
    let vars: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    LaunchInfo::from_vars(&|name: &str| vars.get(name).cloned())
}

fn info(pairs: &[(&str, &str)]) -> LaunchInfo {
    parse(pairs)
        .expect("valid launch variables")
        .expect("a launcher")
}

/// The error message for `pairs`, which must be rejected.
fn parse_error(pairs: &[(&str, &str)]) -> String {
    match parse(pairs) {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{pairs:?} should be rejected, got {v:?}"),
    }
}

const TORCHRUN: [(&str, &str); 6] = [
    ("RANK", "5"),
    ("WORLD_SIZE", "8"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "4"),
    ("MASTER_ADDR", "node0"),
    ("MASTER_PORT", "29500"),
];

/// `base` with `name` set to `value` (or removed, for `None`).
fn with(
    base: &[(&'static str, &'static str)],
    name: &'static str,
    value: Option<&'static str>,
) -> Vec<(&'static str, &'static str)> {
    let mut vars: Vec<_> = base.iter().copied().filter(|(k, _)| *k != name).collect();
    if let Some(v) = value {
        vars.push((name, v));
    }
    vars
}

#[test]
fn no_launcher_is_a_single_process() {
    assert_eq!(
        parse(&[("HOME", "/root"), ("LOCAL_RANK", "0")]).unwrap(),
        None
    );
}

#[test]
fn torchrun_variables() {
    let i = info(&TORCHRUN);
    assert_eq!(
        i,
        LaunchInfo {
            rank: 5,
            world_size: 8,
            local_rank: 1,
            local_world_size: Some(4),
            nodes: Some(2),
            master_addr: Some("node0".into()),
            master_port: Some(29500),
            launcher: Launcher::Torchrun,
        }
    );
    assert_eq!(i.rendezvous_addr().unwrap(), "node0:29500");
    assert_eq!(i.topology(None).unwrap(), Topology::new(8, 4).unwrap());
}

#[test]
fn torchrun_wins_over_mpi_and_slurm() {
    let mut vars = TORCHRUN.to_vec();
    vars.extend([
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("SLURM_PROCID", "0"),
    ]);
    assert_eq!(info(&vars).launcher, Launcher::Torchrun);
}

#[test]
fn openmpi_variables() {
    let i = info(&[
        ("OMPI_COMM_WORLD_RANK", "6"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "6000"),
        ("SLURM_PROCID", "3"),
    ]);
    assert_eq!(i.launcher, Launcher::OpenMpi);
    assert_eq!((i.rank, i.world_size, i.local_rank), (6, 8, 2));
    assert_eq!((i.local_world_size, i.nodes), (Some(4), Some(2)));
    assert_eq!(i.rendezvous_addr().unwrap(), "10.0.0.1:6000");
}

#[test]
fn slurm_variables() {
    let base = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NNODES", "2"),
    ];
    // Each source of the ranks per node, in any of slurm's spellings.
    for (name, value) in [
        ("SLURM_NTASKS_PER_NODE", "4"),
        ("SLURM_NTASKS_PER_NODE", "4(x2)"),
        ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
        ("SLURM_TASKS_PER_NODE", "4,4"),
    ] {
        let i = info(&with(&base, name, Some(value)));
        assert_eq!(i.launcher, Launcher::Slurm);
        assert_eq!(
            (i.rank, i.world_size, i.local_rank),
            (5, 8, 1),
            "{name}={value}"
        );
        assert_eq!(
            (i.local_world_size, i.nodes),
            (Some(4), Some(2)),
            "{name}={value}"
        );
        assert_eq!((i.master_addr.clone(), i.master_port), (None, None));
    }
    // The step's own layout beats the allocation's.
    let i = info(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
        ("SLURM_TASKS_PER_NODE", "8(x2)"),
        ("MASTER_ADDR", "gpu-001"),
        ("MASTER_PORT", "29400"),
    ]);
    assert_eq!((i.local_world_size, i.nodes), (Some(2), Some(2)));
    assert_eq!(i.rendezvous_addr().unwrap(), "gpu-001:29400");
    // An uneven layout: nodes known, ranks per node not.
    let i = info(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "7"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_STEP_TASKS_PER_NODE", "4,3"),
    ]);
    assert_eq!((i.local_world_size, i.nodes), (None, Some(2)));
    let e = i.topology(None).unwrap_err().to_string();
    assert!(
        e.contains("not the same number on each; set dist.gpus_per_node"),
        "{e}"
    );
}

#[test]
fn bad_values_name_the_variable() {
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            with(&TORCHRUN, "RANK", Some("x")),
            "RANK=\"x\" is not a number",
        ),
        (
            with(&TORCHRUN, "RANK", Some("8")),
            "RANK=8 is not below WORLD_SIZE=8",
        ),
        (
            with(&TORCHRUN, "WORLD_SIZE", Some("0")),
            "WORLD_SIZE=0: the world needs at least 1 rank",
        ),
        (
            with(&TORCHRUN, "WORLD_SIZE", None),
            "RANK is set but WORLD_SIZE is not",
        ),
        (
            with(&TORCHRUN, "RANK", None),
            "WORLD_SIZE is set but RANK is not",
        ),
        (
            with(&TORCHRUN, "LOCAL_RANK", None),
            "RANK is set but LOCAL_RANK is not",
        ),
        (
            with(&TORCHRUN, "LOCAL_RANK", Some("4")),
            "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4",
        ),
        (
            with(&TORCHRUN, "LOCAL_RANK", Some("-1")),
            "LOCAL_RANK=\"-1\" is not a number",
        ),
        (
            with(&TORCHRUN, "LOCAL_WORLD_SIZE", Some("16")),
            "LOCAL_WORLD_SIZE=16 is larger than WORLD_SIZE=8",
        ),
        (
            with(&TORCHRUN, "LOCAL_WORLD_SIZE", Some("0")),
            "LOCAL_WORLD_SIZE=0: a node needs at least 1 rank",
        ),
        (
            with(&TORCHRUN, "MASTER_PORT", Some("http")),
            "MASTER_PORT=\"http\" is not a port number (1-65535)",
        ),
        (
            with(&TORCHRUN, "MASTER_PORT", Some("70000")),
            "MASTER_PORT=\"70000\" is not a port number",
        ),
        (
            with(&TORCHRUN, "MASTER_ADDR", Some(" ")),
            "MASTER_ADDR is set but empty",
        ),
        (
            vec![
                ("OMPI_COMM_WORLD_RANK", "2"),
                ("OMPI_COMM_WORLD_SIZE", "2"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ],
            "OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2",
        ),
        (
            vec![("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")],
            "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_LOCAL_RANK is not",
        ),
        (
            vec![
                ("OMPI_COMM_WORLD_RANK", "1"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ],
            "OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2",
        ),
        (
            vec![("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0")],
            "SLURM_PROCID is set but SLURM_NTASKS is not: start the trainer with srun",
        ),
        (
            vec![
                ("SLURM_PROCID", "4"),
                ("SLURM_NTASKS", "4"),
                ("SLURM_LOCALID", "0"),
            ],
            "SLURM_PROCID=4 is not below SLURM_NTASKS=4",
        ),
        (
            vec![
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "4"),
                ("SLURM_LOCALID", "2"),
                ("SLURM_NTASKS_PER_NODE", "2"),
            ],
            "SLURM_LOCALID=2 is not below SLURM_NTASKS_PER_NODE=2",
        ),
        (
            vec![
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "4"),
                ("SLURM_LOCALID", "1"),
                ("SLURM_TASKS_PER_NODE", "2(x"),
            ],
            "SLURM_TASKS_PER_NODE=\"2(x\" is not a task count list",
        ),
        (
            vec![
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "4"),
                ("SLURM_LOCALID", "1"),
                ("SLURM_NNODES", "5"),
            ],
            "SLURM_NNODES=5: 4 ranks cannot run on 5 nodes",
        ),
    ];
    for (vars, expected) in cases {
        let e = parse_error(&vars);
        assert!(
            e.contains(expected),
            "{vars:?}: got {e:?}, expected {expected:?}"
        );
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

#[test]
fn topology_from_override_or_launcher() {
    // 8 processes on one host: the launcher's layout, or 2 simulated nodes of 4.
    let one_host = info(&[
        ("RANK", "6"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "6"),
        ("LOCAL_WORLD_SIZE", "8"),
    ]);
    assert_eq!(
        one_host.topology(None).unwrap(),
        Topology::new(8, 8).unwrap()
    );
    assert_eq!(
        one_host.topology(Some(4)).unwrap(),
        Topology::new(8, 4).unwrap()
    );
    let e = one_host.topology(Some(3)).unwrap_err().to_string();
    assert_eq!(
        e,
        "dist.gpus_per_node = 3 does not divide the 8 ranks the launcher (torchrun) started"
    );
    assert!(one_host.topology(Some(0)).is_err());

    // No local size: one node, unless overridden.
    let bare = info(&[("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1")]);
    assert_eq!(bare.topology(None).unwrap(), Topology::new(4, 4).unwrap());
    assert_eq!(
        bare.topology(Some(2)).unwrap(),
        Topology::new(4, 2).unwrap()
    );

    // Uneven nodes, and ranks not placed in blocks.
    let uneven = info(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "6"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "4"),
    ]);
    let e = uneven.topology(None).unwrap_err().to_string();
    assert!(
        e.contains("put 4 ranks on this node, which does not divide the world of 6 ranks"),
        "{e}"
    );
    assert_eq!(
        uneven.topology(Some(2)).unwrap(),
        Topology::new(6, 2).unwrap()
    );
    let cyclic = info(&[
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
    ]);
    let e = cyclic.topology(None).unwrap_err().to_string();
    assert!(
        e.contains("rank 1 is local rank 0 on its node") && e.contains("in blocks"),
        "{e}"
    );
}

#[test]
fn configured_world_must_match() {
    let i = info(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NTASKS_PER_NODE", "4"),
    ]);
    i.check_world(None).unwrap();
    i.check_world(Some(4)).unwrap();
    assert_eq!(
        i.check_world(Some(8)).unwrap_err().to_string(),
        "dist.world_size = 8 but the launcher (slurm) started 4 processes"
    );
}

#[test]
fn rendezvous_address_needs_master_variables() {
    let i = info(&with(&TORCHRUN, "MASTER_PORT", None));
    let e = i.rendezvous_addr().unwrap_err().to_string();
    assert!(e.starts_with("MASTER_PORT is not set"), "{e}");
    let i = info(&with(
        &with(&TORCHRUN, "MASTER_PORT", None),
        "MASTER_ADDR",
        None,
    ));
    let e = i.rendezvous_addr().unwrap_err().to_string();
    assert!(
        e.starts_with("MASTER_ADDR and MASTER_PORT are not set"),
        "{e}"
    );
    let i = info(&with(&TORCHRUN, "MASTER_ADDR", Some("fe80::1")));
    assert_eq!(i.rendezvous_addr().unwrap(), "[fe80::1]:29500");
}

/// A port nothing listens on now (the OS's pick, released again).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().unwrap().port()
}

/// Runs `rendezvous` for each (rank, world) on its own thread; results in the same order.
fn run_ranks(
    addr: &str,
    ranks: &[(usize, usize)],
    timeout: Duration,
) -> Vec<comm::Result<Vec<u8>>> {
    let handles: Vec<_> = ranks
        .iter()
        .map(|&(rank, world)| {
            let addr = addr.to_string();
            thread::spawn(move || {
                rendezvous(&addr, rank, world, || b"the nccl ids".to_vec(), timeout)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .collect()
}

fn message(result: &comm::Result<Vec<u8>>) -> String {
    match result {
        Err(e) => e.to_string(),
        Ok(bytes) => panic!("expected an error, got {} bytes", bytes.len()),
    }
}

#[test]
fn rendezvous_delivers_the_payload_to_every_rank() {
    let addr = format!("127.0.0.1:{}", free_port());
    // Peers first: they must retry until rank 0 listens.
    let results = run_ranks(
        &addr,
        &[(3, 4), (1, 4), (2, 4), (0, 4)],
        Duration::from_secs(20),
    );
    for r in results {
        assert_eq!(r.unwrap(), b"the nccl ids");
    }
}

#[test]
fn rendezvous_of_one_needs_no_network() {
    let payload = rendezvous(
        "nohost.invalid:1",
        0,
        1,
        || vec![7],
        Duration::from_millis(1),
    )
    .unwrap();
    assert_eq!(payload, vec![7]);
    let e = rendezvous("127.0.0.1:1", 4, 4, Vec::new, Duration::from_secs(1)).unwrap_err();
    assert_eq!(e.to_string(), "bootstrap: rank 4 is not below world size 4");
    let e = rendezvous("127.0.0.1", 1, 4, Vec::new, Duration::from_secs(1)).unwrap_err();
    assert!(e.to_string().contains("is not HOST:PORT"), "{e}");
}

#[test]
fn a_different_world_size_fails_everyone_alike() {
    let addr = format!("127.0.0.1:{}", free_port());
    let results = run_ranks(
        &addr,
        &[(0, 4), (1, 4), (2, 4), (3, 8)],
        Duration::from_secs(20),
    );
    for r in &results {
        assert_eq!(
            message(r),
            "bootstrap: rank 3 was started with world size 8, rank 0 with 4"
        );
        assert!(matches!(r, Err(CommError::Bootstrap(_))));
    }
}

#[test]
fn a_duplicate_rank_fails_everyone_alike() {
    let addr = format!("127.0.0.1:{}", free_port());
    let results = run_ranks(&addr, &[(0, 3), (1, 3), (1, 3)], Duration::from_secs(20));
    for r in &results {
        assert!(
            message(r).contains("two processes were started as rank 1"),
            "{}",
            message(r)
        );
    }
}

#[test]
fn nothing_listening_names_the_address() {
    let addr = format!("127.0.0.1:{}", free_port());
    let start = Instant::now();
    let e = rendezvous(&addr, 1, 2, Vec::new, Duration::from_secs(1)).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(
        e.to_string(),
        format!(
            "bootstrap: nothing listening at {addr} after 1 s (is rank 0 running, and are \
             MASTER_ADDR/MASTER_PORT right?)"
        )
    );
}

#[test]
fn an_unresolvable_host_is_named() {
    let e = rendezvous(
        "nohost.invalid:29500",
        1,
        2,
        Vec::new,
        Duration::from_secs(1),
    )
    .unwrap_err();
    let e = e.to_string();
    assert!(
        e.starts_with("bootstrap: cannot resolve MASTER_ADDR \"nohost.invalid\""),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn rank_zero_names_the_missing_ranks() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let start = Instant::now();
    let results = run_ranks(&addr, &[(0, 4), (2, 4)], Duration::from_secs(1));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    let expected = format!(
        "bootstrap: only 2 of 4 ranks connected to 0.0.0.0:{port} within 1 s (missing: 1, 3)"
    );
    // Rank 0 reports it, and tells the rank that did connect.
    for r in &results {
        assert_eq!(message(r), expected);
    }
}

#[test]
fn causes_are_kept_as_sources_and_said_once() {
    use comm::bootstrap::BootstrapError;
    use comm::launch::LaunchError;
    use std::error::Error;

    // A port in use: the message names it, the io error is the source, not repeated.
    let taken = TcpListener::bind("0.0.0.0:0").expect("bind an ephemeral port");
    let port = taken.local_addr().unwrap().port();
    let e = rendezvous(
        &format!("127.0.0.1:{port}"),
        0,
        2,
        Vec::new,
        Duration::from_secs(1),
    )
    .unwrap_err();
    assert!(
        matches!(&e, CommError::Bootstrap(BootstrapError::Listen { .. })),
        "{e:?}"
    );
    let cause = e.source().expect("the io error is kept").to_string();
    assert!(
        e.to_string().contains(&format!("MASTER_PORT={port}")),
        "{e}"
    );
    assert!(!e.to_string().contains(&cause), "{e} repeats {cause}");

    // A variable that is not a number keeps the parse error.
    let e = parse(&with(&TORCHRUN, "RANK", Some("five"))).unwrap_err();
    assert!(
        matches!(
            &e,
            CommError::Launch(LaunchError::NotANumber { name: "RANK", .. })
        ),
        "{e:?}"
    );
    assert!(e.source().is_some());
    assert_eq!(e.to_string(), "RANK=\"five\" is not a number");
}

#[test]
fn a_stray_client_does_not_disturb_the_rendezvous() {
    use std::io::Write;
    let addr = format!("127.0.0.1:{}", free_port());
    let stray = {
        let addr = addr.clone();
        thread::spawn(move || {
            for _ in 0..200 {
                if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                    let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n");
                    return;
                }
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let ranks = {
        let addr = addr.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            run_ranks(&addr, &[(1, 2)], Duration::from_secs(20))
        })
    };
    let root = rendezvous(&addr, 0, 2, || vec![1, 2, 3], Duration::from_secs(20));
    stray.join().unwrap();
    assert_eq!(root.unwrap(), vec![1, 2, 3]);
    assert_eq!(ranks.join().unwrap().pop().unwrap().unwrap(), vec![1, 2, 3]);
}
