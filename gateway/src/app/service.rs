//! One served model and its endpoints, each from a parsed request to its response document:
//! checked, tokenized, admitted by tokens, chunked over the workers and answered. No HTTP here.

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Duration;

use crate::api::errors::ApiError;
use crate::api::request::{
    ClassifyRequest, EmbeddingRequest, Encoding, HybridRequest, Input, MultiVectorRequest,
    PairRequest, RerankRequest, ScoreRequest, Side, SparseRequest,
};
use crate::app::documents;
use crate::model::dir::{Head, ModelDir, Task};
use crate::model::quantization::{Calibration, Ranges};
use crate::plan::admission::{Admission, Fleet, Ticket};
use crate::plan::hold::Hold;
use crate::plan::split::{chunk_budget, paced_chunk_tokens, plan, Chunk};
use crate::plan::tokenize::{Tokenization, DEFAULT_INSTRUCTION};
use crate::plan::windows;
use crate::settings::Settings;
use crate::telemetry::metrics::ModelMetrics;
use crate::telemetry::traces::{self, Kind, Tracer};
use crate::upstream::batch::{
    broken_reply, pack, pack_keyed, pack_pairs, HybridRow, SparseRow, TokenVectors,
};
use crate::upstream::pool::Pool;

/// One served model: its settings (the process's, with a models file's per-model ones), model
/// directory, tokenizer, workers and the decisions in front of them.
pub struct Service {
    pub settings: Settings,
    pub model: ModelDir,
    /// the served name (`--served-model-name`, else the model's); fixed for the process's life
    pub name: &'static str,
    pub tokenization: Arc<Tokenization>,
    pub pool: Arc<Pool>,
    pub metrics: Arc<ModelMetrics>,
    /// The admit-or-shed decision and the work this gateway admitted (admission.rs).
    pub admission: Arc<Admission>,
    /// Requests waiting for a first ready worker (scale from zero; hold.rs).
    pub hold: Hold,
    /// The lane of the largest tokenizations (`--tokenize-large-chars`): one at a time, so they
    /// never take every tokenizer thread from the others.
    pub large_lane: tokio::sync::Semaphore,
    /// int8/uint8 ranges (--quantization-file, the model's own, or the bundled model's).
    pub calibration: Option<Calibration>,
    pub created: u64,
    /// OpenTelemetry spans of requests (trace.rs); off without an endpoint.
    pub tracer: Tracer,
}

/// An embeddings request's answer: `dims` floats a row, and what its documents need.
pub struct Embedded<'a> {
    pub rows: Vec<f32>,
    pub dims: usize,
    pub tokens: usize,
    pub ranges: Option<&'a Ranges>,
}

/// What a tokenization made: its sequences, for the `tokenize` span's counts.
pub trait Sequences {
    fn sequences(&self) -> &[Vec<u32>];
}

impl Sequences for Vec<Vec<u32>> {
    fn sequences(&self) -> &[Vec<u32>] {
        self
    }
}

impl<T> Sequences for (Vec<Vec<u32>>, T) {
    fn sequences(&self) -> &[Vec<u32>] {
        &self.0
    }
}

impl Service {
    fn check_count(&self, count: usize, param: &'static str) -> Result<(), ApiError> {
        if count == 0 {
            return Err(ApiError::Empty { param });
        }
        let most = self.settings.max_client_batch;
        if count > most {
            return Err(ApiError::TooManyItems { param, count, most });
        }
        Ok(())
    }

    fn chunks(&self, lengths: &[usize], total: usize) -> Vec<Chunk> {
        let s = &self.settings;
        let (usable, capacity) = self.pool.usable();
        let workers = usable.max(1);
        let most = paced_chunk_tokens(
            s.chunk_tokens,
            capacity / workers as f64,
            s.chunk_seconds,
            s.min_chunk_tokens,
        );
        let budget = chunk_budget(total, workers, most, s.min_chunk_tokens);
        plan(lengths, budget, s.chunk_sequences)
    }

    /// The request's token ids and their key lengths (`Service::pylate_encode`); with
    /// `windowed`, over-long inputs stay whole and each input's special ends come too, for
    /// splitting into windows.
    #[allow(clippy::type_complexity)]
    async fn tokenize(
        &self,
        input: &Input,
        input_type: Option<&str>,
        (truncate, side): (bool, Side),
        windowed: bool,
    ) -> Result<(Vec<Vec<u32>>, Option<Vec<(usize, usize)>>, Vec<usize>), ApiError> {
        match input {
            Input::Texts(texts) => {
                empty_item(texts, "input")?;
                let prompt = self.model.prompt_for(input_type).to_string();
                let (mut ids, ends) = self
                    .tokenized(texts, move |tok, texts| {
                        if windowed {
                            tok.whole_texts(texts, &prompt)
                                .map(|(ids, ends)| (ids, Some(ends)))
                        } else {
                            tok.texts(texts, &prompt, truncate, side)
                                .map(|ids| (ids, None))
                        }
                    })
                    .await?;
                let keys = match windowed {
                    true => Vec::new(),
                    false => self.pylate_encode(&mut ids, input_type),
                };
                Ok((ids, ends, keys))
            }
            Input::Ids(seqs) => {
                let ids = self
                    .tokenization
                    .token_ids(seqs, truncate, side, windowed)?;
                let ends = windowed.then(|| vec![(0, 0); ids.len()]);
                Ok((ids, ends, Vec::new()))
            }
        }
    }

