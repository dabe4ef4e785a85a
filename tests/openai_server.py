"""A real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions protocol with scripted replies.

Tests import it as ``openai_server`` (pytest puts tests/ on the path; tests/ is not a package). Each scripted item is a
reply text, a dict ``{"status": 429, "headers": {...}}`` (an error response), a raw reply
``{"status": 200, "body": "<html>…", "content_type": "text/html"}`` or ``{"status": 200, "json": {...}}``
(what misbehaving gateways send; ``"trickle_s": 0.05`` sends its body 16 bytes at a time, one piece every
0.05 s), or a callable ``request -> text``; when the script is empty the
``default`` callable answers (or a 500).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedOpenAI:
    def __init__(self, script=(), default=None):
        self.script = list(script)
        self.default = default
        self.requests: list[dict] = []
        self.auth: list[str] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with outer.lock:
                    outer.requests.append(body)
                    outer.auth.append(self.headers.get("Authorization", ""))
                    item = outer.script.pop(0) if outer.script else outer.default
                if not self.path.endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": "not found"}})
                if item is None:
                    return self._send(
                        500, {"error": {"message": "script exhausted", "type": "server_error"}}
                    )
                if isinstance(item, dict) and ("body" in item or "json" in item):
                    # a raw reply: any status, any body (HTML from a proxy, a JSON error object)
                    data = item.get("body")
                    if data is None:
                        data = json.dumps(item["json"])
                    return self._send_raw(
                        item.get("status", 200),
                        data.encode() if isinstance(data, str) else data,
                        item.get("content_type", "application/json"),
                        item.get("headers", {}),
                        item.get("trickle_s", 0.0),
                    )
                if isinstance(item, dict):
                    return self._send(
                        item.get("status", 500),
                        {"error": {"message": item.get("message", "scripted error")}},
                        item.get("headers", {}),
                    )
                text = item(body) if callable(item) else item
                prompt = sum(len(m.get("content", "").split()) for m in body.get("messages", []))
                completion = len(text.split())
                return self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(outer.requests)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "test"),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": prompt,
                            "completion_tokens": completion,
                            "total_tokens": prompt + completion,
                        },
                    },
                )

            def _send(self, status, payload, headers=None):
                return self._send_raw(
                    status, json.dumps(payload).encode(), "application/json", headers
                )

            def _send_raw(self, status, data, content_type, headers=None, trickle_s=0.0):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, str(v))
                self.end_headers()
                if not trickle_s:
                    return self.wfile.write(data)
                # a server that keeps sending: 16 bytes every trickle_s seconds
                try:
                    for i in range(0, len(data), 16):
                        self.wfile.write(data[i : i + 16])
                        self.wfile.flush()
                        time.sleep(trickle_s)
                except OSError:  # the client gave up and closed the connection
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.thread.join(timeout=5)
        self.httpd.server_close()


def proposal_reply(
    name: str, code: str, *, hyperparameters=None, intents=("correct_above_wrong",), gain=0.6
) -> str:
    return json.dumps(
        {
            "proposals": [
                {
                    "name": name,
                    "motivation": "test motivation",
                    "mechanism": f"{name}: a scripted mechanism",
                    "expected_effect": "scripted",
                    "hyperparameters": hyperparameters or {},
                    "code": code,
                    "intents": list(intents),
                    "expected_gain": gain,
                }
            ]
        }
    )


def revise_reply(code: str) -> str:
    return json.dumps({"code": code, "explanation": "scripted fix"})
