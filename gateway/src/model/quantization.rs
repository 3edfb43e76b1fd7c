//! Quantized outputs: what each `encoding_format` sends for a float32 row, and the calibration that
//! fixes a model's int8/uint8 ranges.
//!
//! The arithmetic is sentence-transformers' `quantize_embeddings`, in float32 step for step as
//! numpy runs it, so clients get the integers that library computes: int8/uint8 cut each
//! dimension's calibrated [min, max] into 256 buckets (values outside clip to the end buckets);
//! binary/ubinary keep each dimension's sign bit, packed 8 a byte, most significant bit first,
//! binary as int8 (byte - 128).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::api::request::Precision;

/// Per-dimension [min, max] of one dimension count.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranges {
    pub min: Vec<f32>,
    pub max: Vec<f32>,
}

/// One quantized row: signed values (int8, binary) or unsigned ones (uint8, ubinary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Row {
    Signed(Vec<i8>),
    Unsigned(Vec<u8>),
}

impl Row {
    /// The row's bytes as the base64 form sends them (one byte a value).
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Row::Signed(v) => v.iter().map(|&b| b as u8).collect(),
            Row::Unsigned(v) => v.clone(),
        }
    }
}

/// Pure: `row` in a quantized precision (not float32); `ranges` for int8 and uint8.
pub fn quantize(row: &[f32], precision: Precision, ranges: Option<&Ranges>) -> Row {
    match precision {
        Precision::Int8 | Precision::Uint8 => {
            let r = ranges.expect("int8/uint8 are refused without ranges before any work");
            let buckets = row
                .iter()
                .zip(r.min.iter().zip(&r.max))
                .map(|(&x, (&lo, &hi))| {
                    let step = (hi - lo) / 255.0f32;
                    let step = if step == 0.0 { 1.0 } else { step };
                    ((x - lo) / step).floor().clamp(0.0, 255.0)
                });
            if precision == Precision::Int8 {
                Row::Signed(buckets.map(|b| (b - 128.0) as i8).collect())
            } else {
                Row::Unsigned(buckets.map(|b| b as u8).collect())
            }
        }
        _ => {
            let bits: Vec<u8> = row
                .chunks(8)
                .map(|eight| {
                    eight
                        .iter()
                        .enumerate()
                        .fold(0u8, |byte, (i, &x)| byte | (u8::from(x > 0.0) << (7 - i)))
                })
                .collect();
            if precision == Precision::Binary {
                Row::Signed(bits.iter().map(|&b| b.wrapping_sub(128) as i8).collect())
            } else {
                Row::Unsigned(bits)
            }
        }
    }
}

pub const CALIBRATION_FILE: &str = "embedfleet_quantization.json";
const CALIBRATION_KIND: &str = "embedfleet.dev/quantization-calibration";
/// The bundled all-MiniLM-L6-v2's calibration (its package directory is read-only), compiled
/// in; the build key covers it (hack/build-gateway.sh).
const BUNDLED: &str = include_str!("minilm_quantization.json");

/// int8/uint8 ranges of one model, per served dimension count (Matryoshka sizes differ).
#[derive(Debug, Clone, Default)]
pub struct Calibration {
    pub ranges: BTreeMap<usize, Ranges>,
}

fn floats(value: &Value) -> Option<Vec<f32>> {
    value
        .as_array()?
        .iter()
        .map(|v| v.as_f64().map(|f| f as f32))
        .collect()
}

/// A calibration document, checked: its kind and version, and each dimension count's ranges.
pub fn parse_calibration(doc: &Value, at: &str) -> Result<Calibration, String> {
    if doc["kind"] != CALIBRATION_KIND {
        return Err(format!(
            "{at}: not a calibration file (kind '{CALIBRATION_KIND}')"
        ));
    }
    if doc["version"] != 1 {
        return Err(format!(
            "{at}: unsupported calibration version {}",
            doc["version"]
        ));
    }
    let mut out = Calibration::default();
    for (key, value) in doc["ranges"].as_object().into_iter().flatten() {
        let dims: usize = key
            .parse()
            .map_err(|_| format!("{at}: ranges['{key}'] is malformed"))?;
        let (Some(min), Some(max)) = (floats(&value["min"]), floats(&value["max"])) else {
            return Err(format!("{at}: ranges['{key}'] is malformed"));
        };
        if min.len() != dims || max.len() != dims {
            return Err(format!(
                "{at}: ranges['{key}'] must hold {dims} min and max values"
            ));
        }
        let ordered = min
            .iter()
            .zip(&max)
            .all(|(lo, hi)| lo.is_finite() && hi.is_finite() && lo <= hi);
        if !ordered {
            return Err(format!("{at}: ranges['{key}'] needs finite min <= max"));
        }
        out.ranges.insert(dims, Ranges { min, max });
    }
    if out.ranges.is_empty() {
        return Err(format!("{at}: no ranges"));
    }
    Ok(out)
}

