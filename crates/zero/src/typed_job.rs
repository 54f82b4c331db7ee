//! Jobs with typed results. A [`comm::Job`] returns positional tensors (what every backend can
//! carry); the engine's jobs return a value of their own type instead ([`Gathered`],
//! [`Reduced`]), handed over beside the job and taken once the job is waited, so that no caller
//! decodes results by index.
//!
//! [`Gathered`]: crate::gather::Gathered
//! [`Reduced`]: crate::reduce::Reduced

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{DType, Device, Tensor};
use comm::{CommError, Communicator, Job, Lane, Pending};

use crate::Result;

/// A submitted job whose result is an `R`.
pub(crate) struct TypedPending<R> {
    pending: Pending<Vec<Tensor>>,
    slot: Arc<Mutex<Option<R>>>,
}

/// Submits a job that reads `inputs` (tensors compute wrote, which the backend keeps alive until
/// compute has waited; the job itself reads its own clones of them, captured by `run`), fills
/// `outputs` (allocated by the backend on the compute device, handed to `run`) and returns an
/// `R`.
pub(crate) fn submit<R, F>(
    comm: &dyn Communicator,
    label: &'static str,
    device: Device,
    inputs: Vec<Tensor>,
    outputs: Vec<(DType, usize)>,
    run: F,
) -> TypedPending<R>
where
    R: Send + 'static,
    F: FnOnce(&mut dyn Lane, Vec<Tensor>) -> Result<R> + Send + 'static,
{
    let slot = Arc::new(Mutex::new(None));
    let filled = slot.clone();
    let run: comm::job::JobFn = Box::new(move |lane, _inputs, outputs| {
        let r = run(lane, outputs).map_err(|e| CommError::in_job(label, e))?;
        *filled.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
        Ok(Vec::new())
    });
    let job = Job {
        label,
        device,
        inputs,
        outputs,
        run,
    };
    TypedPending {
        pending: comm.submit(job),
        slot,
    }
}

impl<R> TypedPending<R> {
    /// Waits for the job (on a GPU, the compute stream waits for it) and takes its result.
    pub(crate) fn wait(self) -> Result<R> {
        self.pending.wait()?;
        let r = self
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        Ok(r.expect("a job that succeeded stored its result"))
    }
}
