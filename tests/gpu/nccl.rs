//! The NCCL backend on one GPU: a world of one (two NCCL ranks cannot share a GPU), so these
//! check the plumbing (dtypes, offsets, stream and event ordering, argument checks, counters,
//! abort, ids), and that every collective returns its input as `Solo` does; data movement
//! between ranks is checked by `multi` on a machine with several GPUs.

#[path = "nccl_multi.rs"]
pub(crate) mod multi;

use candle_core::{DType, Device, Tensor};
use comm::{
    run_local, ByteCounters, CommError, Communicator, Group, HostCollectives, NcclComm, NcclIds,
    Solo, Topology,
};

use multi::{exercise, TestError};

const GROUPS: [Group; 3] = [Group::World, Group::IntraNode, Group::InterNode];

fn one() -> Topology {
    Topology::new(1, 1).unwrap()
}

/// A world-of-one communicator on GPU 0, and that GPU as a candle device.
fn world_of_one() -> (Device, NcclComm) {
    let device = Device::new_cuda(0).expect("GPU 0");
    let ids = NcclIds::new(one()).expect("NCCL ids");
    let comm = NcclComm::new(device.as_cuda_device().unwrap(), one(), 0, &ids)
        .expect("a world-of-one NCCL communicator");
    (device, comm)
}

/// Largest |a - b| over the elements, in f32 (every value here is exact in f32 and in each
/// dtype, so 0 means equal).
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dtype(), b.dtype());
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F32).unwrap();
    let b = b.to_dtype(DType::F32).unwrap();
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Every collective on every group, for U8, BF16 and F32 (and F16, F64), returns its input:
/// the same dtype, device and values, also for an input that starts at an offset in its buffer.
#[test]
fn nccl_world_of_one_returns_inputs() -> Result<(), TestError> {
    let (device, comm) = world_of_one();
    for dtype in [DType::U8, DType::BF16, DType::F16, DType::F32, DType::F64] {
        let whole = Tensor::arange(0u32, 1000, &device)?
            .to_dtype(DType::F32)?
            .affine(0.25, 3.0)?
            .to_dtype(dtype)?;
        // Elements 7..7+333 of the buffer: a nonzero offset and an odd length.
        let x = whole.narrow(0, 7, 333)?;
        for g in GROUPS {
            let mut results = vec![
                ("all_gather", comm.all_gather(g, x.clone()).wait()?),
                ("all_to_all", comm.all_to_all(g, x.clone()).wait()?),
                ("broadcast", comm.broadcast(g, 0, x.clone()).wait()?),
            ];
            if dtype != DType::U8 {
                results.push(("reduce_scatter", comm.reduce_scatter(g, x.clone()).wait()?));
                results.push(("all_reduce", comm.all_reduce(g, x.clone()).wait()?));
            }
            for (op, got) in results {
                assert!(got.device().same_device(&device), "{op} {dtype:?}: device");
                assert_eq!(max_diff(&got, &x), 0.0, "{op} {g:?} {dtype:?}");
            }
            comm.barrier(g).wait()?;
        }
    }
    // CPU buffers (the host helpers) go through the GPU and come back to the CPU.
    let v = vec![1.5f32, -2.0, 3.25];
    assert_eq!(comm.all_reduce_f32(Group::World, v.clone()).wait()?, v);
    assert_eq!(
        comm.reduce_scatter_f32(Group::IntraNode, v.clone())
            .wait()?,
        v
    );
    let bytes = vec![1u8, 2, 255, 0];
    assert_eq!(
        comm.all_gather_bytes(Group::InterNode, bytes.clone())
            .wait()?,
        bytes
    );
    assert_eq!(
        comm.all_to_all_bytes(Group::World, bytes.clone()).wait()?,
        bytes
    );
    assert_eq!(
        comm.broadcast_bytes(Group::World, 0, bytes.clone())
            .wait()?,
        bytes
    );
    Ok(())
}

/// The shared exact check (every collective, group and dtype) gives the same results on NCCL
/// as on `Solo` (on the GPU) and on the local backend (on the CPU), and the same byte counters
/// as the local backend (zero: a world of one sends nothing).
#[test]
fn nccl_world_of_one_equals_solo_and_local() -> Result<(), TestError> {
    let (device, comm) = world_of_one();
    let nccl = exercise(&comm, &device)?;
    let solo = exercise(&Solo, &device)?;
    let local = run_local(one(), |c| {
        exercise(&c, &Device::Cpu).map(|results| (results, c.counters()))
    })?;
    assert_eq!(nccl, solo);
    assert_eq!(nccl, local[0].0);
    assert_eq!(comm.counters(), local[0].1);
    assert_eq!(comm.counters(), ByteCounters::default());
    Ok(())
}

