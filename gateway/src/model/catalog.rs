//! The models one gateway serves, and which of them a request's `model` names.
//!
//! A gateway serves one model unless `--models-file` lists several (a shared gateway): each
//! entry overrides the per-model settings (`settings::PER_MODEL`) for its own model, and the
//! rest (the HTTP
//! server, auth, tracing, request limits) is the process's. Each model has its own tokenizer,
//! workers (found by its own discovery), pool, admission and hold.

use serde_json::Value;

use crate::api::errors::ApiError;
use crate::settings::{Settings, PER_MODEL};

/// The JSON type a per-model setting takes.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Integer,
    Number,
    Flag,
    Texts,
}

fn kind(name: &str) -> Kind {
    match name {
        "max_input_tokens"
        | "split_overlap_tokens"
        | "chunk_tokens"
        | "min_chunk_tokens"
        | "chunk_sequences"
        | "hold_requests" => Kind::Integer,
        "max_queue_seconds" | "hold_seconds" => Kind::Number,
        "split_long_inputs" => Kind::Flag,
        "workers" => Kind::Texts,
        _ => Kind::Text,
    }
}

/// A JSON value as the messages quote it: None, True, 'text' (the words of the tools that
/// write models files).
fn repr(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(repr).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", repr(&Value::String(k.clone())), repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `value` as the text the flag of setting `name` reads, if it has the setting's type (a bool
/// is not an integer here, nor an integer a bool).
fn typed(name: &str, value: &Value, place: &str) -> Result<String, String> {
    let want = kind(name);
    let text = match (want, value) {
        (Kind::Flag, Value::Bool(b)) => Some(if *b { "true" } else { "false" }.to_string()),
        (Kind::Integer, Value::Number(n)) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        (Kind::Number, Value::Number(n)) => Some(n.to_string()),
        (Kind::Text, Value::String(s)) => Some(s.clone()),
        (Kind::Texts, Value::Array(items)) if items.iter().all(Value::is_string) => Some(
            items
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(","),
        ),
        _ => None,
    };
    text.ok_or_else(|| {
        let what = match want {
            Kind::Flag => "a boolean",
            Kind::Integer => "an integer",
            Kind::Number => "a number",
            Kind::Texts => "a list of strings",
            Kind::Text => "a string",
        };
        format!("{place}: '{name}' must be {what}, got {}", repr(value))
    })
}

/// Each entry of a models file as the settings of its model (`base` for everything else).
pub fn parse_models(text: &str, base: &Settings) -> Result<Vec<Settings>, String> {
    let doc: Value =
        serde_json::from_str(text).map_err(|e| format!("the models file is not JSON: {e}"))?;
    let entries = match doc.get("models") {
        Some(Value::Array(entries)) if !entries.is_empty() => entries,
        _ => return Err("the models file needs a non-empty list \"models\"".into()),
    };
    let mut out = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let place = format!("models[{i}]");
        let Value::Object(entry) = entry else {
            return Err(format!("{place} must be an object"));
        };
        let mut unknown: Vec<&str> = entry
            .keys()
            .map(String::as_str)
            .filter(|k| !PER_MODEL.contains(k))
            .collect();
        if !unknown.is_empty() {
            unknown.sort_unstable();
            return Err(format!(
                "{place}: {} cannot be set per model (per-model settings: {})",
                unknown.join(", "),
                PER_MODEL.join(", ")
            ));
        }
        let mut flags = Vec::with_capacity(entry.len() * 2);
        for (name, value) in entry {
            flags.push(format!("--{}", name.replace('_', "-")));
            flags.push(typed(name, value, &place)?);
        }
        // Each model's workers are its entry's alone: a --workers of the process joins none.
        let s = base
            .overridden(&flags)
            .map_err(|e| format!("{place}: {e}"))?;
        if !s.names_workers() {
            return Err(format!(
                "{place}: name its workers (workers, workers_file or k8s_service)"
            ));
        }
        out.push(s);
    }
    Ok(out)
}

/// The served names in order (the first is the default when there is one model).
pub struct Catalog {
    names: Vec<String>,
}

