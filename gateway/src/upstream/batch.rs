//! The worker protocol's batches and replies: token ids packed as a worker reads them, and
//! replies read back and checked (a reply that breaks the contract is a 500, logged).

use std::time::{Duration, Instant};

use crate::api::errors::ApiError;
use crate::telemetry::logs::Limiter;
use crate::upstream::proto::{
    EmbedResponse, FloatFormat, HybridEmbedResponse, MultiVectorEmbedResponse, SparseEmbedResponse,
    TokenBatch,
};

/// Rows of one Embed reply as float32 (a worker may answer float16).
pub fn rows(reply: &EmbedResponse) -> Vec<f32> {
    decode(&reply.embeddings, reply.format)
}

/// Packed little-endian floats in `format` as float32.
fn decode(bytes: &[u8], format: i32) -> Vec<f32> {
    if format == FloatFormat::Float16 as i32 {
        bytes
            .chunks_exact(2)
            .map(|b| half_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect()
    } else {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

fn half_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, _) => {
            // subnormal: normalise it
            let shift = frac.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | (((frac << shift) & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (frac << 13),
        _ => sign | ((exp + 112) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

/// The packed little-endian batch a worker reads; a pair's type ids one byte a token.
pub fn pack_pairs(seqs: &[Vec<u32>], types: &[Vec<u32>]) -> TokenBatch {
    let mut batch = pack(seqs);
    batch.token_type_ids = types.iter().flatten().map(|&t| t as u8).collect();
    batch
}

/// The packed little-endian batch a worker reads.
pub fn pack(seqs: &[Vec<u32>]) -> TokenBatch {
    let total: usize = seqs.iter().map(Vec::len).sum();
    let mut ids = Vec::with_capacity(total * 4);
    let mut lengths = Vec::with_capacity(seqs.len() * 4);
    for s in seqs {
        lengths.extend_from_slice(&(s.len() as i32).to_le_bytes());
        for &t in s {
            ids.extend_from_slice(&(t as i32).to_le_bytes());
        }
    }
    TokenBatch {
        token_ids: ids,
        lengths,
        token_type_ids: Vec::new(),
        key_lengths: Vec::new(),
    }
}

/// The packed batch with each sequence's count of leading tokens that are attention keys
/// (`keys`; empty: every token is one), sent only when one of them falls short of its sequence.
pub fn pack_keyed(seqs: &[Vec<u32>], keys: &[usize]) -> TokenBatch {
    let mut batch = pack(seqs);
    if seqs.iter().zip(keys).any(|(s, &k)| k < s.len()) {
        batch.key_lengths = keys
            .iter()
            .flat_map(|&k| (k as i32).to_le_bytes())
            .collect();
    }
    batch
}

/// One sparse vector: its ascending vocabulary ids and their weights.
pub type SparseRow = (Vec<i32>, Vec<f32>);

/// A SparseEmbedResponse's rows, `expected` of them, each within the reply's ids.
pub fn sparse_rows(
    reply: &SparseEmbedResponse,
    expected: usize,
) -> Result<Vec<SparseRow>, ApiError> {
    let ints = |b: &[u8]| -> Vec<i32> {
        b.chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let (bounds, ids) = (ints(&reply.offsets), ints(&reply.indices));
    let weights = floats(&reply.values, ids.len(), 1, ids.len())?;
    let count = reply.count as usize;
    let ordered = bounds.windows(2).all(|w| w[0] <= w[1])
        && bounds.first() == Some(&0)
        && bounds.last().map(|&b| b as usize) == Some(ids.len());
    if bounds.len() != count + 1 || count != expected || !(ordered || count == 0) {
        return Err(broken_reply(
            "a worker's sparse rows do not match their offsets",
        ));
    }
    Ok(bounds
        .windows(2)
        .map(|w| {
            let (a, b) = (w[0] as usize, w[1] as usize);
            (ids[a..b].to_vec(), weights[a..b].to_vec())
        })
        .collect())
}

/// One input's token vectors: `dims` floats a row, a row a token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenVectors {
    pub rows: Vec<f32>,
    pub dims: usize,
}

impl TokenVectors {
    /// Its token vectors, in order.
    pub fn tokens(&self) -> std::slice::ChunksExact<'_, f32> {
        self.rows.chunks_exact(self.dims.max(1))
    }
}

/// A MultiVectorEmbedResponse's inputs, `expected` of them, each its rows of the reply.
pub fn token_vectors(
    reply: &MultiVectorEmbedResponse,
    expected: usize,
) -> Result<Vec<TokenVectors>, ApiError> {
    let bounds: Vec<i32> = reply
        .offsets
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (count, dims) = (reply.count as usize, reply.dimensions as usize);
    let rows = decode(&reply.vectors, reply.format);
    let total = bounds.last().map_or(0, |&b| b.max(0) as usize);
    let width = if reply.format == FloatFormat::Float16 as i32 {
        2
    } else {
        4
    };
    let ordered = bounds.windows(2).all(|w| w[0] <= w[1]) && bounds.first() == Some(&0);
    if bounds.len() != count + 1
        || count != expected
        || !ordered
        || reply.vectors.len() != total * dims * width
    {
        return Err(broken_reply(
            "a worker's token vectors do not match their offsets",
        ));
    }
    Ok(bounds
        .windows(2)
        .map(|w| TokenVectors {
            rows: rows[w[0] as usize * dims..w[1] as usize * dims].to_vec(),
            dims,
        })
        .collect())
}

/// One input's outputs of a hybrid model, those asked for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HybridRow {
    pub dense: Option<Vec<f32>>,
    pub sparse: Option<SparseRow>,
    pub vectors: Option<TokenVectors>,
}

/// A HybridEmbedResponse's inputs, `expected` of them: each part asked for (`wanted`: dense,
/// sparse, token vectors) read as its own RPC's reply is.
pub fn hybrid_rows(
    reply: &HybridEmbedResponse,
    (dense, sparse, vectors): (bool, bool, bool),
    expected: usize,
) -> Result<Vec<HybridRow>, ApiError> {
    let missing = || broken_reply("a worker's hybrid reply lacks an output asked for");
    let mut out = vec![HybridRow::default(); expected];
    if dense {
        let reply = reply.dense.as_ref().ok_or_else(missing)?;
        let (count, dims) = (reply.count as usize, reply.dimensions as usize);
        let rows = self::rows(reply);
        if count != expected || rows.len() != count * dims {
            return Err(broken_reply("a worker answered the wrong number of bytes"));
        }
        for (row, floats) in out.iter_mut().zip(rows.chunks_exact(dims.max(1))) {
            row.dense = Some(floats.to_vec());
        }
    }
    if sparse {
        let reply = reply.sparse.as_ref().ok_or_else(missing)?;
        for (row, sparse) in out.iter_mut().zip(sparse_rows(reply, expected)?) {
            row.sparse = Some(sparse);
        }
    }
    if vectors {
        let reply = reply.multi_vector.as_ref().ok_or_else(missing)?;
        for (row, vectors) in out.iter_mut().zip(token_vectors(reply, expected)?) {
            row.vectors = Some(vectors);
        }
    }
    Ok(out)
}

/// One line per 10 s: a broken worker would answer every request so.
static BROKEN_REPLY_LOG: Limiter = Limiter::new(Duration::from_secs(10));

/// The 500 of a reply that breaks the workers' contract, logged at most once per 10 s.
pub fn broken_reply(what: &'static str) -> ApiError {
    if let Some(held) = BROKEN_REPLY_LOG.allow(Instant::now()) {
        tracing::error!(suppressed = held, "{what}");
    }
    ApiError::Internal {}
}

/// `rows` x `cols` little-endian float32s of a reply, which must be `expected` rows (else the
/// worker broke the contract: a 500).
pub fn floats(
    data: &[u8],
    rows: usize,
    cols: usize,
    expected: usize,
) -> Result<Vec<f32>, ApiError> {
    if data.len() != rows * cols * 4 || rows != expected {
        return Err(broken_reply("a worker answered the wrong number of bytes"));
    }
    Ok(data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_floats_decode() {
        assert_eq!(half_to_f32(0x3c00), 1.0);
        assert_eq!(half_to_f32(0xc000), -2.0);
        assert_eq!(half_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(half_to_f32(0x3555), 0.33325195);
    }

    #[test]
    fn token_vectors_split_at_their_offsets() {
        let halves = |v: &[u16]| v.iter().flat_map(|h| h.to_le_bytes()).collect::<Vec<u8>>();
        let offsets = |v: &[i32]| v.iter().flat_map(|o| o.to_le_bytes()).collect::<Vec<u8>>();
        let mut reply = MultiVectorEmbedResponse {
            vectors: halves(&[0x3c00, 0, 0, 0x3c00, 0xc000, 0]),
            offsets: offsets(&[0, 2, 2, 3]),
            count: 3,
            dimensions: 2,
            format: FloatFormat::Float16 as i32,
            prompt_tokens: 6,
        };
        let got = token_vectors(&reply, 3).unwrap();
        assert_eq!(got[0].rows, [1.0, 0.0, 0.0, 1.0]);
        assert!(got[1].rows.is_empty());
        assert_eq!(got[2].tokens().collect::<Vec<_>>(), [[-2.0, 0.0]]);
        assert!(token_vectors(&reply, 2).is_err());
        reply.offsets = offsets(&[0, 2, 1, 3]);
        assert!(token_vectors(&reply, 3).is_err());
    }

    #[test]
    fn packing_is_little_endian_int32() {
        let b = pack(&[vec![1, 2], vec![3]]);
        assert_eq!(b.lengths, [2, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(b.token_ids.len(), 12);
        assert_eq!(&b.token_ids[8..], [3, 0, 0, 0]);
        assert!(b.key_lengths.is_empty());
    }

    #[test]
    fn key_lengths_go_only_where_one_falls_short() {
        let seqs = [vec![1, 2, 3], vec![4]];
        assert!(pack_keyed(&seqs, &[3, 1]).key_lengths.is_empty());
        assert!(pack_keyed(&seqs, &[]).key_lengths.is_empty());
        let b = pack_keyed(&seqs, &[2, 1]);
        assert_eq!(b.key_lengths, [2, 0, 0, 0, 1, 0, 0, 0]);
    }
}
