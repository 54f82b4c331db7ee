//! The GPU test suite: each CUDA kernel against its CPU reference, the local backend and the
//! ZeRO++ engine on one GPU against the CPU, and the NCCL backend. Built with `--features cuda`
//! only (scripts/gpu-build.sh); run on a GPU machine with `scripts/gpu-test.sh tests`.

mod adamw;
mod attention;
mod common;
mod crossentropy;
mod decode;
mod elementwise;
mod embedding;
mod engine;
mod fp8;
mod fp8_fused;
mod fp8_qwz;
mod layernorm;
mod linear;
mod llama_layers;
mod model;
mod nccl;
mod qk_norm;
mod quant;
mod shard_passes;
