//! TEMPORARY until the Llama units land from branch i25-llama (replaced by that file on merge).
use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

#[derive(Clone, Debug)]
pub struct BlockSaved;
#[derive(Clone, Debug)]
pub struct NormSaved;

fn no() -> ModelError {
    ModelError::Shape {
        field: "arch",
        reason: "not merged".into(),
    }
}
pub fn embedding_forward(_: &ModelConfig, _: &Tensor, _: &Tensor) -> Result<Tensor> {
    Err(no())
}
pub fn embedding_backward(_: &ModelConfig, _: &Tensor, _: &Tensor) -> Result<Tensor> {
    Err(no())
}
pub fn block_forward(
    _: &ModelConfig,
    _: &Tensor,
    _: &Tensor,
    _: bool,
) -> Result<(Tensor, BlockSaved)> {
    Err(no())
}
pub fn block_backward(
    _: &ModelConfig,
    _: &Tensor,
    _: &BlockSaved,
    _: &Tensor,
) -> Result<(Tensor, Tensor)> {
    Err(no())
}
pub fn final_norm_forward(_: &ModelConfig, _: &Tensor, _: &Tensor) -> Result<(Tensor, NormSaved)> {
    Err(no())
}
pub fn final_norm_backward(
    _: &ModelConfig,
    _: &Tensor,
    _: &NormSaved,
    _: &Tensor,
) -> Result<(Tensor, Tensor)> {
    Err(no())
}
pub fn head_loss(
    _: &ModelConfig,
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: bool,
) -> Result<(f64, Option<(Tensor, Tensor)>)> {
    Err(no())
}
