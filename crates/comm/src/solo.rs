use crate::{ByteCounters, CommError, Communicator, Group, Result, Topology};

/// The world of one rank: every collective is a copy and sends nothing.
#[derive(Debug, Default)]
pub struct Solo;

fn check(op: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(CommError::BadLength { op, got, expected })
    }
}

impl Communicator for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn topology(&self) -> Topology {
        Topology {
            nodes: 1,
            ranks_per_node: 1,
        }
    }
    fn all_gather(&self, _: Group, send: &[f32], recv: &mut [f32]) -> Result<()> {
        check("all_gather", recv.len(), send.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }
    fn reduce_scatter(&self, _: Group, send: &[f32], recv: &mut [f32]) -> Result<()> {
        check("reduce_scatter", send.len(), recv.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }
    fn all_reduce(&self, _: Group, _: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn counters(&self) -> ByteCounters {
        ByteCounters::default()
    }
}
