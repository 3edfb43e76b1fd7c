//! The routes of the contract: each path, the API whose shapes it speaks, and which of them
//! need the API key. A path is found by one `match` (a comparison of its bytes against each
//! arm's), so the TEI and Cohere routes cost the OpenAI ones nothing measurable.

/// Whose request and response shapes a POST route speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    OpenAi,
    /// text-embeddings-inference's (api::tei)
    Tei,
    /// Cohere's v2 (api::cohere)
    Cohere,
}

/// The route label of a path: itself when it is a route, else "other" (few series).
pub fn route_of(path: &str) -> &'static str {
    match path {
        "/v1/embeddings" => "/v1/embeddings",
        "/v1/rerank" => "/v1/rerank",
        "/v1/score" => "/v1/score",
        "/v1/classify" => "/v1/classify",
        "/v1/sparse_embeddings" => "/v1/sparse_embeddings",
        "/v1/multi-vector" => "/v1/multi-vector",
        "/v1/hybrid-embeddings" => "/v1/hybrid-embeddings",
        "/health" => "/health",
        "/ready" => "/ready",
        "/metrics" => "/metrics",
        "/openapi.json" => "/openapi.json",
        "/v1/models" => "/v1/models",
        "/" => "/",
        "/embed" => "/embed",
        "/embed_sparse" => "/embed_sparse",
        "/embed_all" => "/embed_all",
        "/rerank" => "/rerank",
        "/predict" => "/predict",
        "/similarity" => "/similarity",
        "/tokenize" => "/tokenize",
        "/decode" => "/decode",
        "/info" => "/info",
        "/v2/embed" => "/v2/embed",
        "/v2/rerank" => "/v2/rerank",
        _ => "other",
    }
}

/// The API of a POST route; None for the GET routes and "other".
pub fn post_api(route: &str) -> Option<Api> {
    match route {
        "/v1/embeddings"
        | "/v1/rerank"
        | "/v1/score"
        | "/v1/classify"
        | "/v1/sparse_embeddings"
        | "/v1/multi-vector"
        | "/v1/hybrid-embeddings" => Some(Api::OpenAi),
        "/" | "/embed" | "/embed_sparse" | "/embed_all" | "/rerank" | "/predict"
        | "/similarity" | "/tokenize" | "/decode" => Some(Api::Tei),
        "/v2/embed" | "/v2/rerank" => Some(Api::Cohere),
        _ => None,
    }
}

/// Whether a path needs the API key (when the gateway has keys): every /v1/ and /v2/ path,
/// known or not (an unknown one tells nothing without a key), and TEI's routes, as TEI keys
/// them. Probes, metrics and the document stay open.
pub fn keyed(path: &str) -> bool {
    path.starts_with("/v1/")
        || path.starts_with("/v2/")
        || path == "/info"
        || post_api(path) == Some(Api::Tei)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route_of("/v1/embeddings"), "/v1/embeddings");
        assert_eq!(route_of("/v1/embeddings/"), "other");
        assert_eq!(route_of("/ready"), "/ready");
        assert_eq!(post_api(route_of("/embed")), Some(Api::Tei));
        assert_eq!(post_api(route_of("/v2/rerank")), Some(Api::Cohere));
        assert_eq!(post_api(route_of("/v1/multi-vector")), Some(Api::OpenAi));
        assert_eq!(
            post_api(route_of("/v1/hybrid-embeddings")),
            Some(Api::OpenAi)
        );
        assert_eq!(post_api(route_of("/embed_all")), Some(Api::Tei));
        assert_eq!(post_api("/info"), None);
        assert!(keyed("/v1/nothing") && keyed("/v2/embed") && keyed("/") && keyed("/info"));
        assert!(!keyed("/health") && !keyed("/metrics") && !keyed("/openapi.json"));
    }
}
