"""A verifier behind any OpenAI-compatible `/v1/chat/completions` endpoint (hosted API, `vllm serve`).

Hardened against what kills LLM-judge runs: 429s, 5xx, timeouts and dropped connections are
retried with exponential backoff and jitter that honours `Retry-After`; a malformed answer gets
one corrective re-ask; whatever still fails leaves NaN cells with a recorded reason, never an
exception. The API key is read from the environment variable named by `api_key_env` at each
request and sent as a Bearer header; it is never stored on the object, logged, cached or put into
an error message.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from orsd.rubric.accounting import Accounting
from orsd.rubric.answers import (LOGPROBS_MISSING, MALFORMED_JSON, ParsedScores, Problem,
                                 parse_group_answer, parse_score_answer, yes_probability)
from orsd.rubric.bundle import RubricBundle
from orsd.rubric.cache import ResponseCache, cache_key
from orsd.rubric.chat_client import ChatClient, ChatReply, VerifierRequestError, parse_retry_after
from orsd.rubric.prompts import (PromptTemplates, answer_json_schema, reask_messages,
                                 verification_messages, yes_no_messages)
from orsd.rubric.verifier import (VerifierBase, VerifierResult, check_mode, check_score_inputs,
                                  events_from)

__all__ = ["OpenAIVerifier", "VerifierRequestError", "parse_retry_after"]
RESPONSE_FORMATS = ("json_object", "json_schema", None)


class OpenAIVerifier(VerifierBase):
    """Scores bundles through an OpenAI-compatible chat-completions server (see module docstring).

    `concurrency` bounds the HTTP requests in flight per event loop; `max_retries` the extra
    attempts of one request; `timeout` is the total seconds of one attempt. `scoring="yes_prob"`
    reads P(yes)/(P(yes)+P(no)) from the first answer token's `top_logprobs` (vLLM returns them).
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None = None, concurrency: int = 8,
                 max_retries: int = 4, timeout: float = 60.0, cache_dir: str | os.PathLike | None = None,
                 mode: str = "per_trajectory", scoring: str = "json", temperature: float = 0.0,
                 max_tokens: int = 1536, response_format: str | None = "json_object",
                 top_logprobs: int = 20, backoff_base_seconds: float = 0.5,
                 backoff_max_seconds: float = 30.0, max_retry_after_seconds: float = 60.0,
                 templates: PromptTemplates | None = None, extra_body: dict | None = None,
                 seed: int = 0) -> None:
        """Size: the verifier section's HTTP, retry and scoring keys as keywords with defaults, so a user
        builds one without a run config."""
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url={base_url!r}: expected an http(s) URL such as http://host:8000/v1")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model={model!r}: expected the served model's name")
        if api_key_env is not None:
            if not isinstance(api_key_env, str) or not api_key_env:
                raise ValueError(f"api_key_env={api_key_env!r}: expected the NAME of an environment variable")
            if not os.environ.get(api_key_env):
                raise ValueError(f"api_key_env={api_key_env!r}: that environment variable is not set")
        _positive_int(concurrency, "concurrency")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries={max_retries!r}: expected an int >= 0")
        for name, value in (("timeout", timeout), ("backoff_base_seconds", backoff_base_seconds),
                            ("backoff_max_seconds", backoff_max_seconds),
                            ("max_retry_after_seconds", max_retry_after_seconds)):
            if not isinstance(value, (int, float)) or not value >= 0 or (name == "timeout" and value == 0):
                raise ValueError(f"{name}={value!r}: expected a non-negative number of seconds")
        check_mode(mode, scoring)
        _positive_int(max_tokens, "max_tokens")
        _positive_int(top_logprobs, "top_logprobs")
        if response_format not in RESPONSE_FORMATS:
            raise ValueError(f"response_format={response_format!r}: expected one of {RESPONSE_FORMATS}")
        if templates is not None and not isinstance(templates, PromptTemplates):
            raise TypeError(f"templates={templates!r}: expected PromptTemplates or None")
        self.base_url = base_url.rstrip("/")
        url = self.base_url
        if not url.endswith("/chat/completions"):
            url += "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.mode = mode
        self.scoring = scoring
        self.temperature = float(temperature)
        self.max_tokens = max_tokens
        self.response_format = response_format
        self.top_logprobs = top_logprobs
        self.templates = templates or PromptTemplates()
        self.extra_body = dict(extra_body or {})
        self.cache = ResponseCache(cache_dir) if cache_dir is not None else None
        self.accounting = Accounting()
        self.client = ChatClient(url, model, self.accounting, api_key_env=api_key_env,
                                 concurrency=concurrency, max_retries=max_retries, timeout=timeout,
                                 backoff_base_seconds=backoff_base_seconds,
                                 backoff_max_seconds=backoff_max_seconds,
                                 max_retry_after_seconds=max_retry_after_seconds, seed=seed)

    def __repr__(self) -> str:
        return (f"OpenAIVerifier(base_url={self.base_url!r}, model={self.model!r}, "
                f"api_key_env={self.api_key_env!r}, mode={self.mode!r}, scoring={self.scoring!r}, "
                f"concurrency={self.client.concurrency}, max_retries={self.client.max_retries}, "
                f"timeout={self.client.timeout})")

    # -- the protocol ---------------------------------------------------------------------------
    async def ascore_with_events(self, task: str, transcripts: Sequence[str], bundle: RubricBundle,
                                 bundle_index: int | None = None) -> VerifierResult:
        """Scores [N, K] plus the events explaining each NaN (also kept for `drain_events`)."""
        check_score_inputs(task, transcripts, [bundle])
        n, k = len(transcripts), len(bundle)
        if self.scoring == "yes_prob":
            cells = await asyncio.gather(*(self._yes_prob_cell(task, transcripts[i], bundle, i, c)
                                           for i in range(n) for c in range(k)))
            scores = np.array([value for value, _ in cells], dtype=np.float64).reshape(n, k)
            parsed = ParsedScores(scores, [p for _, p in cells if p is not None])
            return self._finish(scores, events_from(parsed, bundle_index), 0)
        if self.mode == "per_trajectory":
            rows = await asyncio.gather(*(
                self._json_request(verification_messages(task, transcripts[i], bundle, "per_trajectory",
                                                         self.templates.verification_trajectory),
                                   lambda text, i=i: parse_score_answer(text, k, trajectory=i), k)
                for i in range(n)))
            scores = np.stack([row.scores for row in rows]).reshape(n, k)
            problems = [p for row in rows for p in row.problems]
            clamped = sum(row.clamped for row in rows)
        else:
            group = await self._json_request(
                verification_messages(task, list(transcripts), bundle, "per_group",
                                      self.templates.verification_group),
                lambda text: parse_group_answer(text, n, k), k, num_trajectories=n)
            scores, problems, clamped = group.scores, group.problems, group.clamped
        return self._finish(scores, events_from(ParsedScores(scores, problems), bundle_index), clamped)

    async def aclose(self) -> None:
        """Kept for symmetry: HTTP clients close by themselves when their last request ends."""
        await self.client.aclose()

    async def __aenter__(self) -> "OpenAIVerifier":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- one logical request ----------------------------------------------------------------------
    async def _json_request(self, messages: list[dict], parse: Callable[[str], ParsedScores],
                            num_criteria: int, num_trajectories: int = 1) -> ParsedScores:
        """Ask, re-ask once if the answer is malformed, cache what was readable."""
        self.accounting.add("requests")
        key = self._cache_key(messages)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None and isinstance(hit.get("content"), str):
                parsed = parse(hit["content"])
                if parsed.malformed is None:
                    self.accounting.add("cache_hits")
                    self.accounting.add("succeeded")
                    return parsed
        started = time.monotonic()
        schema = answer_json_schema(self.mode, num_criteria, num_trajectories)
        try:
            reply = await self._ask(messages, schema)
            content = reply.content or ""
            parsed = parse(content)
            if parsed.malformed is not None:
                self.accounting.add("reasks")
                retry_messages = reask_messages(messages, content, parsed.malformed, self.mode,
                                                num_criteria, self.templates.reask)
                content = (await self._ask(retry_messages, schema)).content or ""
                parsed = parse(content)
        except VerifierRequestError as error:
            self.accounting.request_failed(error.reason)
            failed = parse("")  # all NaN, right shape
            trajectory = failed.problems[0].trajectory if failed.problems else None
            failed.problems = [Problem(trajectory, None, error.reason, error.detail)]
            return failed
        finally:
            self.accounting.latency(time.monotonic() - started)
        if parsed.malformed is not None:
            self.accounting.request_failed(MALFORMED_JSON)
            for problem in parsed.problems:
                problem.detail = f"after one corrective re-ask: {problem.detail}"
            return parsed
        self.accounting.add("succeeded")
        if self.cache is not None:
            self.cache.put(key, {"content": content})
        return parsed

    async def _yes_prob_cell(self, task: str, transcript: str, bundle: RubricBundle, trajectory: int,
                             criterion: int) -> tuple[float, Problem | None]:
        messages = yes_no_messages(task, transcript, bundle.criteria[criterion], self.templates.yes_no)
        self.accounting.add("requests")
        key = self._cache_key(messages)
        top = None
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None and isinstance(hit.get("top_logprobs"), list):
                top = [(str(t), float(lp)) for t, lp in hit["top_logprobs"]]
                self.accounting.add("cache_hits")
        if top is None:
            started = time.monotonic()
            try:
                top = (await self.client.complete({
                    **self.extra_body, "messages": messages, "temperature": self.temperature,
                    "max_tokens": 1, "logprobs": True, "top_logprobs": self.top_logprobs})).top_logprobs
            except VerifierRequestError as error:
                self.accounting.request_failed(error.reason)
                return math.nan, Problem(trajectory, criterion, error.reason, error.detail)
            finally:
                self.accounting.latency(time.monotonic() - started)
            if top is None:
                self.accounting.request_failed(LOGPROBS_MISSING)
                return math.nan, Problem(trajectory, criterion, LOGPROBS_MISSING,
                                         "the server returned no top_logprobs for the first answer token")
            if self.cache is not None:
                self.cache.put(key, {"top_logprobs": [[t, lp] for t, lp in top]})
        value, why = yes_probability(top)
        if why is not None:
            self.accounting.request_failed(why.split(":")[0])
            return math.nan, Problem(trajectory, criterion, why.split(":")[0], why)
        self.accounting.add("succeeded")
        return value, None

    async def _ask(self, messages: list[dict], schema: dict) -> ChatReply:
        """One JSON-answer completion through the retrying client."""
        response_format = None
        if self.response_format == "json_object":
            response_format = {"type": "json_object"}
        elif self.response_format == "json_schema":
            response_format = {"type": "json_schema",
                               "json_schema": {"name": "rubric_scores", "schema": schema}}
        body = {**self.extra_body, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens}
        return await self.client.complete(body, response_format)

    def _cache_key(self, messages: list[dict]) -> str:
        params: dict[str, Any] = {"temperature": self.temperature, "scoring": self.scoring,
                                  "extra_body": self.extra_body}
        if self.scoring == "yes_prob":
            params["top_logprobs"] = self.top_logprobs
        else:
            params["max_tokens"] = self.max_tokens
        return cache_key(self.model, messages, params)


def _positive_int(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r}: expected a positive int")
