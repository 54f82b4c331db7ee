//! The weight codecs: the parameters gathered as they are, and qwZ's INT8.

use super::{WeightCodec, Wire};

/// The parameters gathered in the compute dtype, as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlainGather;

impl WeightCodec for PlainGather {
    fn label(&self) -> String {
        "exact gather".into()
    }

    fn wire(&self, n: usize, param_bytes: usize) -> Wire {
        Wire {
            data: (n * param_bytes) as u64,
            scales: 0,
        }
    }

    fn decode_traffic(&self, _n: usize, _param_bytes: usize) -> u64 {
        0
    }
}

/// qwZ: symmetric INT8 codes, one byte an element, and one f32 scale per `block` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int8Gather {
    pub block: usize,
}

impl WeightCodec for Int8Gather {
    fn label(&self) -> String {
        format!("qwZ int8 gather (block {})", self.block)
    }

    fn wire(&self, n: usize, _param_bytes: usize) -> Wire {
        Wire {
            data: n as u64,
            scales: (n / self.block * 4) as u64,
        }
    }

    /// The dequantise: codes and scales read, the buffer written in the compute dtype.
    fn decode_traffic(&self, n: usize, param_bytes: usize) -> u64 {
        self.wire(n, param_bytes).total() + (n * param_bytes) as u64
    }
}
