//! What the MPI backend's collectives send: the header every member all-gathers first, and
//! buffers as bytes, with the results rebuilt from the bytes received.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

use crate::op::Op;

/// The op as a header's first two words: a code and the root.
pub(super) fn encode(op: Op) -> [u64; 2] {
    match op {
        Op::AllGather => [0, 0],
        Op::AllToAll => [1, 0],
        Op::ReduceScatter => [2, 0],
        Op::AllReduce => [3, 0],
        Op::Broadcast { root } => [4, root as u64],
        Op::Barrier => [5, 0],
    }
}

/// A header as the local backend words its call in [`CommError::Mismatch`](crate::CommError::Mismatch).
pub(super) fn describe(header: &[u64]) -> String {
    let (len, dtype) = (header[2] as usize, DTYPES.get(header[3] as usize).copied());
    let op = match header[0] {
        0 => Op::AllGather,
        1 => Op::AllToAll,
        2 => Op::ReduceScatter,
        3 => Op::AllReduce,
        4 => Op::Broadcast {
            root: header[1] as usize,
        },
        5 => Op::Barrier,
        _ => return format!("an unknown collective of {len} elements"),
    };
    op.describe(len, dtype)
}

/// The dtypes a buffer may have; a header names one by its index (none: a barrier).
pub(super) const DTYPES: [DType; 10] = [
    DType::U8,
    DType::U32,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::BF16,
    DType::F16,
    DType::F32,
    DType::F64,
    DType::F8E4M3,
];

/// [`DTYPES`] in words, for [`CommError::UnsupportedDType`](crate::CommError::UnsupportedDType).
pub(super) const DTYPE_NAMES: &str = "U8, U32, I16, I32, I64, BF16, F16, F32, F64 or F8E4M3";

/// Words of a header: op code, root, length in elements, dtype index.
pub(super) const HEADER: usize = 4;

/// What a collective's exchange gave this member, for its `finish`.
pub(super) struct Exchanged {
    /// My input.
    pub(super) mine: Option<Tensor>,
    /// The bytes received: every member's contribution (or the slice for me), in group-rank
    /// order; for a broadcast, the root's buffer (empty at the root itself).
    pub(super) received: Vec<u8>,
    pub(super) dtype: DType,
    pub(super) parts: usize,
    pub(super) me: usize,
}

impl Exchanged {
    /// The received bytes as one CPU tensor.
    pub(super) fn tensor(&self) -> candle_core::Result<Tensor> {
        let len = self.received.len() / self.dtype.size_in_bytes();
        Tensor::from_raw_buffer(&self.received, self.dtype, &[len], &Device::Cpu)
    }

    /// The received bytes split into one tensor per member, summed in group-rank order as the
    /// local backend does (`p0 + p1 + ...`, candle's add in the buffer's dtype).
    pub(super) fn sum_in_order(&self) -> candle_core::Result<Tensor> {
        let all = self.tensor()?;
        let chunk = all.elem_count() / self.parts;
        let mut out = all.narrow(0, 0, chunk)?;
        for j in 1..self.parts {
            out = (out + all.narrow(0, j * chunk, chunk)?)?;
        }
        Ok(out)
    }

    /// `result`, moved back to the device my input was on.
    pub(super) fn on_my_device(&self, result: Tensor) -> candle_core::Result<Tensor> {
        match &self.mine {
            Some(t) if !t.device().is_cpu() => result.to_device(t.device()),
            _ => Ok(result),
        }
    }
}

/// A tensor's elements as bytes (native order), copied to the CPU first if need be.
pub(super) fn tensor_bytes(t: &Tensor) -> candle_core::Result<Vec<u8>> {
    let t = t.flatten_all()?.to_device(&Device::Cpu)?.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let range = layout.start_offset()..layout.start_offset() + t.elem_count();
    fn raw<T>(v: &[T]) -> Vec<u8> {
        // SAFETY: plain numbers without padding, read as the bytes they are made of.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
            .to_vec()
    }
    let Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("the tensor was copied to the CPU")
    };
    Ok(match cpu {
        CpuStorage::U8(v) => raw(&v[range]),
        CpuStorage::U32(v) => raw(&v[range]),
        CpuStorage::I16(v) => raw(&v[range]),
        CpuStorage::I32(v) => raw(&v[range]),
        CpuStorage::I64(v) => raw(&v[range]),
        CpuStorage::BF16(v) => raw(&v[range]),
        CpuStorage::F16(v) => raw(&v[range]),
        CpuStorage::F32(v) => raw(&v[range]),
        CpuStorage::F64(v) => raw(&v[range]),
        CpuStorage::F8E4M3(v) => raw(&v[range]),
        _ => candle_core::bail!("the MPI backend does not move {:?} buffers", t.dtype()),
    })
}