fn load_calibration(path: &Path) -> Result<Calibration, String> {
    let at = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{at}: {e}"))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{at}: {e}"))?;
    parse_calibration(&doc, &at)
}

/// The file named by --quantization-file, else the model directory's own, else (the bundled
/// model only) the shipped one; None when there is none (int8/uint8 are then refused).
pub fn find_calibration(
    setting: &str,
    model_dir: &Path,
    bundled: bool,
) -> Result<Option<Calibration>, String> {
    if !setting.is_empty() {
        return load_calibration(Path::new(setting)).map(Some);
    }
    let own = model_dir.join(CALIBRATION_FILE);
    if own.is_file() {
        return load_calibration(&own).map(Some);
    }
    if bundled {
        let doc: Value = serde_json::from_str(BUNDLED).map_err(|e| e.to_string())?;
        return parse_calibration(&doc, "the bundled calibration").map(Some);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cut_the_range_into_256_and_clip_outside() {
        let r = Ranges {
            min: vec![-1.0, 0.0, 0.5],
            max: vec![1.0, 0.0, 0.5],
        };
        // -1 is bucket 0, 1 bucket 255, beyond clips; a zero-width range has step 1
        let row = [-1.0, 0.0, 0.5];
        assert_eq!(
            quantize(&row, Precision::Uint8, Some(&r)),
            Row::Unsigned(vec![0, 0, 0])
        );
        let row = [1.5, 7.0, -3.0];
        assert_eq!(
            quantize(&row, Precision::Uint8, Some(&r)),
            Row::Unsigned(vec![255, 7, 0])
        );
        let row = [0.0, 0.0, 0.0];
        assert_eq!(
            quantize(&row, Precision::Int8, Some(&r)),
            Row::Signed(vec![-1, -128, -128])
        );
    }

    #[test]
    fn sign_bits_pack_most_significant_first_and_pad_with_zeros() {
        let row = [1.0, -1.0, 0.0, 2.0, 0.1, -0.1, 3.0, 4.0, 5.0, -5.0];
        // 1001 1011, then 10 padded: 1000 0000
        assert_eq!(
            quantize(&row, Precision::Ubinary, None),
            Row::Unsigned(vec![0b1001_1011, 0b1000_0000])
        );
        assert_eq!(
            quantize(&row, Precision::Binary, None),
            Row::Signed(vec![(0b1001_1011u8 - 128) as i8, 0])
        );
        assert_eq!(Row::Signed(vec![-1, 0]).bytes(), vec![255, 0]);
    }

    #[test]
    fn the_bundled_calibration_parses_and_bad_files_say_why() {
        let bundled = find_calibration("", Path::new("/nonexistent"), true)
            .unwrap()
            .unwrap();
        assert!(bundled.ranges.contains_key(&384));
        assert!(find_calibration("", Path::new("/nonexistent"), false)
            .unwrap()
            .is_none());
        let doc = serde_json::json!({"kind": CALIBRATION_KIND, "version": 1,
            "ranges": {"2": {"min": [0.0, 1.0], "max": [1.0, 0.0]}}});
        assert!(parse_calibration(&doc, "f")
            .unwrap_err()
            .contains("needs finite min <= max"));
        let doc = serde_json::json!({"kind": "other", "version": 1});
        assert!(parse_calibration(&doc, "f")
            .unwrap_err()
            .contains("not a calibration file"));
        let doc = serde_json::json!({"kind": CALIBRATION_KIND, "version": 1,
            "ranges": {"3": {"min": [0.0], "max": [1.0]}}});
        assert!(parse_calibration(&doc, "f")
            .unwrap_err()
            .contains("must hold 3"));
    }
}
