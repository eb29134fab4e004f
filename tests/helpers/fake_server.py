"""A scripted OpenAI-compatible chat-completions server on loopback, with fault injection.

For tests and the reliability benchmark: a real HTTP server (stdlib `ThreadingHTTPServer` in a
thread) whose answer to each request is decided by a `responder(request) -> Reply` callable. It
records every request (body, headers, arrival index, how often the same messages were seen) and the
largest number of requests it held at once.
"""

from __future__ import annotations

import json
import re
import select
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What the server does with one request; build with the class methods."""

    kind: str  # "ok" | "status" | "drop" | "garbage"
    content: str | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay_seconds: float = 0.0  # wait this long before answering (a hang when above the timeout)
    top_logprobs: list[tuple[str, float]] | None = None

    @classmethod
    def ok(cls, content: str | None, delay_seconds: float = 0.0,
           top_logprobs: list[tuple[str, float]] | None = None) -> "Reply":
        return cls("ok", content=content, delay_seconds=delay_seconds, top_logprobs=top_logprobs)

    @classmethod
    def error(cls, status: int, retry_after: str | None = None, body: str = '{"error": "injected"}',
              delay_seconds: float = 0.0) -> "Reply":
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        return cls("status", status=status, headers=headers, body=body.encode(), delay_seconds=delay_seconds)

    @classmethod
    def hang(cls, seconds: float, content: str | None = '{"scores": []}') -> "Reply":
        """Answer only after `seconds` (a timeout for any client with a shorter one)."""
        return cls("ok", content=content, delay_seconds=seconds)

    @classmethod
    def drop(cls, delay_seconds: float = 0.0) -> "Reply":
        """Close the connection without sending a byte."""
        return cls("drop", delay_seconds=delay_seconds)

    @classmethod
    def garbage(cls, body: bytes = b"<html><body>502 Bad Gateway</body></html>\x00\xff") -> "Reply":
        """HTTP 200 whose body is not a chat completion."""
        return cls("garbage", body=body)


@dataclass
class SeenRequest:
    index: int       # arrival order, from 0
    attempt: int     # how many earlier requests carried the same messages (0 = first time)
    path: str
    body: Any        # the decoded JSON body (None when it was not JSON)
    headers: dict[str, str]
    arrived: float = 0.0  # time.monotonic() at arrival

    @property
    def prompt(self) -> str:
        """All message contents joined (what a responder usually inspects)."""
        messages = self.body.get("messages", []) if isinstance(self.body, dict) else []
        return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


def scores_answer(scores: list) -> str:
    return json.dumps({"scores": scores})


def num_criteria_asked(request: SeenRequest) -> int:
    """K as stated by the built-in verification templates ("a rubric of K criteria")."""
    found = re.findall(r"rubric of (\d+) criteria", request.prompt)
    if not found:
        raise ValueError("request has no 'rubric of K criteria' phrase (custom template?)")
    return int(found[-1])


def num_attempts_asked(request: SeenRequest) -> int:
    """N as stated by the built-in per-group template ("Judge each of N attempts")."""
    found = re.findall(r"each of (\d+) attempts", request.prompt)
    return int(found[-1]) if found else 1


class FakeChatServer:
    """Serve `responder`'s replies on http://127.0.0.1:<port>/v1 until `close()`.

    Like a real server (vLLM aborts a request whose client went away), a request the client
    abandoned while the server was still delaying it stops counting as in flight: at every arrival
    the server checks the sockets of the requests it is holding for a closed client.
    """

    def __init__(self, responder: Callable[[SeenRequest], Reply]) -> None:
        self.responder = responder
        self.requests: list[SeenRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.abandoned = 0  # requests whose client closed the connection before the answer
        self._holding: dict[int, socket.socket] = {}
        self._gone: set[int] = set()
        self._lock = threading.Lock()
        self._seen: Counter[str] = Counter()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-chat-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "FakeChatServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _arrive(self, path: str, body: Any, headers: dict[str, str],
                connection: socket.socket) -> tuple[SeenRequest, Reply]:
        messages = body.get("messages") if isinstance(body, dict) else None
        fingerprint = json.dumps(messages, sort_keys=True)
        with self._lock:
            for index, held in list(self._holding.items()):
                if index not in self._gone and _client_gone(held):
                    self._mark_gone(index)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            request = SeenRequest(len(self.requests), self._seen[fingerprint], path, body, headers,
                                  time.monotonic())
            self._seen[fingerprint] += 1
            self.requests.append(request)
            self._holding[request.index] = connection
            try:
                reply = self.responder(request)
            except Exception as error:  # a broken script is a 500 the test will see, not a hang
                reply = Reply.error(500, body=json.dumps({"error": f"responder raised {error!r}"}))
        return request, reply

    def _mark_gone(self, index: int) -> None:
        self._gone.add(index)
        self.in_flight -= 1
        self.abandoned += 1

    def _check_gone(self, index: int) -> bool:
        with self._lock:
            if index not in self._gone and _client_gone(self._holding[index]):
                self._mark_gone(index)
            return index in self._gone

    def _leave(self, index: int) -> None:
        with self._lock:
            self._holding.pop(index, None)
            if index in self._gone:
                self._gone.discard(index)
            else:
                self.in_flight -= 1


def _client_gone(connection: socket.socket) -> bool:
    """True when the client closed its end (an HTTP/1.1 client sends nothing while it waits)."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # the default 5 drops bursts of connects (they return 1 s later)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client resetting an idle keep-alive connection is normal here; anything else is shown
        error = sys.exc_info()[1]
        if not isinstance(error, (ConnectionResetError, BrokenPipeError, socket.timeout)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10  # idle keep-alive connections end on their own

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_POST(self) -> None:
        fake: FakeChatServer = self.server.fake  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        request, reply = fake._arrive(self.path, body, dict(self.headers.items()), self.connection)
        try:
            deadline = time.monotonic() + reply.delay_seconds
            while time.monotonic() < deadline:
                if fake._check_gone(request.index):
                    self.close_connection = True  # the client gave up (timeout); nothing to answer
                    return
                time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
            self._send(reply, request)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            self.close_connection = True
        finally:
            fake._leave(request.index)

    def _send(self, reply: Reply, request: SeenRequest) -> None:
        if reply.kind == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if reply.kind == "ok":
            data = json.dumps(_completion(reply, request)).encode()
            status, headers = 200, {"Content-Type": "application/json"}
        elif reply.kind == "garbage":
            data, status, headers = reply.body, 200, {"Content-Type": "application/json"}
        else:
            headers = {"Content-Type": "application/json", **reply.headers}
            data, status = reply.body, reply.status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _completion(reply: Reply, request: SeenRequest) -> dict:
    content = reply.content
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content},
                              "finish_reason": "stop"}
    if reply.top_logprobs:
        token, logprob = reply.top_logprobs[0]
        choice["logprobs"] = {"content": [{
            "token": token, "logprob": logprob,
            "top_logprobs": [{"token": t, "logprob": lp} for t, lp in reply.top_logprobs]}]}
    model = request.body.get("model", "fake") if isinstance(request.body, dict) else "fake"
    prompt_tokens = len(request.prompt) // 4
    completion_tokens = len(content or "") // 4
    return {"id": f"fake-{request.index}", "object": "chat.completion", "model": model,
            "choices": [choice], "usage": {"prompt_tokens": prompt_tokens,
                                           "completion_tokens": completion_tokens,
                                           "total_tokens": prompt_tokens + completion_tokens}}
