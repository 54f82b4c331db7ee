//! The TCP rendezvous that bootstraps a multi-process world: rank 0 listens at `MASTER_PORT`,
//! every other rank connects to `MASTER_ADDR:MASTER_PORT` and says who it is, rank 0 checks that
//! everyone agrees on the world, then ships every rank the same payload (the NCCL ids, for
//! [`nccl_from_launch`]).
//!
//! Wire format, little-endian. Hello (peer to rank 0): magic `ZPPb`, protocol version (u32), rank
//! (u64), world size (u64). Reply (rank 0 to peer): magic, status (u8: 0 ok, 1 error), length
//! (u64), then the payload or a UTF-8 error message. After an ok reply the peer sends one byte
//! back, so rank 0 returns only once every rank holds the payload.
//!
//! Nothing waits forever: peers retry connecting with exponential backoff until the timeout,
//! rank 0 stops accepting at the timeout, and every socket has read and write timeouts. When
//! rank 0 finds a problem (a rank missing at the timeout, two processes with one rank, ranks
//! started with different world sizes) it sends the message to every peer that connected, so
//! every process fails with the same line.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::one_line;
pub use crate::error::BootstrapError;
use crate::Result;

const MAGIC: [u8; 4] = *b"ZPPb";
const VERSION: u32 = 1;
const HELLO_BYTES: usize = 4 + 4 + 8 + 8;
const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 1;
/// The largest payload a peer accepts: a guard against reading garbage as a length.
const MAX_PAYLOAD: u64 = 1 << 30;
/// The longest pause between a peer's connection attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// How long rank 0, once it has an error to report, keeps accepting late peers to tell them too.
const ERROR_GRACE: Duration = Duration::from_secs(2);
/// How long rank 0 waits for a connected peer's hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a peer waits for rank 0's reply beyond the timeout (rank 0 reports a missing rank
/// at its own timeout, which may end after the peer's).
const REPLY_SLACK: Duration = Duration::from_secs(2);
/// Socket write timeout for the short messages.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Joins the rendezvous at `addr` (`HOST:PORT`, rank 0's address) as `rank` of `world_size`
/// and returns rank 0's payload: on rank 0, what `root_payload` makes once every rank has
/// connected (it is called only there); on the others, a copy of it.
///
/// Rank 0 listens on `PORT` on all interfaces; the others resolve `HOST` and connect, retrying
/// with exponential backoff for up to `timeout`. A world of 1 needs no network: it returns
/// `root_payload()` at once. Errors are one line that every participating process shares where
/// it can, e.g. `bootstrap: rank 3 was started with world size 8, rank 0 with 4`.
pub fn rendezvous(
    addr: &str,
    rank: usize,
    world_size: usize,
    root_payload: impl FnOnce() -> Vec<u8>,
    timeout: Duration,
) -> Result<Vec<u8>> {
    rendezvous_with(addr, rank, world_size, || Ok(root_payload()), timeout)
}

/// [`rendezvous`] with a payload that may fail on rank 0: its message then goes to every peer.
fn rendezvous_with(
    addr: &str,
    rank: usize,
    world_size: usize,
    root_payload: impl FnOnce() -> Result<Vec<u8>>,
    timeout: Duration,
) -> Result<Vec<u8>> {
    if rank >= world_size {
        return Err(BootstrapError::RankOutOfWorld {
            rank,
            world: world_size,
        }
        .into());
    }
    if world_size == 1 {
        return root_payload();
    }
    let (host, port) = split_addr(addr)?;
    let result = if rank == 0 {
        root(host, port, world_size, root_payload, timeout)
    } else {
        peer(addr, host, port, rank, world_size, timeout)
    };
    Ok(result?)
}

/// `HOST:PORT` (or `[V6]:PORT`) into its parts.
fn split_addr(addr: &str) -> Result<(&str, u16), BootstrapError> {
    let bad = || BootstrapError::BadAddress {
        addr: addr.to_string(),
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((host, port))
}

/// What a peer said when it connected.
struct Hello {
    version: u32,
    rank: u64,
    world: u64,
}

/// Reads a peer's hello; `None` when the other end does not speak the protocol.
fn read_hello(stream: &mut TcpStream, deadline: Instant) -> io::Result<Option<Hello>> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(100), HELLO_TIMEOUT);
    stream.set_read_timeout(Some(wait))?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let mut magic = [0; 4];
    stream.read_exact(&mut magic)?;
    if magic != MAGIC {
        return Ok(None);
    }
    let mut rest = [0; HELLO_BYTES - 4];
    stream.read_exact(&mut rest)?;
    Ok(Some(Hello {
        version: u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes")),
        rank: u64::from_le_bytes(rest[4..12].try_into().expect("8 bytes")),
        world: u64::from_le_bytes(rest[12..20].try_into().expect("8 bytes")),
    }))
}

