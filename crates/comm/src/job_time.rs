//! How long jobs kept the communication side busy and held up compute: per-label sums
//! ([`JobTime`]) and the clock a communicator reads them from ([`JobClock`]).

use std::sync::Arc;

use crate::Result;

/// One label's jobs since timing began: how long the communication side was busy with them, and
/// how long their waits held up the caller (the compute stream on a GPU, the host on the CPU).
/// `busy - exposed` of it was hidden behind compute.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobTime {
    pub label: &'static str,
    pub jobs: u64,
    pub busy_s: f64,
    pub exposed_s: f64,
}

impl JobTime {
    /// The share of the busy time that compute did not wait for (1 when nothing was busy).
    pub fn hidden(&self) -> f64 {
        if self.busy_s > 0.0 {
            (1.0 - self.exposed_s / self.busy_s).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }
}

/// Reads the per-label [`JobTime`]s of a communicator ([`Communicator::job_clock`]), in order of
/// first use. Blocks until the timed work recorded so far has run, so read it after
/// synchronising the device.
#[derive(Clone)]
pub struct JobClock(Arc<dyn Fn() -> Result<Vec<JobTime>> + Send + Sync>);

impl JobClock {
    pub fn new(read: impl Fn() -> Result<Vec<JobTime>> + Send + Sync + 'static) -> Self {
        JobClock(Arc::new(read))
    }

    pub fn read(&self) -> Result<Vec<JobTime>> {
        (self.0)()
    }
}

impl std::fmt::Debug for JobClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobClock")
    }
}

/// Per-label sums, in order of first use (the backends' bookkeeping behind [`JobClock`]).
#[derive(Default, Debug)]
pub(crate) struct JobTimes(pub(crate) Vec<JobTime>);

impl JobTimes {
    fn entry(&mut self, label: &'static str) -> &mut JobTime {
        let i = match self.0.iter().position(|t| t.label == label) {
            Some(i) => i,
            None => {
                self.0.push(JobTime {
                    label,
                    ..JobTime::default()
                });
                self.0.len() - 1
            }
        };
        &mut self.0[i]
    }

    pub(crate) fn add_busy(&mut self, label: &'static str, seconds: f64) {
        let e = self.entry(label);
        e.jobs += 1;
        e.busy_s += seconds;
    }

    pub(crate) fn add_exposed(&mut self, label: &'static str, seconds: f64) {
        self.entry(label).exposed_s += seconds;
    }
}
