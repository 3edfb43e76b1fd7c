//! An event's message and fields as JSON values, in the event's order.
use std::fmt;

use serde_json::Value;
use tracing::field::{Field, Visit};

#[derive(Default)]
pub struct Fields {
    pub msg: String,
    pub rest: Vec<(&'static str, Value)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.msg = value.to_string(),
            name => self.rest.push((name, Value::from(value))),
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.rest.push((field.name(), Value::from(value)));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.rest.push((field.name(), Value::from(value)));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.rest.push((field.name(), Value::from(value)));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.rest.push((field.name(), Value::from(value)));
    }

    /// `?list` fields (addresses) are written as the JSON arrays their Debug text is; any
    /// other Debug or Display value as a string.
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.msg = text;
            return;
        }
        let parsed = text
            .starts_with('[')
            .then(|| serde_json::from_str::<Value>(&text).ok())
            .flatten();
        self.rest
            .push((field.name(), parsed.unwrap_or(Value::String(text))));
    }
}