    /// The request's tokens within the per-request limit; then counted, and the ticket holds
    /// their true count from here on.
    fn check_tokens(
        &self,
        lengths: &[usize],
        param: &'static str,
        ticket: &Ticket,
    ) -> Result<(), ApiError> {
        let total: usize = lengths.iter().sum();
        let most = self.settings.max_request_tokens;
        if total > most {
            return Err(ApiError::TooManyTokens { param, total, most });
        }
        self.metrics.input_tokens.inc_by(total as u64);
        ticket.tokenized(lengths);
        Ok(())
    }

    /// Refuse early what cannot be served (503 without a ready worker); a request to be held
    /// is let through, so that it is tokenized and counted as demand before it waits.
    fn admit_ready(&self) -> Result<(), ApiError> {
        if !self.hold.will_hold() && !self.pool.ready() {
            return Err(ApiError::NoReadyWorker {});
        }
        Ok(())
    }

    /// Each chunk of inputs of `lengths` through `call` (given the chunk and the upstream
    /// deadline), the answers in chunk order. First, while no worker is ready, the request is
    /// held (`--hold-requests`).
    async fn fan_out<T, Fut>(
        &self,
        lengths: &[usize],
        call: impl Fn(Chunk, Duration) -> Fut,
    ) -> Result<Vec<T>, ApiError>
    where
        Fut: std::future::Future<Output = Result<T, ApiError>>,
    {
        let total: usize = lengths.iter().sum();
        self.hold.until_ready(total).await?;
        let timeout = Duration::from_secs_f64(self.settings.upstream_timeout_seconds);
        let chunks = self.chunks(lengths, total);
        self.metrics.chunks.observe(chunks.len() as f64);
        let mut span = self.tracer.child("compute", Kind::Internal);
        span.int("embedfleet.chunks", chunks.len() as i64);
        // The first failure answers the request: the other chunks' calls are dropped, which
        // cancels them (counted in embedfleet_gateway_cancelled_calls_total).
        let calls =
            futures_util::future::try_join_all(chunks.into_iter().map(|c| call(c, timeout)));
        traces::within(span.context(), calls).await
    }

    /// Rows of `ids` from the workers, chunked over them; `normalize` None: the model's way.
    /// First, while no worker is ready, the request is held (`--hold-requests`).
    async fn embed(
        &self,
        ids: &[Vec<u32>],
        requested: u32,
        normalize: Option<bool>,
    ) -> Result<Vec<f32>, ApiError> {
        let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
        // Only a whole small request is merged with others at the gateway; a large one's
        // chunks go at once, however small each is, and queue at the workers.
        let small = lengths.iter().sum::<usize>() < self.settings.min_chunk_tokens;
        let rows = self
            .fan_out(&lengths, |c, timeout| {
                let batch = pack(&ids[c.start..c.stop]);
                self.pool
                    .embed(batch, requested, normalize, c.tokens, small, timeout)
            })
            .await?
            .concat();
        if ids.is_empty() || rows.len() % ids.len() != 0 {
            return Err(broken_reply(
                "workers answered a number of floats that is no multiple of the inputs",
            ));
        }
        Ok(rows)
    }

    /// Inputs over the limit as windows in one batch; each input's token-weighted mean.
    async fn embed_windows(
        &self,
        ids: &[Vec<u32>],
        ends: &[(usize, usize)],
        (requested, normalize): (u32, Option<bool>),
        ticket: &Ticket,
    ) -> Result<(Vec<f32>, usize), ApiError> {
        let limit = self.tokenization.max_tokens;
        let overlap = self.settings.split_overlap_tokens;
        let (flat, owner) = windows::split(ids, ends, limit, overlap)
            .map_err(|detail| ApiError::CannotSplit { detail })?;
        let weights: Vec<usize> = flat.iter().map(Vec::len).collect();
        let total: usize = weights.iter().sum();
        self.check_tokens(&weights, "input", ticket)?;
        if flat.len() == ids.len() {
            return Ok((self.embed(&flat, requested, normalize).await?, total));
        }
        let mut windows_of = vec![0usize; ids.len()];
        for &o in &owner {
            windows_of[o] += 1;
        }
        let split = windows_of.iter().filter(|&&n| n > 1).count();
        self.metrics.split_inputs.inc_by(split as u64);
        let normalize = normalize.unwrap_or(self.pool.default_normalize());
        let rows = self.embed(&flat, requested, Some(false)).await?;
        let dims = rows.len() / flat.len();
        let merged = windows::merge(&rows, dims, &weights, &owner, normalize);
        Ok((merged, total))
    }

