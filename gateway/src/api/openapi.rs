//! The OpenAPI 3.1 document served at /openapi.json. contract/openapi.json is its source,
//! written by hand and reviewed as such; a gateway with API keys serves it with every keyed
//! operation (routes::keyed) declaring its bearer key and 401, derived here rather than kept as
//! a second file.

use serde_json::{json, Value};

use crate::api::routes::{keyed, post_api, Api};

const SOURCE: &str = include_str!("../../contract/openapi.json");

/// The document as served: compact JSON, keys in the source's order.
pub fn document(keyed: bool) -> Vec<u8> {
    let mut doc: Value = serde_json::from_str(SOURCE).expect("contract/openapi.json is JSON");
    if keyed {
        secure(&mut doc);
    }
    serde_json::to_vec(&doc).expect("a document serializes")
}

/// The error document of a path's API: TEI's on its routes, Cohere's on /v2/, else OpenAI's.
fn error_schema(path: &str) -> &'static str {
    match post_api(path) {
        _ if path == "/info" => "TeiErrorResponse",
        Some(Api::Tei) => "TeiErrorResponse",
        Some(Api::Cohere) => "CohereErrorResponse",
        _ => "ErrorResponse",
    }
}

/// Keyed operations need a bearer key: declared, with their 401.
fn secure(doc: &mut Value) {
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut() {
            if !keyed(path) {
                continue;
            }
            let unauthorized = json!({
                "description": "Missing or wrong API key (only when the gateway has keys)",
                "headers": {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
                "content": {"application/json": {"schema": {
                    "$ref": format!("#/components/schemas/{}", error_schema(path))
                }}},
            });
            for operation in item
                .as_object_mut()
                .into_iter()
                .flat_map(|o| o.values_mut())
            {
                operation["responses"]["401"] = unauthorized.clone();
                operation["security"] = json!([{"apiKey": []}]);
            }
        }
    }
    doc["components"]["securitySchemes"] = json!({"apiKey": {"type": "http", "scheme": "bearer"}});
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keyed_document_declares_the_key_on_every_keyed_operation() {
        let open: Value = serde_json::from_slice(&document(false)).unwrap();
        let keyed: Value = serde_json::from_slice(&document(true)).unwrap();
        assert!(open["components"].get("securitySchemes").is_none());
        assert_eq!(
            keyed["components"]["securitySchemes"]["apiKey"]["scheme"],
            "bearer"
        );
        for (path, item) in keyed["paths"].as_object().unwrap() {
            let operation = item.as_object().unwrap().values().next().unwrap();
            let secured = operation.get("security").is_some();
            assert_eq!(secured, crate::api::routes::keyed(path), "{path}");
            assert_eq!(
                operation["responses"].get("401").is_some(),
                secured,
                "{path}"
            );
        }
        assert_eq!(open["paths"].as_object().unwrap().len(), 24);
    }
}
