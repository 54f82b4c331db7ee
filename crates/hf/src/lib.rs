//! Hugging Face in and out: [`export`] writes a checkpoint as the architecture's transformers
//! class (safetensors, `config.json`, `tokenizer.json`), [`init_from`] reads such a folder as a
//! run's first weights. Each is the other's inverse, and their tests read what the other wrote.

pub mod export;
pub mod init_from;
