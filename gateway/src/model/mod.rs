//! The served model: its directory (config, task, prompts, tokenizer), the catalog of served
//! names, and its quantized outputs.

pub mod catalog;
pub mod dir;
pub mod quantization;
