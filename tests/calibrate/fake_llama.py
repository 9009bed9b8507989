"""A minimal stand-in for llama-server's /props and streaming /completion (one slot).

Token events carry cumulative ``predicted_ms`` (2.5 ms per token; with ``gap_cv``, each
step 2.5 ms times a seeded lognormal factor of mean 1 and that CV) when the request asks
for ``timings_per_token``.  The slot keeps prompt + generated tokens except the last (the last sampled token is
never evaluated), and reuses the longest common prefix with the next prompt — the
behaviour of docs/reference/engines.md §3.4 for a single slot.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

import numpy as np


class FakeLlama:
    def __init__(self, slot_tokens: int = 200, fail_500_on_turn: int | None = None,
                 gap_cv: float = 0.0) -> None:
        self.slot_tokens = slot_tokens
        sigma = float(np.sqrt(np.log1p(gap_cv**2)))
        self.gap_rng = np.random.default_rng(1234)
        self.gap_ms = lambda n: 2.5 * self.gap_rng.lognormal(-sigma**2 / 2, sigma, n)
        self.cache: list[int] = []
        self.prompts: list[list[int]] = []
        self.bodies: list[dict] = []
        self.fail_500_on = fail_500_on_turn
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, code: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/props":
                    self._json(200, {"default_generation_settings": {"n_ctx": owner.slot_tokens},
                                     "total_slots": 1})
                else:
                    self._json(404, {"error": {"code": 404, "message": "File Not Found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.handle(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def handle(self, h: BaseHTTPRequestHandler, body: dict) -> None:
        prompt = body["prompt"]
        with self.lock:
            self.bodies.append(body)
            idx = len(self.prompts)
            self.prompts.append(prompt)
            if len(prompt) > self.slot_tokens:
                h._json(400, {"error": {"code": 400, "type": "exceed_context_size_error",
                                        "message": "request exceeds the available context"}})
                return
            if idx == self.fail_500_on:
                h._json(500, {"error": {"code": 500, "type": "server_error",
                                        "message": "Context size has been exceeded."}})
                return
            lcp = 0
            for a, b in zip(self.cache, prompt):
                if a != b:
                    break
                lcp += 1
            lcp = min(lcp, len(prompt) - 1)  # at least one prompt token is evaluated
            n = body["n_predict"]
            out = [1000 + 7 * idx + i for i in range(n)]
            self.cache = prompt + out[:-1]
            server_ms = np.concatenate([[0.0], np.cumsum(self.gap_ms(n - 1))]).tolist()
        timings = {"cache_n": lcp, "prompt_n": len(prompt) - lcp, "prompt_ms": 1.0 + len(prompt),
                   "predicted_n": n, "predicted_ms": 2.0 * n}
        if not body.get("stream"):
            h._json(200, {"content": "", "tokens_predicted": n, "timings": timings})
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for i, tok in enumerate(out):
            event = {"tokens": [tok], "content": " x", "stop": False}
            if body.get("timings_per_token"):
                event["timings"] = {"predicted_n": i + 1, "predicted_ms": server_ms[i]}
            h.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            h.wfile.flush()
        final = {"stop": True, "tokens": [], "content": "", "tokens_predicted": n,
                 "truncated": False,
                 "timings": timings}
        h.wfile.write(f"data: {json.dumps(final)}\n\n".encode())
        h.wfile.flush()
        h.close_connection = True

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