impl Catalog {
    pub fn of(names: Vec<String>) -> Result<Catalog, String> {
        for (i, name) in names.iter().enumerate() {
            if name.is_empty() {
                return Err("a model has an empty name; set served_model_name".into());
            }
            if names[..i].contains(name) {
                return Err(format!(
                    "two models are served as '{name}'; give each its own served_model_name"
                ));
            }
        }
        Ok(Catalog { names })
    }

    /// The index of the model a request's `model` selects; else the error to answer.
    ///
    /// One model: a request without `model` gets it. Several: the request must name one, since
    /// any default would answer with a model it did not ask for. An unknown name is a 404
    /// (OpenAI's model_not_found), whatever the count.
    pub fn pick(&self, requested: Option<&str>) -> Result<usize, ApiError> {
        let Some(requested) = requested else {
            if self.names.len() == 1 {
                return Ok(0);
            }
            return Err(ApiError::ModelRequired {
                served: self.served(),
            });
        };
        if let Some(i) = self.names.iter().position(|n| n == requested) {
            return Ok(i);
        }
        let serves = if self.names.len() == 1 {
            format!("this server serves '{}'", self.names[0])
        } else {
            format!("this server serves {}", self.served())
        };
        Err(ApiError::ModelNotFound {
            requested: requested.to_string(),
            serves,
        })
    }

    /// The served names for an error message.
    fn served(&self) -> String {
        self.names
            .iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Settings {
        match Settings::from_args(["gw", "--workers", "a:1"]) {
            Ok(s) => s,
            Err(_) => panic!("the base settings parse"),
        }
    }

    #[test]
    fn entries_override_their_own_settings_and_name_their_own_workers() {
        let text = r#"{"models": [
            {"served_model_name": "a", "workers": ["w:1", "w:2"], "hold_requests": 8},
            {"served_model_name": "b", "k8s_service": "ns/b", "max_queue_seconds": 2}
        ]}"#;
        let models = parse_models(text, &base()).unwrap();
        assert_eq!(models[0].workers.0, vec!["w:1", "w:2"]);
        assert_eq!(models[0].hold_requests, 8);
        assert!(models[1].workers.0.is_empty());
        assert_eq!(models[1].k8s_service, "ns/b");
        assert_eq!(models[1].max_queue_seconds, 2.0);
        assert_eq!(models[1].hold_requests, 0);
    }

    #[test]
    fn bad_files_are_refused_naming_the_entry_and_field() {
        for (text, want) in [
            ("[", "the models file is not JSON"),
            (r#"{"models": []}"#, "needs a non-empty list \"models\""),
            (r#"{"models": [1]}"#, "models[0] must be an object"),
            (
                r#"{"models": [{"workers": ["a"], "port": 1}]}"#,
                "models[0]: port cannot be set per model",
            ),
            (
                r#"{"models": [{"workers": ["a"], "hold_requests": true}]}"#,
                "models[0]: 'hold_requests' must be an integer, got True",
            ),
            (
                r#"{"models": [{"workers": ["a"], "split_long_inputs": 1}]}"#,
                "models[0]: 'split_long_inputs' must be a boolean, got 1",
            ),
            (
                r#"{"models": [{"workers": "a"}]}"#,
                "models[0]: 'workers' must be a list of strings, got 'a'",
            ),
            (
                r#"{"models": [{"model": "m"}]}"#,
                "models[0]: name its workers (workers, workers_file or k8s_service)",
            ),
        ] {
            let e = parse_models(text, &base()).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn a_request_picks_its_model_or_is_told_which_exist() {
        let one = Catalog::of(vec!["a".into()]).unwrap();
        assert_eq!(one.pick(None).unwrap(), 0);
        let e = one.pick(Some("x")).unwrap_err();
        assert_eq!(e.status(), 404);
        let two = Catalog::of(vec!["a".into(), "b".into()]).unwrap();
        assert_eq!(two.pick(Some("b")).unwrap(), 1);
        assert_eq!(two.pick(None).unwrap_err().status(), 400);
        assert!(Catalog::of(vec!["a".into(), "a".into()]).is_err());
        assert!(Catalog::of(vec![String::new()]).is_err());
    }
}
