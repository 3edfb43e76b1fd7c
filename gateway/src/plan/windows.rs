//! Inputs longer than the model's limit, split into overlapping windows and averaged back
//! (`split_long_inputs`). Pure functions.
//!
//! A text's special tokens ([CLS] ... [SEP]) are kept at both ends of every window, so each window
//! is an input the model was trained on; token-id inputs carry none. Windows start every `limit -
//! specials - overlap` content tokens (at least half of a window is new content); the last one ends
//! at the input's end. Each window is embedded unnormalized and an input's vector is the mean of
//! its windows weighted by their tokens, in f64 as numpy sums it, normalized after when the model
//! normalizes.

/// How many special tokens (mask 1) lead and trail an encoding.
pub fn special_ends(mask: &[u32]) -> (usize, usize) {
    let lead = mask.iter().take_while(|&&m| m != 0).count();
    let trail = mask[lead..].iter().rev().take_while(|&&m| m != 0).count();
    (lead, trail)
}

/// One input's windows of at most `limit` tokens, each with the `lead` and `trail` special
/// tokens of `ids` at its ends; an input within the limit is its own one window.
pub fn windows_of(
    ids: &[u32],
    lead: usize,
    trail: usize,
    limit: usize,
    overlap: usize,
) -> Result<Vec<Vec<u32>>, String> {
    if ids.len() <= limit {
        return Ok(vec![ids.to_vec()]);
    }
    let (head, tail) = (&ids[..lead], &ids[ids.len() - trail..]);
    let content = &ids[lead..ids.len() - trail];
    let room = limit.saturating_sub(lead + trail);
    if room < 1 {
        return Err(format!(
            "a window of {limit} tokens cannot hold {} special tokens",
            lead + trail
        ));
    }
    let step = room - overlap.min(room / 2);
    let mut out = Vec::new();
    let mut start = 0;
    loop {
        let stop = (start + room).min(content.len());
        let mut window = Vec::with_capacity(lead + (stop - start) + trail);
        window.extend_from_slice(head);
        window.extend_from_slice(&content[start..stop]);
        window.extend_from_slice(tail);
        out.push(window);
        if stop == content.len() {
            return Ok(out);
        }
        start += step;
    }
}

/// Every input's windows, flattened in input order, and each window's input.
pub fn split(
    ids: &[Vec<u32>],
    ends: &[(usize, usize)],
    limit: usize,
    overlap: usize,
) -> Result<(Vec<Vec<u32>>, Vec<usize>), String> {
    let mut flat = Vec::with_capacity(ids.len());
    let mut owner = Vec::with_capacity(ids.len());
    for (i, (seq, &(lead, trail))) in ids.iter().zip(ends).enumerate() {
        for w in windows_of(seq, lead, trail, limit, overlap)? {
            flat.push(w);
            owner.push(i);
        }
    }
    Ok((flat, owner))
}

/// One row per input: the token-weighted mean of its windows' rows (then L2-normalized).
pub fn merge(
    rows: &[f32],
    dims: usize,
    weights: &[usize],
    owner: &[usize],
    normalize: bool,
) -> Vec<f32> {
    let count = owner.last().map_or(0, |&o| o + 1);
    let mut sums = vec![0f64; count * dims];
    let mut totals = vec![0f64; count];
    for (row, (&o, &weight)) in rows.chunks(dims.max(1)).zip(owner.iter().zip(weights)) {
        let weight = weight as f64;
        for (s, &x) in sums[o * dims..(o + 1) * dims].iter_mut().zip(row) {
            *s += f64::from(x) * weight;
        }
        totals[o] += weight;
    }
    let mut out = Vec::with_capacity(count * dims);
    for (i, total) in totals.iter().enumerate() {
        let mean: Vec<f64> = sums[i * dims..(i + 1) * dims]
            .iter()
            .map(|s| s / total)
            .collect();
        let norm = if normalize {
            mean.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12)
        } else {
            1.0
        };
        out.extend(mean.iter().map(|v| (v / norm) as f32));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_ends_count_leading_and_trailing_specials() {
        assert_eq!(special_ends(&[1, 0, 0, 1]), (1, 1));
        assert_eq!(special_ends(&[0, 0]), (0, 0));
        assert_eq!(special_ends(&[1, 1]), (2, 0));
    }

    #[test]
    fn windows_keep_the_specials_and_overlap_at_most_half() {
        // [CLS]=1 ... [SEP]=2 around 10 content tokens, limit 6: room 4, overlap 1 -> step 3
        let ids: Vec<u32> = [1].into_iter().chain(10..20).chain([2]).collect();
        let w = windows_of(&ids, 1, 1, 6, 1).unwrap();
        assert_eq!(
            w,
            vec![
                vec![1, 10, 11, 12, 13, 2],
                vec![1, 13, 14, 15, 16, 2],
                vec![1, 16, 17, 18, 19, 2],
            ]
        );
        // an overlap past half the room is held to half
        let w = windows_of(&ids, 1, 1, 6, 100).unwrap();
        assert_eq!(w[1], vec![1, 12, 13, 14, 15, 2]);
        assert_eq!(windows_of(&ids[..5], 1, 1, 6, 1).unwrap().len(), 1);
        assert!(windows_of(&ids, 1, 1, 2, 0)
            .unwrap_err()
            .contains("cannot hold 2 special tokens"));
        let (flat, owner) = split(&[ids.clone(), vec![7]], &[(1, 1), (0, 0)], 6, 1).unwrap();
        assert_eq!((flat.len(), owner), (4, vec![0, 0, 0, 1]));
    }

    #[test]
    fn merge_weights_by_tokens_then_normalizes() {
        // input 0: windows [1,0] x3 tokens and [0,1] x1; input 1: one window [3,4]
        let rows = [1.0, 0.0, 0.0, 1.0, 3.0, 4.0];
        let out = merge(&rows, 2, &[3, 1, 5], &[0, 0, 1], false);
        assert_eq!(out, vec![0.75, 0.25, 3.0, 4.0]);
        let out = merge(&rows, 2, &[3, 1, 5], &[0, 0, 1], true);
        assert!((out[2] - 0.6).abs() < 1e-7 && (out[3] - 0.8).abs() < 1e-7);
    }
}
