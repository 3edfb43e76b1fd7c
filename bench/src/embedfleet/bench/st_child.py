"""A sentence-transformers peer's own process: run by the python of the environment that has the
peer (our venv for the PyTorch backend, the OpenVINO peer's venv for OpenVINO), so it imports
nothing of embedfleet (only the standard library, numpy and sentence-transformers). Its own
process so that its memory is its own: the benchmark's process also holds the reference model.

`python st_child.py MODEL_DIR BATCH_SIZE BACKEND DEVICE DTYPE`: loads
`SentenceTransformer(MODEL_DIR, backend=BACKEND, device=DEVICE)` (for "openvino", optimum-intel
exports the PyTorch weights to an OpenVINO model on load; DTYPE, a torch dtype name, applies to
"torch"), writes b"ready\\n", then answers requests on stdin/stdout until stdin closes. A request
is a little-endian u32 byte count and that many bytes of a JSON array of texts; the answer is u32
rows, u32 columns and rows x columns little-endian float32 (the normalized embeddings), or u32 0,
u32 0 and a u32-prefixed UTF-8 error message. Library output goes to stderr.
"""

import json
import os
import struct
import sys


def main() -> None:
    model_dir, batch_size, backend, device, dtype = sys.argv[1:6]
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints from libraries go to stderr
    import numpy as np
    from sentence_transformers import SentenceTransformer

    if backend == "openvino":
        model = SentenceTransformer(model_dir, backend="openvino", device=device)
    else:
        import torch

        model_kwargs = {"torch_dtype": getattr(torch, dtype)}
        model = SentenceTransformer(model_dir, device=device, model_kwargs=model_kwargs)
    stdin = sys.stdin.buffer
    out.write(b"ready\n")
    while True:
        head = stdin.read(4)
        if len(head) < 4:
            return
        (size,) = struct.unpack("<I", head)
        texts = json.loads(stdin.read(size))
        try:
            rows = model.encode(texts, batch_size=int(batch_size), convert_to_numpy=True)
            rows = np.ascontiguousarray(rows, dtype="<f4")
            out.write(struct.pack("<II", rows.shape[0], rows.shape[1]) + rows.tobytes())
        except Exception as exc:  # the parent reports it as this peer's failure
            message = f"{type(exc).__name__}: {exc}".encode()
            out.write(struct.pack("<III", 0, 0, len(message)) + message)


if __name__ == "__main__":
    main()