    /// The embedding's full width: the workers' when they told it, else the model's.
    pub fn dimensions(&self) -> usize {
        match self.pool.dimensions() {
            0 => self.model.hidden_size,
            d => d as usize,
        }
    }

    /// The request's rows (`dims` floats each), the tokens they took, and the calibration
    /// ranges its encoding needs: what every embeddings document is written from.
    pub async fn embedded(
        &self,
        req: &EmbeddingRequest,
        route: &'static str,
        ticket: &Ticket,
    ) -> Result<Embedded<'_>, ApiError> {
        self.require(Task::Embed, route)?;
        let dims = self.dimensions();
        if let Some(got) = req.dimensions.filter(|&d| d > dims as i64) {
            return Err(ApiError::DimensionsOutOfRange { most: dims, got });
        }
        let ranges = self.ranges(req.encoding, req.dimensions.map_or(dims, |d| d as usize))?;
        if req.truncate && req.split_long_inputs == Some(true) {
            return Err(ApiError::TruncateAndSplit {});
        }
        let windowed = !req.truncate
            && req
                .split_long_inputs
                .unwrap_or(self.settings.split_long_inputs);
        let count = req.input.len();
        self.check_count(count, "input")?;
        self.admit_ready()?;
        let how = (req.truncate, req.side);
        // An embedder has no PyLate rules: every token is a key.
        let (ids, ends, _) = self
            .tokenize(&req.input, req.input_type.as_deref(), how, windowed)
            .await?;
        let requested = match req.dimensions {
            Some(d) if (d as usize) < dims => d as u32,
            _ => 0,
        };
        let (rows, tokens) = match ends {
            Some(ends) => {
                let normalize = req.normalize;
                self.embed_windows(&ids, &ends, (requested, normalize), ticket)
                    .await?
            }
            None => {
                let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
                self.check_tokens(&lengths, "input", ticket)?;
                let total = lengths.iter().sum();
                (self.embed(&ids, requested, req.normalize).await?, total)
            }
        };
        let dims = rows.len() / count;
        Ok(Embedded {
            rows,
            dims,
            tokens,
            ranges,
        })
    }

    pub async fn embeddings(
        &self,
        req: EmbeddingRequest,
        ticket: &Ticket,
    ) -> Result<Vec<u8>, ApiError> {
        let e = self.embedded(&req, "/v1/embeddings", ticket).await?;
        Ok(documents::embeddings(
            &e.rows,
            e.dims,
            req.encoding,
            e.ranges,
            self.name,
            e.tokens,
        ))
    }

    /// `work` on `texts`, timed as one tokenization (`on_tokenizer`).
    async fn tokenized<T: Sequences + Send + 'static>(
        &self,
        texts: &[String],
        work: impl FnOnce(&Tokenization, &[String]) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let chars: usize = texts.iter().map(|t| t.chars().count()).sum();
        self.on_tokenizer(chars, texts, work).await
    }

    /// `work` on `items` of `chars` characters, timed as one tokenization: inline below
    /// `--tokenize-inline-chars` characters, else on the tokenizer threads (the blocking pool),
    /// so a large request never stalls the connections the event loop serves; from
    /// `--tokenize-large-chars` on, in the large lane, so a huge one never delays the others.
    async fn on_tokenizer<I, T>(
        &self,
        chars: usize,
        items: &I,
        work: impl FnOnce(&Tokenization, &I) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError>
    where
        I: ToOwned + ?Sized,
        I::Owned: Send + 'static,
        T: Sequences + Send + 'static,
    {
        let mut span = self.tracer.child("tokenize", Kind::Internal);
        let start = std::time::Instant::now();
        let done = if chars < self.settings.tokenize_inline_chars {
            work(&self.tokenization, items)
        } else {
            let _lane = if chars >= self.settings.tokenize_large_chars {
                // Closed never: the semaphore lives as long as the service.
                Some(
                    self.large_lane
                        .acquire()
                        .await
                        .map_err(|_| ApiError::Internal {})?,
                )
            } else {
                None
            };
            let tok = Arc::clone(&self.tokenization);
            let owned = items.to_owned();
            tokio::task::spawn_blocking(move || work(&tok, owned.borrow()))
                .await
                .map_err(|_| ApiError::Internal {})?
        };
        // Timed when it succeeds: a refusal is no tokenization.
        if let Ok(made) = &done {
            self.metrics.tokenize.observe(start.elapsed().as_secs_f64());
            let sequences = made.sequences();
            span.int("embedfleet.inputs", sequences.len() as i64);
            span.int(
                "embedfleet.tokens",
                sequences.iter().map(Vec::len).sum::<usize>() as i64,
            );
        }
        done
    }

    /// Texts' ids with the prompt of `input_type`, and their key lengths.
    async fn text_ids(
        &self,
        texts: &[String],
        input_type: &str,
        truncate: bool,
        side: Side,
    ) -> Result<(Vec<Vec<u32>>, Vec<usize>), ApiError> {
        let prompt = self.model.prompt_for(Some(input_type)).to_string();
        let mut ids = self
            .tokenized(texts, move |tok, texts| {
                tok.texts(texts, &prompt, truncate, side)
            })
            .await?;
        let keys = self.pylate_encode(&mut ids, Some(input_type));
        Ok((ids, keys))
    }

    /// A PyLate ColBERT's texts' ids as PyLate encodes a query (`input_type` "query") or a
    /// document (any other); other models' ids as they are. Returns each one's count of leading
    /// tokens that are attention keys where a query's expansion tokens are not attended to,
    /// else nothing (every token is a key).
    fn pylate_encode(&self, ids: &mut [Vec<u32>], input_type: Option<&str>) -> Vec<usize> {
        let Some(rules) = &self.tokenization.pylate else {
            return Vec::new();
        };
        let query = input_type == Some("query");
        let keys: Vec<usize> = ids.iter_mut().map(|i| rules.encode(i, query)).collect();
        match keys.iter().zip(ids.iter()).any(|(&k, i)| k < i.len()) {
            true => keys,
            false => Vec::new(),
        }
    }

    /// Documents' token vectors less those of a PyLate ColBERT's skip-list tokens (each token
    /// has one vector, in order).
    fn pylate_skip(&self, ids: &[Vec<u32>], vectors: &mut [TokenVectors]) {
        let Some(rules) = &self.tokenization.pylate else {
            return;
        };
        for (ids, v) in ids.iter().zip(vectors.iter_mut()) {
            if v.tokens().len() != ids.len() {
                continue;
            }
            let kept: Vec<f32> = ids
                .iter()
                .zip(v.tokens())
                .filter(|(&id, _)| rules.keeps(id))
                .flat_map(|(_, row)| row.iter().copied())
                .collect();
            v.rows = kept;
        }
    }

    /// A 400 naming the route that serves this model, when `route` needs a `task` model.
    fn require(&self, task: Task, route: &'static str) -> Result<(), ApiError> {
        let own = self.model.task;
        // A hybrid model answers the dense, sparse and multi-vector routes with that one output
        // (its dense vector through Embed, as the same model served as an embedder).
        let part =
            own == Task::Hybrid && matches!(task, Task::Embed | Task::Sparse | Task::MultiVector);
        if own == task || part {
            return Ok(());
        }
        let serves = match own {
            Task::Embed => "/v1/embeddings (and /v1/rerank, /v1/score by cosine)",
            Task::Score => "/v1/rerank or /v1/score",
            Task::Classify => "/v1/classify",
            Task::Sparse => "/v1/sparse_embeddings",
            Task::MultiVector => {
                "/v1/multi-vector or /embed_all (and /v1/rerank, /v1/score by MaxSim)"
            }
            Task::Hybrid => {
                "/v1/hybrid-embeddings, /v1/embeddings, /v1/sparse_embeddings or /v1/multi-vector \
                 (and /v1/rerank, /v1/score by cosine)"
            }
        };
        Err(ApiError::WrongTask {
            model: self.name,
            is: kind(own, Some(self.model.head)),
            route,
            needs: kind(task, None),
            serves,
        })
    }

    /// Relevance of each (query, document) pair: the reranker's own score, a multi-vector
    /// model's MaxSim, else the cosine of their embeddings (a hybrid model's dense ones, as the
    /// same model served as an embedder scores them); and the tokens the workers ran.
    async fn pair_scores(
        &self,
        pairs: &[(&str, &str)],
        how: &PairRequest,
        param: &'static str,
        ticket: &Ticket,
    ) -> Result<(Vec<f32>, usize), ApiError> {
        if !matches!(
            self.model.task,
            Task::Score | Task::Embed | Task::MultiVector | Task::Hybrid
        ) {
            self.require(Task::Score, "/v1/rerank and /v1/score")?;
        }
        match &how.instruction {
            Some(_) if self.model.head != Head::YesNo => {
                return Err(ApiError::InstructionNotTaken { model: self.name })
            }
            Some(i) if i.is_empty() => {
                return Err(ApiError::Empty {
                    param: "instruction",
                })
            }
            _ => {}
        }
        self.admit_ready()?;
        if self.model.task == Task::Score {
            return self.reranker_scores(pairs, how, param, ticket).await;
        }
        let (truncate, side) = (how.truncate, how.side);
        let (where_a, firsts) = distinct(pairs.iter().map(|p| p.0));
        let (where_b, seconds) = distinct(pairs.iter().map(|p| p.1));
        let (mut ids, mut keys) = self.text_ids(&firsts, "query", truncate, side).await?;
        let (documents, _) = self.text_ids(&seconds, "document", truncate, side).await?;
        if !keys.is_empty() {
            keys.extend(documents.iter().map(Vec::len));
        }
        ids.extend(documents);
        let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
        self.check_tokens(&lengths, param, ticket)?;
        let total: usize = lengths.iter().sum();
        if self.model.task == Task::MultiVector {
            let mut vectors = self.vectors_of(&ids, &lengths, &keys).await?;
            let documents = firsts.len();
            self.pylate_skip(&ids[documents..], &mut vectors[documents..]);
            let scores = pairs
                .iter()
                .map(|(a, b)| max_sim(&vectors[where_a[a]], &vectors[firsts.len() + where_b[b]]))
                .collect();
            return Ok((scores, total));
        }
        let rows = self.embed(&ids, 0, None).await?;
        let dims = rows.len() / ids.len();
        let row = |i: usize| &rows[i * dims..(i + 1) * dims];
        let scores = pairs
            .iter()
            .map(|(a, b)| cosine(row(where_a[a]), row(firsts.len() + where_b[b])))
            .collect();
        Ok((scores, total))
    }

    /// A reranker's scores of the pairs through the workers' Score RPC: a cross-encoder's pairs
    /// with their type ids, a yes/no reranker's in its judging frame.
    async fn reranker_scores(
        &self,
        pairs: &[(&str, &str)],
        how: &PairRequest,
        param: &'static str,
        ticket: &Ticket,
    ) -> Result<(Vec<f32>, usize), ApiError> {
        let (truncate, side) = (how.truncate, how.side);
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let chars: usize = pairs
            .iter()
            .map(|(a, b)| a.chars().count() + b.chars().count())
            .sum();
        let (ids, types) = if self.model.head == Head::YesNo {
            let task = how
                .instruction
                .clone()
                .unwrap_or(DEFAULT_INSTRUCTION.into());
            let chars = chars + task.chars().count() * pairs.len();
            let ids = self
                .on_tokenizer(chars, owned.as_slice(), move |tok, pairs| {
                    tok.judged_pairs(pairs, &task, truncate, side)
                })
                .await?;
            (ids, None)
        } else {
            let (ids, types) = self
                .on_tokenizer(chars, owned.as_slice(), move |tok, pairs| {
                    tok.pairs(pairs, truncate, side)
                })
                .await?;
            (ids, Some(types))
        };
        let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
        self.check_tokens(&lengths, param, ticket)?;
        let scores = self
            .fan_out(&lengths, |c, timeout| {
                let batch = match &types {
                    Some(types) => pack_pairs(&ids[c.start..c.stop], &types[c.start..c.stop]),
                    None => pack(&ids[c.start..c.stop]),
                };
                self.pool.score(batch, c.tokens, timeout)
            })
            .await?;
        Ok((scores.concat(), lengths.iter().sum()))
    }

    /// The documents best first (the first `top_n`), every document's score, and the tokens.
    pub async fn ranked(
        &self,
        req: &RerankRequest,
        ticket: &Ticket,
    ) -> Result<(Vec<usize>, Vec<f32>, usize), ApiError> {
        self.check_count(req.documents.len(), "documents")?;
        if req.query.is_empty() {
            return Err(ApiError::Empty { param: "query" });
        }
        empty_item(&req.documents, "documents")?;
        let pairs: Vec<(&str, &str)> = req
            .documents
            .iter()
            .map(|d| (req.query.as_str(), d.as_str()))
            .collect();
        let (scores, tokens) = self
            .pair_scores(&pairs, &req.pair, "documents", ticket)
            .await?;
        let mut order: Vec<usize> = (0..scores.len()).collect();
        // Best first; equal scores keep the documents' order (a stable sort).
        order.sort_by(|&x, &y| {
            scores[y]
                .partial_cmp(&scores[x])
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        if let Some(n) = req.top_n {
            order.truncate(n as usize);
        }
        Ok((order, scores, tokens))
    }

    pub async fn rerank(&self, req: RerankRequest, ticket: &Ticket) -> Result<Vec<u8>, ApiError> {
        let (order, scores, tokens) = self.ranked(&req, ticket).await?;
        let documents = req.return_documents.then_some(req.documents.as_slice());
        Ok(documents::rerank(
            self.name, &order, &scores, documents, tokens,
        ))
    }

    /// One score a pair of the request, and the tokens.
    pub async fn scored(
        &self,
        req: &ScoreRequest,
        ticket: &Ticket,
    ) -> Result<(Vec<f32>, usize), ApiError> {
        let ((one_1, text_1), (one_2, text_2)) = (&req.text_1, &req.text_2);
        let pairs: Vec<(&str, &str)> = match (one_1, one_2) {
            (true, _) => text_2
                .iter()
                .map(|b| (text_1[0].as_str(), b.as_str()))
                .collect(),
            (false, true) => text_1
                .iter()
                .map(|a| (a.as_str(), text_2[0].as_str()))
                .collect(),
            (false, false) if text_1.len() != text_2.len() => {
                return Err(ApiError::LengthsDiffer {
                    first: text_1.len(),
                    second: text_2.len(),
                })
            }
            (false, false) => text_1
                .iter()
                .zip(text_2)
                .map(|(a, b)| (a.as_str(), b.as_str()))
                .collect(),
        };
        self.check_count(pairs.len(), "text_2")?;
        if pairs.iter().any(|(a, b)| a.is_empty() || b.is_empty()) {
            return Err(ApiError::EmptyPairText {});
        }
        self.pair_scores(&pairs, &req.pair, "text_2", ticket).await
    }

    pub async fn score(&self, req: ScoreRequest, ticket: &Ticket) -> Result<Vec<u8>, ApiError> {
        let (scores, tokens) = self.scored(&req, ticket).await?;
        Ok(documents::scores(self.name, &scores, tokens))
    }

    /// Each input's score of every label (rows of the labels' count), and the tokens.
    pub async fn classified(
        &self,
        req: &ClassifyRequest,
        route: &'static str,
        ticket: &Ticket,
    ) -> Result<(Vec<f32>, usize), ApiError> {
        self.require(Task::Classify, route)?;
        let texts = &req.input;
        self.check_count(texts.len(), "input")?;
        empty_item(texts, "input")?;
        self.admit_ready()?;
        // The model's default prompt, as for embeddings without an input_type.
        let prompt = self.model.prompt_for(None).to_string();
        let (truncate, side) = (req.truncate, req.side);
        let ids = self
            .tokenized(texts, move |tok, texts| {
                tok.texts(texts, &prompt, truncate, side)
            })
            .await?;
        let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
        self.check_tokens(&lengths, "input", ticket)?;
        let activate = !req.raw_scores;
        let parts = self
            .fan_out(&lengths, |c, timeout| {
                let batch = pack(&ids[c.start..c.stop]);
                self.pool.classify(batch, activate, c.tokens, timeout)
            })
            .await?;
        let labels = &self.model.labels;
        if parts.iter().any(|(_, n)| *n != labels.len()) {
            // The gateway and its workers were given different models: a deployment error.
            return Err(broken_reply(
                "workers and gateway disagree on the label count",
            ));
        }
        let scores: Vec<f32> = parts.into_iter().flat_map(|(rows, _)| rows).collect();
        Ok((scores, lengths.iter().sum()))
    }

    pub async fn classify(
        &self,
        req: ClassifyRequest,
        ticket: &Ticket,
    ) -> Result<Vec<u8>, ApiError> {
        let (scores, total) = self.classified(&req, "/v1/classify", ticket).await?;
        let labels = &self.model.labels;
        Ok(documents::classifications(
            &scores, labels, req.top_k, self.name, total,
        ))
    }

    /// An input's token ids, their lengths and key lengths (`Service::pylate_encode`), for a
    /// route that needs a `task` model: checked, admitted when a worker is ready, tokenized with
    /// the prompt of its input type, and its tokens counted against the request's limits.
    #[allow(clippy::type_complexity)]
    async fn input_ids(
        &self,
        (task, route): (Task, &'static str),
        (input, input_type): (&Input, Option<&str>),
        how: (bool, Side),
        ticket: &Ticket,
    ) -> Result<(Vec<Vec<u32>>, Vec<usize>, Vec<usize>), ApiError> {
        self.require(task, route)?;
        self.check_count(input.len(), "input")?;
        self.admit_ready()?;
        let (ids, _, keys) = self.tokenize(input, input_type, how, false).await?;
        let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
        self.check_tokens(&lengths, "input", ticket)?;
        Ok((ids, lengths, keys))
    }

    /// Each input's (ascending vocabulary ids, weights), and the tokens.
    pub async fn sparse_rows(
        &self,
        req: &SparseRequest,
        route: &'static str,
        ticket: &Ticket,
    ) -> Result<(Vec<SparseRow>, usize), ApiError> {
        let how = (req.truncate, req.side);
        let input = (&req.input, req.input_type.as_deref());
        let (ids, lengths, _) = self
            .input_ids((Task::Sparse, route), input, how, ticket)
            .await?;
        let keep = (req.top_k.unwrap_or(0) as u32, req.threshold);
        let rows = if self.model.task == Task::Hybrid {
            let rows = self.hybrid_rows(&ids, &lengths, (false, true, false), keep);
            rows.await?.into_iter().filter_map(|r| r.sparse).collect()
        } else {
            let parts = self
                .fan_out(&lengths, |c, timeout| {
                    let batch = pack(&ids[c.start..c.stop]);
                    self.pool.sparse_embed(batch, keep, c.tokens, timeout)
                })
                .await?;
            parts.into_iter().flatten().collect()
        };
        Ok((rows, lengths.iter().sum()))
    }

    pub async fn sparse_embeddings(
        &self,
        req: SparseRequest,
        ticket: &Ticket,
    ) -> Result<Vec<u8>, ApiError> {
        let (rows, tokens) = self
            .sparse_rows(&req, "/v1/sparse_embeddings", ticket)
            .await?;
        Ok(documents::sparse(
            self.name,
            &rows,
            self.model.vocab_size,
            tokens,
        ))
    }

    /// Each input's token vectors, and the tokens.
    pub async fn token_vectors(
        &self,
        req: &MultiVectorRequest,
        route: &'static str,
        ticket: &Ticket,
    ) -> Result<(Vec<TokenVectors>, usize), ApiError> {
        let how = (req.truncate, req.side);
        let input = (&req.input, req.input_type.as_deref());
        let (ids, lengths, keys) = self
            .input_ids((Task::MultiVector, route), input, how, ticket)
            .await?;
        let mut vectors = self.vectors_of(&ids, &lengths, &keys).await?;
        if matches!(req.input, Input::Texts(_)) && req.input_type.as_deref() != Some("query") {
            self.pylate_skip(&ids, &mut vectors);
        }
        Ok((vectors, lengths.iter().sum()))
    }

    /// The token vectors of tokenized inputs, chunked over the workers; `keys`: their key
    /// lengths (empty: every token is a key; a hybrid model never has any).
    async fn vectors_of(
        &self,
        ids: &[Vec<u32>],
        lengths: &[usize],
        keys: &[usize],
    ) -> Result<Vec<TokenVectors>, ApiError> {
        if self.model.task == Task::Hybrid {
            let rows = self.hybrid_rows(ids, lengths, (false, false, true), (0, 0.0));
            return Ok(rows.await?.into_iter().filter_map(|r| r.vectors).collect());
        }
        let parts = self
            .fan_out(lengths, |c, timeout| {
                let keys = keys.get(c.start..c.stop).unwrap_or_default();
                let batch = pack_keyed(&ids[c.start..c.stop], keys);
                self.pool.multi_vector_embed(batch, c.tokens, timeout)
            })
            .await?;
        Ok(parts.into_iter().flatten().collect())
    }

    /// A hybrid model's outputs `wanted` (dense, sparse, token vectors) of tokenized inputs,
    /// chunked over the workers; `keep`: the lexical weights' top_k and threshold.
    async fn hybrid_rows(
        &self,
        ids: &[Vec<u32>],
        lengths: &[usize],
        wanted: (bool, bool, bool),
        keep: (u32, f32),
    ) -> Result<Vec<HybridRow>, ApiError> {
        let parts = self
            .fan_out(lengths, |c, timeout| {
                let batch = pack(&ids[c.start..c.stop]);
                self.pool
                    .hybrid_embed(batch, wanted, keep, c.tokens, timeout)
            })
            .await?;
        Ok(parts.into_iter().flatten().collect())
    }

    /// POST /v1/hybrid-embeddings: each input's outputs asked for, from one forward a chunk.
    pub async fn hybrid(&self, req: HybridRequest, ticket: &Ticket) -> Result<Vec<u8>, ApiError> {
        let how = (req.truncate, req.side);
        let input = (&req.input, req.input_type.as_deref());
        let route = "/v1/hybrid-embeddings";
        let (ids, lengths, _) = self
            .input_ids((Task::Hybrid, route), input, how, ticket)
            .await?;
        let o = req.outputs;
        let wanted = (o.dense, o.sparse, o.multi_vector);
        let keep = (req.top_k.unwrap_or(0) as u32, req.threshold);
        let rows = self.hybrid_rows(&ids, &lengths, wanted, keep).await?;
        let tokens = lengths.iter().sum();
        Ok(documents::hybrid(self.name, &rows, req.base64, tokens))
    }

    pub async fn multi_vector(
        &self,
        req: MultiVectorRequest,
        ticket: &Ticket,
    ) -> Result<Vec<u8>, ApiError> {
        let (inputs, tokens) = self.token_vectors(&req, "/v1/multi-vector", ticket).await?;
        Ok(documents::multi_vector(
            self.name, &inputs, req.base64, tokens,
        ))
    }

    /// The calibration ranges an int8/uint8 `encoding` needs (400 when there are none).
    pub fn ranges(
        &self,
        encoding: Encoding,
        dimensions: usize,
    ) -> Result<Option<&Ranges>, ApiError> {
        if !encoding.precision.needs_ranges() {
            return Ok(None);
        }
        let found = self
            .calibration
            .as_ref()
            .and_then(|c| c.ranges.get(&dimensions));
        if found.is_some() {
            return Ok(found);
        }
        let have: Vec<String> = self
            .calibration
            .iter()
            .flat_map(|c| c.ranges.keys().map(usize::to_string))
            .collect();
        let held = if have.is_empty() {
            "none".to_string()
        } else {
            format!("ranges for [{}]", have.join(", "))
        };
        Err(ApiError::NoCalibration {
            encoding: encoding.name(),
            precision: encoding.precision.name(),
            dimensions,
            held,
        })
    }

    /// This model's entry of /v1/models.
    pub fn model_entry(&self) -> String {
        documents::model_entry(self.name, self.created)
    }
}

/// What a model of each task is (with `head`: what this one is), for the 400 that sends a
/// request to the right route.
fn kind(task: Task, head: Option<Head>) -> &'static str {
    match (task, head) {
        (Task::Embed, _) => "an embedding model",
        (Task::Score, _) => "a cross-encoder reranker (it scores query-document pairs)",
        (Task::Classify, _) => "a sequence classifier",
        (Task::Sparse, Some(Head::Lexical)) => "a sparse (bge-m3 lexical weights) embedding model",
        (Task::Sparse, Some(_)) => "a sparse (SPLADE) embedding model",
        (Task::Sparse, None) => "a sparse (SPLADE or bge-m3 lexical weights) embedding model",
        (Task::MultiVector, _) => "a multi-vector (ColBERT) model",
        (Task::Hybrid, _) => "a hybrid (bge-m3 dense, sparse and multi-vector) model",
    }
}

/// Each distinct text once, in first-seen order, and where each text is in that list.
fn distinct<'a>(
    texts: impl Iterator<Item = &'a str>,
) -> (std::collections::HashMap<&'a str, usize>, Vec<String>) {
    let mut seen = std::collections::HashMap::new();
    let mut order = Vec::new();
    for text in texts {
        seen.entry(text).or_insert_with(|| {
            order.push(text.to_string());
            order.len() - 1
        });
    }
    (seen, order)
}

/// Late interaction (ColBERT's MaxSim): each query token's best dot product over the document's
/// tokens, summed over the query's tokens; 0 when either side has no vector.
pub fn max_sim(query: &TokenVectors, document: &TokenVectors) -> f32 {
    query
        .tokens()
        .map(|q| {
            document
                .tokens()
                .map(|d| q.iter().zip(d).map(|(x, y)| x * y).sum::<f32>())
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .filter(|best| best.is_finite())
        .sum()
}

/// Row-wise cosine in float32 (a dot product over the two norms, each summed in float32).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(1e-12)
}

/// 400 naming the first empty text of `texts`, the request's `param`.
fn empty_item(texts: &[String], param: &'static str) -> Result<(), ApiError> {
    match texts.iter().position(String::is_empty) {
        Some(index) => Err(ApiError::EmptyItem { param, index }),
        None => Ok(()),
    }
}

/// What admission reads of a model's workers.
impl Fleet for Pool {
    fn queued_elsewhere(&self) -> f64 {
        Pool::queued_elsewhere(self) as f64
    }

    fn capacity(&self) -> f64 {
        self.usable().1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vectors(rows: &[[f32; 2]]) -> TokenVectors {
        TokenVectors {
            rows: rows.iter().flatten().copied().collect(),
            dims: 2,
        }
    }

    #[test]
    fn max_sim_sums_each_query_tokens_best_match() {
        let query = vectors(&[[1.0, 0.0], [0.0, 1.0]]);
        let document = vectors(&[[0.6, 0.8], [1.0, 0.0], [-1.0, 0.0]]);
        // best of (0.6, 1.0, -1.0) plus best of (0.8, 0.0, 0.0)
        assert!((max_sim(&query, &document) - 1.8).abs() < 1e-6);
        // not symmetric: each of the document's tokens finds its best in the query
        assert!((max_sim(&document, &query) - (0.8 + 1.0 + 0.0)).abs() < 1e-6);
        assert_eq!(max_sim(&query, &vectors(&[])), 0.0);
        assert_eq!(max_sim(&vectors(&[]), &document), 0.0);
    }
}
