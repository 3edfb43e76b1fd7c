"""A plain `transformers` embeddings server: the network-fair peer of the device check.

What a user writes when they serve a model with nothing but `transformers`: the standard library's
threaded HTTP server, the model's tokenizer (padding to the longest text of a request), AutoModel
in the given dtype, the model's pooling (mean, or the last real token) and L2 normalization, one
request at a time (a lock: no batching across requests). It pays HTTP and JSON as our gateway
does, which sentence-transformers called in its own process does not.

    python gpu_hf_server.py MODEL_DIR PORT DEVICE DTYPE POOLING

POST /v1/embeddings {"input": [...]} answers OpenAI's shape; GET /health answers 200 once the
model is loaded. Imports nothing of embedfleet (run by any python with transformers).
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    model_dir, port, device, dtype, pooling = sys.argv[1:6]
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, torch_dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    lock = threading.Lock()

    def embed(texts: list[str]) -> list[list[float]]:
        enc = tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
        enc = {k: v.to(device) for k, v in enc.items()}
        with lock, torch.inference_mode():
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"]
            if pooling == "lasttoken":
                last = mask.sum(dim=1) - 1  # right padding: the last real token
                pooled = hidden[torch.arange(hidden.shape[0], device=device), last]
            else:
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(1) / weights.sum(1)
            rows = torch.nn.functional.normalize(pooled.float(), dim=-1)
            out: list[list[float]] = rows.cpu().tolist()
            return out

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as every client of the benchmark expects

        def _send(self, status: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(200 if self.path == "/health" else 404, {})

        def do_POST(self) -> None:
            size = int(self.headers.get("content-length", "0"))
            try:
                texts = json.loads(self.rfile.read(size))["input"]
                rows = embed([texts] if isinstance(texts, str) else texts)
            except Exception as exc:  # the benchmark reports it as this peer's error
                self._send(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
                return
            data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
            self._send(200, {"object": "list", "data": data})

        def log_message(self, format: str, *args: object) -> None:
            return  # one line per request would cost more than the request

    server = ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