/// Arguments a collective cannot take fail before NCCL, and the communicator still works.
/// (An indivisible length cannot happen in a group of one: every length splits into 1 chunk.)
#[test]
fn nccl_rejects_bad_arguments() -> Result<(), TestError> {
    let (device, comm) = world_of_one();
    let f = Tensor::ones(8, DType::F32, &device)?;
    match comm.broadcast(Group::World, 1, f.clone()).wait() {
        Err(CommError::BadRoot { root: 1, size: 1 }) => {}
        other => panic!("broadcast from root 1 of 1: {other:?}"),
    }
    let codes = Tensor::ones(8, DType::U8, &device)?;
    for result in [
        comm.all_reduce(Group::World, codes.clone()).wait(),
        comm.reduce_scatter(Group::World, codes).wait(),
        comm.all_gather(Group::World, Tensor::ones(8, DType::I64, &device)?)
            .wait(),
    ] {
        assert!(
            matches!(result, Err(CommError::UnsupportedDType { .. })),
            "{result:?}"
        );
    }
    let other = Device::new_cuda(0)?; // Another candle device: not the communicator's.
    let elsewhere = Tensor::ones(8, DType::F32, &other)?;
    let result = comm.all_gather(Group::World, elsewhere).wait();
    assert!(
        matches!(result, Err(CommError::WrongDevice { .. })),
        "{result:?}"
    );
    assert_eq!(
        max_diff(&comm.all_reduce(Group::World, f.clone()).wait()?, &f),
        0.0
    );
    Ok(())
}

/// Collectives are ordered after the compute that writes their input and before the compute
/// that reads their output, with many in flight at once and results waited out of order; an
/// unwaited `Pending` is dropped safely.
#[test]
fn nccl_orders_collectives_with_compute() -> Result<(), TestError> {
    let (device, comm) = world_of_one();
    let a = Tensor::randn(0f32, 1.0, (2048, 2048), &device)?;
    let mut expected = Vec::new();
    let mut pending = Vec::new();
    for i in 0..8 {
        // A matmul still running on the compute stream when the collective is issued.
        let y = a.matmul(&a)?.affine(1.0, i as f64)?.flatten_all()?;
        pending.push(comm.all_gather(Group::World, y.clone()));
        // Dropped unwaited, with its input gone too: its buffers live until NCCL is done.
        let dropped = comm.all_reduce(Group::IntraNode, a.matmul(&a)?.flatten_all()?);
        drop(dropped);
        expected.push(y);
    }
    for (p, y) in pending.into_iter().zip(&expected).rev() {
        // Read by compute right after `wait`, with no host synchronisation in between.
        let got = p.wait()?;
        let diff = (got - y)?.abs()?.sum_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
    }
    Ok(())
}

/// After `abort`, a collective issued before it and every later one fail with `Aborted`,
/// carrying the first abort's rank and reason.
#[test]
fn nccl_abort_fails_pending_and_later_collectives() -> Result<(), TestError> {
    let (device, comm) = world_of_one();
    let x = Tensor::ones(1024, DType::F32, &device)?;
    let before = comm.all_gather(Group::World, x.clone());
    comm.abort("test abort".into());
    comm.abort("second abort".into());
    let aborted = |r: Result<(), CommError>| match r {
        Err(CommError::Aborted { rank: 0, reason }) => assert_eq!(reason, "test abort"),
        other => panic!("expected Aborted, got {other:?}"),
    };
    aborted(before.wait().map(drop));
    aborted(comm.all_reduce(Group::World, x.clone()).wait().map(drop));
    aborted(
        comm.all_to_all(Group::InterNode, x.clone())
            .wait()
            .map(drop),
    );
    aborted(comm.broadcast(Group::IntraNode, 0, x).wait().map(drop));
    aborted(comm.barrier(Group::World).wait());
    Ok(())
}

/// Ids survive `to_bytes` / `from_bytes`: 128 bytes per communicator, 1 + nodes + ranks per
/// node of them; bytes of the wrong length are refused.
#[test]
fn nccl_ids_round_trip() -> Result<(), TestError> {
    let topology = Topology::new(8, 4)?;
    let ids = NcclIds::new(topology)?;
    assert_eq!((ids.intra.len(), ids.inter.len()), (2, 4));
    let bytes = ids.to_bytes();
    assert_eq!(bytes.len(), (1 + 2 + 4) * 128);
    let back = NcclIds::from_bytes(&bytes, topology)?;
    assert_eq!(back, ids);
    assert_eq!(back.to_bytes(), bytes);
    assert_ne!(NcclIds::new(topology)?, ids, "fresh ids differ");
    assert!(matches!(
        NcclIds::from_bytes(&bytes, Topology::new(8, 1)?),
        Err(CommError::BadLength { .. })
    ));
    assert!(matches!(
        NcclIds::from_bytes(&bytes[1..], topology),
        Err(CommError::BadLength { .. })
    ));
    Ok(())
}

/// Enqueues on `device`'s compute stream a one-thread kernel that spins for `ms` milliseconds
/// (on the GPU's global timer) and then ends by itself: compute that a collective issued after
/// it must wait for.
fn spin_on_compute_stream(device: &Device, ms: u64) -> Result<(), TestError> {
    spin_on_stream(device, &device.as_cuda_device()?.cuda_stream(), ms)
}