fn write_reply(stream: &mut TcpStream, status: u8, body: &[u8]) -> io::Result<()> {
    let mut message = Vec::with_capacity(4 + 1 + 8 + body.len());
    message.extend_from_slice(&MAGIC);
    message.push(status);
    message.extend_from_slice(&(body.len() as u64).to_le_bytes());
    message.extend_from_slice(body);
    stream.write_all(&message)?;
    stream.flush()
}

/// Rank 0: accept `world - 1` peers, check them, send the payload (or the first error) to all.
fn root(
    host: &str,
    port: u16,
    world: usize,
    payload: impl FnOnce() -> Result<Vec<u8>>,
    timeout: Duration,
) -> Result<Vec<u8>, BootstrapError> {
    let deadline = Instant::now() + timeout;
    let any: IpAddr = if host.parse::<Ipv6Addr>().is_ok() {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    let listen = SocketAddr::new(any, port);
    let listener = TcpListener::bind(listen)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| BootstrapError::Listen {
            addr: listen,
            source: Arc::new(e),
        })?;

    // Peers by rank, and connections to tell the error to (duplicates, mismatched worlds).
    let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    let mut others: Vec<TcpStream> = Vec::new();
    let mut failure: Option<BootstrapError> = None;
    // The largest world any process was started with: how many to wait for before failing.
    let mut expected = world;
    let mut arrived = 0;
    let mut last_arrival = Instant::now();
    loop {
        if arrived + 1 >= expected || (failure.is_some() && last_arrival.elapsed() >= ERROR_GRACE) {
            break;
        }
        if Instant::now() >= deadline {
            if failure.is_none() {
                failure = Some(BootstrapError::MissingRanks {
                    world,
                    addr: listen,
                    timeout,
                    missing: (1..world).filter(|&r| peers[r].is_none()).collect(),
                });
            }
            break;
        }
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(5));
                continue;
            }
            // A connection that died before we took it: not ours to report.
            Err(_) => continue,
        };
        let hello = match read_hello(&mut stream, deadline) {
            Ok(Some(hello)) => hello,
            // Not a rank of ours (a port scan, a stray client) or a peer gone already.
            Ok(None) | Err(_) => continue,
        };
        arrived += 1;
        last_arrival = Instant::now();
        let rank = hello.rank;
        let problem = if hello.version != VERSION {
            Some(BootstrapError::Version {
                rank,
                theirs: hello.version,
                ours: VERSION,
            })
        } else if hello.world != world as u64 {
            expected = expected.max(usize::try_from(hello.world).unwrap_or(usize::MAX));
            Some(BootstrapError::WorldSize {
                rank,
                theirs: hello.world,
                ours: world,
            })
        } else if rank >= world as u64 {
            Some(BootstrapError::RankOutside { rank, world })
        } else if rank == 0 || peers[rank as usize].is_some() {
            Some(BootstrapError::DuplicateRank { rank })
        } else {
            None
        };
        match problem {
            Some(message) => {
                failure.get_or_insert(message);
                others.push(stream);
            }
            None => peers[hello.rank as usize] = Some(stream),
        }
    }
    drop(listener);

    let bytes = match failure {
        None => payload().map_err(|e| BootstrapError::Payload {
            source: Box::new(e),
        }),
        Some(failure) => Err(failure),
    };
    let bytes = match bytes {
        Ok(bytes) => bytes,
        Err(failure) => {
            let message = one_line(&failure);
            for stream in peers.iter_mut().flatten().chain(others.iter_mut()) {
                let _ = write_reply(stream, STATUS_ERROR, message.as_bytes());
            }
            return Err(failure);
        }
    };
    let mut peers: Vec<(usize, TcpStream)> = peers
        .into_iter()
        .enumerate()
        .filter_map(|(r, s)| s.map(|s| (r, s)))
        .collect();
    for (rank, stream) in &mut peers {
        write_reply(stream, STATUS_OK, &bytes).map_err(|e| BootstrapError::Send {
            rank: *rank,
            source: Arc::new(e),
        })?;
    }
    for (rank, stream) in &mut peers {
        let mut ack = [0; 1];
        stream
            .set_read_timeout(Some(timeout.max(Duration::from_secs(1))))
            .and_then(|()| stream.read_exact(&mut ack))
            .map_err(|e| BootstrapError::NoConfirmation {
                rank: *rank,
                source: Arc::new(e),
            })?;
    }
    Ok(bytes)
}

