//! Wire-compatible subsets of the protocol's messages (embedfleet.proto): what the front reads
//! of a request to queue it (its token and sequence counts, an EmbedCall's id and timeout) and
//! how it wraps a reply the Python side serialized. A nested message is carried as its bytes
//! (the same wire type), so a request reaches Python without being re-encoded.
use bytes::Bytes;

/// An EmbedCall (one EmbedStream message), its request left as bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CallShape {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(bytes = "bytes", tag = "2")]
    pub request: Bytes,
    #[prost(double, tag = "3")]
    pub timeout_seconds: f64,
}

/// An EmbedReply, its response the EmbedResponse bytes Python built (empty: none).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReplyShape {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int32, tag = "2")]
    pub code: i32,
    #[prost(string, tag = "3")]
    pub message: String,
    #[prost(bytes = "bytes", tag = "4")]
    pub response: Bytes,
}

/// The part of an EmbedRequest the queue needs: its TokenBatch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestShape {
    #[prost(message, optional, tag = "1")]
    pub batch: Option<BatchShape>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchShape {
    #[prost(bytes = "bytes", tag = "1")]
    pub token_ids: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub lengths: Bytes,
}

/// A request's size as the scheduler counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub tokens: usize,
    pub sequences: usize,
    /// The token ids and lengths agree (whole int32 arrays, lengths summing to the ids): only
    /// then is the hard token limit checked here; otherwise the Python side answers the
    /// malformed batch with its own message.
    pub consistent: bool,
}

impl BatchShape {
    pub fn size(&self) -> Size {
        let tokens = self.token_ids.len() / 4;
        let sequences = self.lengths.len() / 4;
        let whole = self.token_ids.len().is_multiple_of(4) && self.lengths.len().is_multiple_of(4);
        // Read unsigned, as the Python codec does: a negative length never sums to the count.
        let sum: u64 = self
            .lengths
            .chunks_exact(4)
            .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .sum();
        Size {
            tokens,
            sequences,
            consistent: whole && sum == tokens as u64,
        }
    }
}