/// As `spin_on_compute_stream`, on `stream` (of `device`'s context).
fn spin_on_stream(
    device: &Device,
    stream: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    ms: u64,
) -> Result<(), TestError> {
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::cudarc::nvrtc::compile_ptx;

    const SPIN: &str = r#"
extern "C" __global__ void comm_test_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
#if __CUDA_ARCH__ >= 700
        __nanosleep(100000);
#endif
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"#;
    let cuda = device.as_cuda_device()?;
    let ptx = compile_ptx(SPIN).map_err(|e| format!("compiling the spin kernel: {e:?}"))?;
    let f = cuda.get_or_load_custom_func("comm_test_spin", "comm_test_spin", &ptx.to_src())?;
    let ns = ms * 1_000_000;
    let mut launch = stream.launch_builder(&f);
    launch.arg(&ns);
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel takes one u64 and touches no memory.
    unsafe { launch.launch(one) }?;
    Ok(())
}

/// The device wait clock times how long the compute stream stands still for a collective: about
/// 300 ms when the communication stream is held 300 ms behind a spin kernel, and next to
/// nothing when compute is the busy one (300 ms of it) and the collective is done by the time
/// compute waits for it. The host is not held up in either case.
#[test]
fn nccl_device_wait_clock_times_the_compute_streams_stalls() -> Result<(), TestError> {
    let (device, comm) = world_of_one();
    let x = Tensor::ones(1 << 20, DType::F32, &device)?;
    comm.all_reduce(Group::World, x.clone()).wait()?; // NCCL's first collective sets it up
    device.synchronize()?;
    let clock = comm
        .device_wait_clock()
        .expect("nccl times its waits on the device");
    assert_eq!(clock.seconds()?, 0.0, "nothing waited yet");

    spin_on_stream(&device, comm.comm_stream(), 300)?;
    let issued = std::time::Instant::now();
    let y = comm.all_reduce(Group::World, x.clone()).wait()?;
    let host = issued.elapsed();
    let z = (&y + 1.0)?; // compute that needs the collective
    device.synchronize()?;
    let held = clock.seconds()?;
    assert!(
        (0.25..1.0).contains(&held),
        "the compute stream waited {held} s behind a 300 ms hold"
    );
    assert!(host.as_millis() < 100, "the host waited {host:?}");
    assert_eq!(z.sum_all()?.to_scalar::<f32>()?, 2.0 * (1 << 20) as f32);

    spin_on_compute_stream(&device, 300)?;
    let y = comm.all_reduce(Group::World, (&x + 2.0)?).wait()?;
    let z = (&y + 1.0)?;
    device.synchronize()?;
    let busy = clock.seconds()? - held;
    assert!(
        (0.0..0.05).contains(&busy),
        "the compute stream waited {busy} s for a collective done in time"
    );
    assert_eq!(z.sum_all()?.to_scalar::<f32>()?, 4.0 * (1 << 20) as f32);
    Ok(())
}

/// The watchdog: a collective that stays incomplete (here: behind a 5 s kernel on the compute
/// stream, as behind a dead peer) longer than the timeout (1 s) aborts the communicators within
/// about a poll of the timeout, and that pending and every later collective fail with `Aborted`
/// naming the timed-out collective; a collective slower than usual (2 s) but within the timeout
/// (30 s) does not fire it. The last-resort exit is off (`set_grace(None)`), and the spinning
/// kernel ends by itself, so the test process ends cleanly.
#[test]
fn nccl_watchdog_aborts_a_collective_past_the_timeout() -> Result<(), TestError> {
    use std::time::{Duration, Instant};

    let (device, comm) = world_of_one();
    comm.set_grace(None);
    let x = Tensor::ones(1024, DType::F32, &device)?;

    // Within the timeout: completes, and the watchdog stays quiet.
    comm.set_timeout(Duration::from_secs(30));
    spin_on_compute_stream(&device, 2000)?;
    let y = (&x + 1.0)?; // Produced after the spin.
    let got = comm.all_reduce(Group::World, y.clone()).wait()?;
    assert_eq!(max_diff(&got, &y), 0.0);
    std::thread::sleep(Duration::from_millis(500));
    comm.check()?;

    // Past the timeout: the watchdog aborts.
    comm.set_timeout(Duration::from_secs(1));
    spin_on_compute_stream(&device, 5000)?;
    let y = (&x + 2.0)?;
    let issued = Instant::now();
    let stuck = comm.all_reduce(Group::World, y);
    while comm.check().is_ok() && issued.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = issued.elapsed();
    assert!(comm.check().is_err(), "no abort {after:?} after the issue");
    assert!(
        after >= Duration::from_secs(1) && after < Duration::from_millis(2500),
        "aborted {after:?} after the issue, with a timeout of 1 s"
    );
    let aborted = |r: Result<(), CommError>| match r {
        Err(CommError::Aborted { rank: 0, reason }) => assert!(
            reason.contains("NCCL watchdog: all_reduce #1 on World has not completed after")
                && reason.contains("timeout 1 s"),
            "{reason}"
        ),
        other => panic!("expected Aborted by the watchdog, got {other:?}"),
    };
    aborted(stuck.wait().map(drop));
    aborted(comm.all_reduce(Group::World, x.clone()).wait().map(drop));
    aborted(comm.barrier(Group::IntraNode).wait());
    Ok(())
}
