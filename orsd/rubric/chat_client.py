"""One HTTP exchange with an OpenAI-compatible chat-completions server, made robust.

429, 408, 5xx, timeouts, dropped connections and non-completion bodies are retried with
exponential backoff and jitter that honours `Retry-After`; other 4xx fail at once. At most
`concurrency` requests are in flight per event loop. The API key is read from the environment
variable named by `api_key_env` at each request and sent as a Bearer header; it is never stored,
logged, or put into an error message (a server that echoes it gets it redacted).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import math
import os
import random
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from orsd.rubric.accounting import Accounting

logger = logging.getLogger("orsd.rubric.openai_verifier")
_DETAIL_CHARS = 200


class VerifierRequestError(Exception):
    """A verifier request that ended without an answer; `reason` is a short stable code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class ChatReply:
    content: str | None
    top_logprobs: list[tuple[str, float]] | None  # first answer token's candidates, when asked


@dataclass
class _Failure:
    reason: str
    detail: str
    retryable: bool = True
    retry_after_seconds: float | None = None


@dataclass
class _LoopState:
    client: httpx.AsyncClient
    semaphore: asyncio.Semaphore
    users: int = 0


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _is_retryable_status(status: int) -> bool:
    return status in (408, 429) or status >= 500


class ChatClient:
    """POSTs chat completions to `url` with retries, a concurrency bound and Bearer auth."""

    def __init__(self, url: str, model: str, accounting: Accounting, api_key_env: str | None = None,
                 concurrency: int = 8, max_retries: int = 4, timeout: float = 60.0,
                 backoff_base_seconds: float = 0.5, backoff_max_seconds: float = 30.0,
                 max_retry_after_seconds: float = 60.0, seed: int = 0) -> None:
        """Size: the HTTP client's retry, timeout and concurrency options (the verifier section's keys) as
        keywords with defaults."""
        self.url = url
        self.model = model
        self.accounting = accounting
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.timeout = float(timeout)
        self.backoff_base_seconds = float(backoff_base_seconds)
        self.backoff_max_seconds = float(backoff_max_seconds)
        self.max_retry_after_seconds = float(max_retry_after_seconds)
        self._random = random.Random(seed)
        self._response_format_rejected = False
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary())

    def __repr__(self) -> str:
        return f"ChatClient(url={self.url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    async def complete(self, body: dict[str, Any], response_format: dict | None = None) -> ChatReply:
        """POST one chat completion (`body` without `model`), retrying transient failures.

        `response_format` is sent unless the server has been seen to reject it. Raises
        VerifierRequestError when the request ends without an answer.
        """
        body = {**body, "model": self.model}
        async with self.session() as state:
            attempt = 0
            fell_back = False
            while True:
                if attempt > 0:
                    self.accounting.add("retries")
                outcome = await self._attempt(state, body, response_format)
                if isinstance(outcome, ChatReply):
                    return outcome
                if outcome.reason == "response_format_rejected":
                    response_format, fell_back = None, True  # asked again at once, not a retry
                    continue
                if not outcome.retryable:
                    if fell_back:  # refused without response_format too: it was not the problem
                        self._response_format_rejected = False
                    logger.error("verifier request refused for good (%s): %s",
                                 outcome.reason, outcome.detail)
                    raise VerifierRequestError(outcome.reason, outcome.detail)
                if attempt >= self.max_retries:
                    raise VerifierRequestError(outcome.reason,
                                               f"{outcome.detail} (gave up after {attempt + 1} attempts)")
                delay = self.backoff_seconds(attempt, outcome.retry_after_seconds)
                logger.info("verifier request failed (%s); retry %d/%d in %.3f s",
                            outcome.reason, attempt + 1, self.max_retries, delay)
                await asyncio.sleep(delay)
                attempt += 1

    async def _attempt(self, state: _LoopState, body: dict[str, Any],
                       response_format: dict | None) -> ChatReply | _Failure:
        """One HTTP call holding one concurrency slot: the reply, or what went wrong."""
        async with state.semaphore:
            # decided at send time: another request may just have learnt the server rejects it
            sent_format = response_format is not None and not self._response_format_rejected
            if sent_format:
                body["response_format"] = response_format
            else:
                body.pop("response_format", None)
            self.accounting.add("http_attempts")
            try:
                async with asyncio.timeout(self.timeout):
                    response = await state.client.post(self.url, json=body, headers=self._headers())
            except (TimeoutError, httpx.TimeoutException):
                return _Failure("timeout", f"no complete answer within {self.timeout} s")
            except httpx.TransportError as error:
                return _Failure("connection", type(error).__name__)
        if response.status_code == 200:
            reply = self._read_reply(response, bool(body.get("logprobs")))
            return reply if isinstance(reply, ChatReply) else _Failure("bad_response", reply)
        if sent_format and response.status_code in (400, 422):
            # the server may not know response_format: stop sending it and ask again; if the
            # request is refused without it too, response_format was not the problem
            self.accounting.add("response_format_fallbacks")
            if not self._response_format_rejected:
                logger.warning("verifier server answered HTTP %d to a request with response_format; "
                               "no longer sending it", response.status_code)
            self._response_format_rejected = True
            return _Failure("response_format_rejected", "", retryable=False)
        failure = _Failure(f"http_{response.status_code}", self._redact(response.text[:_DETAIL_CHARS]),
                           retryable=_is_retryable_status(response.status_code),
                           retry_after_seconds=parse_retry_after(response.headers.get("retry-after")))
        return failure

    def _read_reply(self, response: httpx.Response, logprobs: bool) -> ChatReply | str:
        """The answer of a 200 response, or why the body is not a chat completion."""
        try:
            payload = response.json()
            message = payload["choices"][0]["message"]
            content = message.get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return f"not a chat completion: {self._redact(response.text[:80])!r}"
        if content is not None and not isinstance(content, str):
            return f"message content is {type(content).__name__}, expected a string"
        usage = payload.get("usage") or {}
        if isinstance(usage, dict):
            self.accounting.add("prompt_tokens", _as_int(usage.get("prompt_tokens")))
            self.accounting.add("completion_tokens", _as_int(usage.get("completion_tokens")))
        top = _first_token_logprobs(payload["choices"][0]) if logprobs else None
        return ChatReply(content, top)

    def backoff_seconds(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter in [0.5, 1] of the step, at least Retry-After (capped)."""
        step = min(self.backoff_max_seconds, self.backoff_base_seconds * (2 ** attempt))
        delay = step * (0.5 + 0.5 * self._random.random())
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_retry_after_seconds))
        return delay

    def _headers(self) -> dict[str, str]:
        if self.api_key_env is None:
            return {}
        key = os.environ.get(self.api_key_env)
        if not key:
            raise VerifierRequestError("api_key_missing", f"environment variable {self.api_key_env} is empty")
        return {"Authorization": f"Bearer {key}"}

    def _redact(self, text: str) -> str:
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return text.replace(key, "[redacted]") if key else text

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[_LoopState]:
        """The current event loop's client and semaphore, shared by every request in flight on it
        and closed when the last one ends (so no connection outlives its loop)."""
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            limits = httpx.Limits(max_connections=self.concurrency,
                                  max_keepalive_connections=self.concurrency)
            state = _LoopState(httpx.AsyncClient(timeout=httpx.Timeout(self.timeout), limits=limits),
                               asyncio.Semaphore(self.concurrency))
            self._loops[loop] = state
        state.users += 1
        try:
            yield state
        finally:
            state.users -= 1
            if state.users == 0:
                if self._loops.get(loop) is state:
                    del self._loops[loop]
                await state.client.aclose()

    async def aclose(self) -> None:
        """Close the current loop's client if no request is using it."""
        state = self._loops.get(asyncio.get_running_loop())
        if state is not None and state.users == 0:
            await state.client.aclose()


def _first_token_logprobs(choice: dict) -> list[tuple[str, float]] | None:
    """(token, logprob) candidates of the first generated token, chosen token first; None if absent."""
    try:
        first = choice["logprobs"]["content"][0]
    except (KeyError, IndexError, TypeError):
        return None
    out: list[tuple[str, float]] = []
    for entry in [first, *(first.get("top_logprobs") or [])]:
        if isinstance(entry, dict) and isinstance(entry.get("token"), str):
            logprob = entry.get("logprob")
            if isinstance(logprob, (int, float)) and not isinstance(logprob, bool):
                out.append((entry["token"], float(logprob)))
    return out or None


def _as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
