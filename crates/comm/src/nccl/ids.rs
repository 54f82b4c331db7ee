//! The NCCL unique ids of a world's communicators, and their bytes for the bootstrap.

use candle_core::cuda_backend::cudarc::nccl::safe::Id;

use super::nccl_error;
use crate::{CommError, Result, Topology};

/// Bytes of one NCCL unique id.
const ID_BYTES: usize = 128;

/// The NCCL unique ids of one world's communicators: rank 0 makes them ([`NcclIds::new`]) and
/// the bootstrap ships them to every rank ([`NcclIds::to_bytes`], [`NcclIds::from_bytes`]).
#[derive(Clone, Debug)]
pub struct NcclIds {
    /// The world communicator's id.
    pub world: Id,
    /// One id per node: the communicator of that node's ranks.
    pub intra: Vec<Id>,
    /// One id per local rank index: the communicator of the ranks with that index on every node.
    pub inter: Vec<Id>,
}

impl NcclIds {
    /// Fresh ids for the 1 + nodes + ranks-per-node communicators of `topology`.
    pub fn new(topology: Topology) -> Result<Self> {
        let id = || Id::new().map_err(|e| nccl_error("ncclGetUniqueId", e));
        Ok(NcclIds {
            world: id()?,
            intra: (0..topology.nodes).map(|_| id()).collect::<Result<_>>()?,
            inter: (0..topology.ranks_per_node)
                .map(|_| id())
                .collect::<Result<_>>()?,
        })
    }

    /// The ids as bytes: world, then intra by node, then inter by local rank, 128 bytes each.
    pub fn to_bytes(&self) -> Vec<u8> {
        std::iter::once(&self.world)
            .chain(&self.intra)
            .chain(&self.inter)
            .flat_map(|id| id.internal().iter().map(|&c| c as u8))
            .collect()
    }

    /// The ids that [`NcclIds::to_bytes`] wrote for `topology`.
    pub fn from_bytes(bytes: &[u8], topology: Topology) -> Result<Self> {
        let expected = (1 + topology.nodes + topology.ranks_per_node) * ID_BYTES;
        if bytes.len() != expected {
            return Err(CommError::BadLength {
                op: "NcclIds::from_bytes",
                got: bytes.len(),
                expected,
            });
        }
        let mut ids = bytes.chunks_exact(ID_BYTES).map(|chunk| {
            let mut internal = [0; ID_BYTES];
            for (c, &b) in internal.iter_mut().zip(chunk) {
                *c = b as std::ffi::c_char;
            }
            Id::uninit(internal)
        });
        let world = ids.next().expect("the length was checked");
        let intra = ids.by_ref().take(topology.nodes).collect();
        let inter = ids.collect();
        Ok(NcclIds {
            world,
            intra,
            inter,
        })
    }
}

impl PartialEq for NcclIds {
    fn eq(&self, other: &Self) -> bool {
        self.intra.len() == other.intra.len() && self.to_bytes() == other.to_bytes()
    }
}
