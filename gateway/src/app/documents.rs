//! The response documents, written straight into their bytes as the endpoints build them:
//! floats as the shortest text that reads back as the same float32 (non-finite ones as null),
//! keys in the order the OpenAPI document lists them.

use base64::Engine;

use crate::api::errors::json_string;
use crate::api::request::{Encoding, Precision};
use crate::model::quantization::{self, Ranges, Row};
use crate::upstream::batch::{HybridRow, TokenVectors};

/// 0.8 is written 0.800000011920929), null where not finite.
fn score_text(buffer: &mut ryu::Buffer, score: f32) -> String {
    if score.is_finite() {
        buffer.format_finite(f64::from(score)).to_string()
    } else {
        "null".to_string()
    }
}

/// The classify document: each row's labels best first (ties in label order), the best one,
/// its `top_k` labels and every score.
pub fn classifications(
    scores: &[f32],
    labels: &[String],
    top_k: Option<i64>,
    model: &str,
    tokens: usize,
) -> Vec<u8> {
    let n = labels.len();
    let keep = top_k.map_or(n, |k| (k as usize).min(n));
    let names: Vec<String> = labels.iter().map(|l| json_string(l)).collect();
    let mut number = ryu::Buffer::new();
    let mut out = Vec::with_capacity(64 + scores.len() * 40);
    out.extend_from_slice(br#"{"object":"list","data":["#);
    for (i, row) in scores.chunks(n.max(1)).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&x, &y| {
            row[y]
                .partial_cmp(&row[x])
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        out.extend_from_slice(br#"{"object":"classification","index":"#);
        out.extend_from_slice(i.to_string().as_bytes());
        out.extend_from_slice(br#","label":"#);
        out.extend_from_slice(names[order[0]].as_bytes());
        out.extend_from_slice(br#","score":"#);
        out.extend_from_slice(score_text(&mut number, row[order[0]]).as_bytes());
        out.extend_from_slice(br#","labels":["#);
        for (j, &k) in order[..keep].iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            out.extend_from_slice(br#"{"label":"#);
            out.extend_from_slice(names[k].as_bytes());
            out.extend_from_slice(br#","score":"#);
            out.extend_from_slice(score_text(&mut number, row[k]).as_bytes());
            out.push(b'}');
        }
        out.extend_from_slice(br#"],"probs":["#);
        for (j, &v) in row.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            out.extend_from_slice(score_text(&mut number, v).as_bytes());
        }
        out.extend_from_slice(br#"],"num_classes":"#);
        out.extend_from_slice(n.to_string().as_bytes());
        out.push(b'}');
    }
    model_and_usage(&mut out, model, tokens);
    out
}

/// `],"model":...,"usage":{...}}`, closing a list document.
fn model_and_usage(out: &mut Vec<u8>, model: &str, tokens: usize) {
    out.extend_from_slice(br#"],"model":"#);
    out.extend_from_slice(json_string(model).as_bytes());
    out.push(b',');
    usage(out, tokens);
}

/// `"usage":{...}}`, closing the document.
fn usage(out: &mut Vec<u8>, tokens: usize) {
    out.extend_from_slice(br#""usage":{"prompt_tokens":"#);
    out.extend_from_slice(tokens.to_string().as_bytes());
    out.extend_from_slice(br#","total_tokens":"#);
    out.extend_from_slice(tokens.to_string().as_bytes());
    out.extend_from_slice(b"}}");
}

/// float32s: the shortest text that reads back as the same float32, NaN and infinities as null.
fn float_array(out: &mut Vec<u8>, buffer: &mut ryu::Buffer, row: &[f32]) {
    out.push(b'[');
    for (j, v) in row.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        if v.is_finite() {
            out.extend_from_slice(buffer.format_finite(*v).as_bytes());
        } else {
            out.extend_from_slice(b"null");
        }
    }
    out.push(b']');
}

/// Integers: int8 and uint8 values, packed sign bits, vocabulary ids.
fn int_array<T: ToString>(out: &mut Vec<u8>, values: impl Iterator<Item = T>) {
    out.push(b'[');
    for (j, v) in values.enumerate() {
        if j > 0 {
            out.push(b',');
        }
        out.extend_from_slice(v.to_string().as_bytes());
    }
    out.push(b']');
}

fn base64_string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(
        base64::engine::general_purpose::STANDARD
            .encode(bytes)
            .as_bytes(),
    );
    out.push(b'"');
}

/// The embeddings document: each row in its `encoding`.
pub fn embeddings(
    rows: &[f32],
    dims: usize,
    encoding: Encoding,
    ranges: Option<&Ranges>,
    model: &str,
    tokens: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + rows.len() * 12);
    out.extend_from_slice(br#"{"object":"list","data":["#);
    let mut floats = ryu::Buffer::new();
    let mut bytes = Vec::with_capacity(dims * 4);
    for (i, row) in rows.chunks(dims.max(1)).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"object":"embedding","index":"#);
        out.extend_from_slice(i.to_string().as_bytes());
        out.extend_from_slice(br#","embedding":"#);
        if encoding.precision != Precision::Float32 {
            let q = quantization::quantize(row, encoding.precision, ranges);
            match (&q, encoding.base64) {
                (_, true) => base64_string(&mut out, &q.bytes()),
                (Row::Signed(v), false) => int_array(&mut out, v.iter().map(|&x| i16::from(x))),
                (Row::Unsigned(v), false) => int_array(&mut out, v.iter().map(|&x| i16::from(x))),
            }
        } else if encoding.base64 {
            bytes.clear();
            for v in row {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            base64_string(&mut out, &bytes);
        } else {
            float_array(&mut out, &mut floats, row);
        }
        out.push(b'}');
    }
    model_and_usage(&mut out, model, tokens);
    out
}

/// The rerank document: the documents `order` names, best first, each with its score (and its
/// text when `documents` are returned).
pub fn rerank(
    model: &str,
    order: &[usize],
    scores: &[f32],
    documents: Option<&[String]>,
    tokens: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + order.len() * 48);
    out.extend_from_slice(br#"{"model":"#);
    out.extend_from_slice(json_string(model).as_bytes());
    out.extend_from_slice(br#","results":["#);
    let mut number = ryu::Buffer::new();
    for (k, &i) in order.iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"index":"#);
        out.extend_from_slice(i.to_string().as_bytes());
        out.extend_from_slice(br#","relevance_score":"#);
        out.extend_from_slice(score_text(&mut number, scores[i]).as_bytes());
        if let Some(documents) = documents {
            out.extend_from_slice(br#","document":{"text":"#);
            out.extend_from_slice(json_string(&documents[i]).as_bytes());
            out.push(b'}');
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],");
    usage(&mut out, tokens);
    out
}

/// The score document: one score a pair, in the pairs' order.
pub fn scores(model: &str, scores: &[f32], tokens: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + scores.len() * 48);
    out.extend_from_slice(br#"{"object":"list","data":["#);
    let mut number = ryu::Buffer::new();
    for (i, &s) in scores.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"object":"score","index":"#);
        out.extend_from_slice(i.to_string().as_bytes());
        out.extend_from_slice(br#","score":"#);
        out.extend_from_slice(score_text(&mut number, s).as_bytes());
        out.push(b'}');
    }
    model_and_usage(&mut out, model, tokens);
    out
}

/// The sparse embeddings document: each row's ascending vocabulary ids and their weights.
pub fn sparse(model: &str, rows: &[(Vec<i32>, Vec<f32>)], vocab: usize, tokens: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + rows.len() * 64);
    out.extend_from_slice(br#"{"object":"list","data":["#);
    let mut floats = ryu::Buffer::new();
    let dims = vocab.to_string();
    for (i, (indices, values)) in rows.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"object":"sparse_embedding","index":"#);
        out.extend_from_slice(i.to_string().as_bytes());
        out.extend_from_slice(br#","embedding":"#);
        sparse_object(&mut out, &mut floats, indices, values);
        out.extend_from_slice(br#","dimensions":"#);
        out.extend_from_slice(dims.as_bytes());
        out.push(b'}');
    }
    model_and_usage(&mut out, model, tokens);
    out
}

/// The multi-vector document: each input's token vectors, as arrays of floats or as one base64
/// string of its row-major little-endian float32s.
pub fn multi_vector(model: &str, inputs: &[TokenVectors], base64: bool, tokens: usize) -> Vec<u8> {
    let floats_in = |v: &TokenVectors| v.rows.len();
    let mut out = Vec::with_capacity(64 + inputs.iter().map(floats_in).sum::<usize>() * 12);
    out.extend_from_slice(br#"{"object":"list","data":["#);
    let mut floats = ryu::Buffer::new();
    for (i, input) in inputs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"object":"multi_vector","index":"#);
        out.extend_from_slice(i.to_string().as_bytes());
        out.extend_from_slice(br#","embedding":"#);
        token_vectors(&mut out, &mut floats, input, base64);
        out.push(b'}');
    }
    model_and_usage(&mut out, model, tokens);
    out
}

/// `{"indices":[...],"values":[...]}`: a sparse vector's ascending ids and their weights.
fn sparse_object(out: &mut Vec<u8>, floats: &mut ryu::Buffer, indices: &[i32], values: &[f32]) {
    out.extend_from_slice(br#"{"indices":"#);
    int_array(out, indices.iter().copied());
    out.extend_from_slice(br#","values":"#);
    float_array(out, floats, values);
    out.push(b'}');
}

/// An input's token vectors: an array of float arrays, or one base64 string of its row-major
/// little-endian float32s.
fn token_vectors(out: &mut Vec<u8>, floats: &mut ryu::Buffer, input: &TokenVectors, base64: bool) {
    if base64 {
        base64_floats(out, &input.rows);
        return;
    }
    out.push(b'[');
    for (j, row) in input.tokens().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        float_array(out, floats, row);
    }
    out.push(b']');
}

fn base64_floats(out: &mut Vec<u8>, values: &[f32]) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64_string(out, &bytes);
}

/// The hybrid embeddings document: each input's outputs asked for, `dense` (an embedding, as
/// /v1/embeddings writes it in float or base64), `sparse` (the /v1/sparse_embeddings object's
/// `embedding`) and `multi_vector` (the /v1/multi-vector object's `embedding`).
pub fn hybrid(model: &str, rows: &[HybridRow], base64: bool, tokens: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + rows.len() * 256);
    out.extend_from_slice(br#"{"object":"list","data":["#);
    let mut floats = ryu::Buffer::new();
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"object":"hybrid_embedding","index":"#);
        out.extend_from_slice(i.to_string().as_bytes());
        if let Some(dense) = &row.dense {
            out.extend_from_slice(br#","dense":"#);
            if base64 {
                base64_floats(&mut out, dense);
            } else {
                float_array(&mut out, &mut floats, dense);
            }
        }
        if let Some((indices, values)) = &row.sparse {
            out.extend_from_slice(br#","sparse":"#);
            sparse_object(&mut out, &mut floats, indices, values);
        }
        if let Some(vectors) = &row.vectors {
            out.extend_from_slice(br#","multi_vector":"#);
            token_vectors(&mut out, &mut floats, vectors, base64);
        }
        out.push(b'}');
    }
    model_and_usage(&mut out, model, tokens);
    out
}

/// One model's entry of /v1/models.
pub fn model_entry(name: &str, created: u64) -> String {
    format!(
        r#"{{"id":{},"object":"model","created":{created},"owned_by":"embedfleet"}}"#,
        json_string(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifications_sort_best_first_with_ties_in_label_order() {
        let labels = vec!["a".to_string(), "b".into(), "c".into()];
        let doc = classifications(&[0.0, 0.8, 0.0], &labels, Some(2), "m", 3);
        assert_eq!(
            String::from_utf8(doc).unwrap(),
            r#"{"object":"list","data":[{"object":"classification","index":0,"label":"b","score":0.800000011920929,"labels":[{"label":"b","score":0.800000011920929},{"label":"a","score":0.0}],"probs":[0.0,0.800000011920929,0.0],"num_classes":3}],"model":"m","usage":{"prompt_tokens":3,"total_tokens":3}}"#
        );
    }

    #[test]
    fn body_shapes() {
        let b = embeddings(
            &[1.0, 0.1, -2.5, 3.0],
            2,
            crate::api::request::FLOAT,
            None,
            "m",
            7,
        );
        assert_eq!(
            String::from_utf8(b).unwrap(),
            r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1.0,0.1]},{"object":"embedding","index":1,"embedding":[-2.5,3.0]}],"model":"m","usage":{"prompt_tokens":7,"total_tokens":7}}"#
        );
        let base64 = crate::api::request::encoding("base64").unwrap();
        let b = embeddings(&[1.0], 1, base64, None, "m", 1);
        assert!(String::from_utf8(b)
            .unwrap()
            .contains(r#""embedding":"AACAPw==""#));
        let ubinary = crate::api::request::encoding("ubinary").unwrap();
        let b = String::from_utf8(embeddings(&[1.0, -1.0, 1.0], 3, ubinary, None, "m", 1)).unwrap();
        assert!(b.contains(r#""embedding":[160]"#), "{b}");
        let binary = crate::api::request::encoding("binary_base64").unwrap();
        let b = String::from_utf8(embeddings(&[-1.0], 1, binary, None, "m", 1)).unwrap();
        assert!(b.contains(r#""embedding":"gA==""#), "{b}"); // 0 - 128 as a byte: 0x80
        let inputs = [TokenVectors {
            rows: vec![1.0, 0.0, 0.5, -0.5],
            dims: 2,
        }];
        let b = String::from_utf8(multi_vector("m", &inputs, false, 3)).unwrap();
        assert_eq!(
            b,
            r#"{"object":"list","data":[{"object":"multi_vector","index":0,"embedding":[[1.0,0.0],[0.5,-0.5]]}],"model":"m","usage":{"prompt_tokens":3,"total_tokens":3}}"#
        );
        let b = String::from_utf8(multi_vector("m", &inputs[..], true, 3)).unwrap();
        assert!(
            b.contains(r#""embedding":"AACAPwAAAAAAAAA/AAAAvw==""#),
            "{b}"
        );
    }
}