/// A peer: connect to rank 0 (with retries), say hello, read the payload or rank 0's error.
fn peer(
    addr: &str,
    host: &str,
    port: u16,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<Vec<u8>, BootstrapError> {
    let deadline = Instant::now() + timeout;
    let targets: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| BootstrapError::Resolve {
            host: host.to_string(),
            source: Arc::new(e),
        })?
        .collect();
    if targets.is_empty() {
        return Err(BootstrapError::NoAddresses {
            host: host.to_string(),
        });
    }

    let mut backoff = Duration::from_millis(10);
    let mut stream = 'connect: loop {
        for target in &targets {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if let Ok(stream) = TcpStream::connect_timeout(target, left.min(Duration::from_secs(2)))
            {
                break 'connect stream;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BootstrapError::NothingListening {
                addr: addr.to_string(),
                timeout,
            });
        }
        thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(MAX_BACKOFF);
    };

    let io_error = |what: &'static str, e: io::Error| {
        let addr = addr.to_string();
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => BootstrapError::Silent {
                what,
                addr,
                waited: timeout + REPLY_SLACK,
            },
            io::ErrorKind::UnexpectedEof => BootstrapError::Closed { what, addr },
            _ => BootstrapError::Io {
                what,
                addr,
                source: Arc::new(e),
            },
        }
    };
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(&MAGIC);
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&(rank as u64).to_le_bytes());
    hello.extend_from_slice(&(world as u64).to_le_bytes());
    stream
        .set_nodelay(true)
        .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)))
        .and_then(|()| stream.set_read_timeout(Some(timeout + REPLY_SLACK)))
        .and_then(|()| stream.write_all(&hello))
        .map_err(|e| io_error("cannot talk to", e))?;

    let mut header = [0; 4 + 1 + 8];
    stream
        .read_exact(&mut header)
        .map_err(|e| io_error("no reply from", e))?;
    if header[..4] != MAGIC {
        return Err(BootstrapError::NotRankZero {
            addr: addr.to_string(),
        });
    }
    let len = u64::from_le_bytes(header[5..].try_into().expect("8 bytes"));
    if len > MAX_PAYLOAD {
        return Err(BootstrapError::TooLong {
            addr: addr.to_string(),
            len,
            limit: MAX_PAYLOAD,
        });
    }
    let mut body = vec![0; len as usize];
    stream
        .read_exact(&mut body)
        .map_err(|e| io_error("incomplete reply from", e))?;
    match header[4] {
        STATUS_OK => {
            stream
                .write_all(&[1])
                .map_err(|e| io_error("cannot confirm the payload to", e))?;
            Ok(body)
        }
        STATUS_ERROR => Err(BootstrapError::FromRankZero {
            message: String::from_utf8_lossy(&body).into_owned(),
        }),
        status => Err(BootstrapError::UnknownStatus {
            addr: addr.to_string(),
            status,
        }),
    }
}

#[cfg(feature = "cuda")]
pub use self::cuda::nccl_from_launch;

#[cfg(feature = "cuda")]
mod cuda {
    use std::time::Duration;

    use candle_core::CudaDevice;

    use super::{rendezvous_with, BootstrapError};
    use crate::launch::LaunchInfo;
    use crate::{NcclComm, NcclIds, Result, Topology};

    /// Builds this rank's [`NcclComm`] for a launched world: rank 0 makes the NCCL ids once every
    /// rank has joined the rendezvous at `MASTER_ADDR:MASTER_PORT`, which ships them to all.
    /// A world of 1 needs neither the rendezvous nor `MASTER_ADDR`/`MASTER_PORT`.
    ///
    /// The payload starts with rank 0's topology, so a rank whose configuration gives another
    /// (a different `dist.gpus_per_node`) fails with a message saying so.
    pub fn nccl_from_launch(
        info: &LaunchInfo,
        topology: Topology,
        device: &CudaDevice,
        timeout: Duration,
    ) -> Result<NcclComm> {
        if topology.world() != info.world_size {
            return Err(BootstrapError::TopologyNotLaunch {
                nodes: topology.nodes,
                ranks_per_node: topology.ranks_per_node,
                world: info.world_size,
                launcher: info.launcher,
            }
            .into());
        }
        let ids = if info.world_size == 1 {
            NcclIds::new(topology)?
        } else {
            let addr = info.rendezvous_addr()?;
            let make = || {
                let ids = NcclIds::new(topology)?;
                let mut bytes = Vec::new();
                bytes.extend_from_slice(&(topology.nodes as u64).to_le_bytes());
                bytes.extend_from_slice(&(topology.ranks_per_node as u64).to_le_bytes());
                bytes.extend_from_slice(&ids.to_bytes());
                Ok(bytes)
            };
            let bytes = rendezvous_with(&addr, info.rank, info.world_size, make, timeout)?;
            if bytes.len() < 16 {
                return Err(BootstrapError::ShortPayload { len: bytes.len() }.into());
            }
            let word =
                |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            let (nodes, per_node) = (word(0), word(1));
            let ours = (topology.nodes as u64, topology.ranks_per_node as u64);
            if (nodes, per_node) != ours {
                return Err(BootstrapError::TopologyMismatch {
                    rank: info.rank,
                    theirs: (nodes, per_node),
                    ours,
                }
                .into());
            }
            NcclIds::from_bytes(&bytes[16..], topology)?
        };
        NcclComm::new(device, topology, info.rank, &ids)
    }
}
