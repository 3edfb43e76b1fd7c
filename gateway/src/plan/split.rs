//! Cutting a request into token-budget chunks. Pure.

/// Inputs [start, stop) of the request, holding `tokens` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub start: usize,
    pub stop: usize,
    pub tokens: usize,
}

/// Tokens per chunk: the request spread over every worker, within [min_tokens, max_tokens].
pub fn chunk_budget(total: usize, workers: usize, max_tokens: usize, min_tokens: usize) -> usize {
    let spread = total.div_ceil(workers.max(1));
    max_tokens.min(min_tokens.max(spread)).max(1)
}

/// The most tokens one chunk carries: `max_tokens`, or `seconds` of one worker's work at its
/// measured speed when that is less (never below `min_tokens`); unknown speed keeps the max.
pub fn paced_chunk_tokens(
    max_tokens: usize,
    worker_tokens_per_second: f64,
    seconds: f64,
    min_tokens: usize,
) -> usize {
    if worker_tokens_per_second <= 0.0 || seconds <= 0.0 {
        return max_tokens;
    }
    let paced = (worker_tokens_per_second * seconds) as usize; // truncated
    max_tokens.min(min_tokens.max(paced)).max(1)
}

/// Contiguous chunks of at most `budget` tokens and `max_sequences` inputs, in order; an input
/// longer than the budget travels alone.
pub fn plan(lengths: &[usize], budget: usize, max_sequences: usize) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    let (mut start, mut tokens) = (0, 0);
    for (i, &n) in lengths.iter().enumerate() {
        if i > start && (tokens + n > budget || i - start >= max_sequences) {
            chunks.push(Chunk {
                start,
                stop: i,
                tokens,
            });
            start = i;
            tokens = 0;
        }
        tokens += n;
    }
    if lengths.len() > start {
        chunks.push(Chunk {
            start,
            stop: lengths.len(),
            tokens,
        });
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_requests_stay_whole() {
        assert_eq!(chunk_budget(20, 2, 8192, 512), 512);
        assert_eq!(
            plan(&[20], 512, 256),
            vec![Chunk {
                start: 0,
                stop: 1,
                tokens: 20
            }]
        );
    }

    #[test]
    fn large_requests_spread_over_workers() {
        assert_eq!(chunk_budget(51200, 2, 8192, 512), 8192);
        assert_eq!(chunk_budget(10000, 4, 8192, 512), 2500);
        let chunks = plan(&[512; 100], 8192, 256);
        assert_eq!(chunks.len(), 7);
        assert_eq!(
            chunks[0],
            Chunk {
                start: 0,
                stop: 16,
                tokens: 8192
            }
        );
        assert_eq!(
            chunks[6],
            Chunk {
                start: 96,
                stop: 100,
                tokens: 2048
            }
        );
    }

    #[test]
    fn sequences_cap_and_oversize_inputs() {
        let chunks = plan(&[1; 5], 100, 2);
        assert_eq!(
            chunks.iter().map(|c| c.stop - c.start).collect::<Vec<_>>(),
            [2, 2, 1]
        );
        let chunks = plan(&[10, 300, 10], 100, 256);
        assert_eq!(chunks.len(), 3);
        assert_eq!(
            chunks[1],
            Chunk {
                start: 1,
                stop: 2,
                tokens: 300
            }
        );
        assert!(plan(&[], 100, 2).is_empty());
    }

    #[test]
    fn pacing() {
        assert_eq!(paced_chunk_tokens(8192, 0.0, 1.0, 512), 8192);
        assert_eq!(paced_chunk_tokens(8192, 1074.5, 1.0, 512), 1074);
        assert_eq!(paced_chunk_tokens(8192, 100.0, 1.0, 512), 512);
        assert_eq!(paced_chunk_tokens(8192, 1e9, 1.0, 512), 8192);
        assert_eq!(paced_chunk_tokens(8192, 5000.0, 0.0, 512), 8192);
    }
}
