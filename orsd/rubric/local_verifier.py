"""A frozen transformers model in process as the verifier (offline runs, no server).

`scoring="yes_prob"` (default): each criterion is a yes/no question about one transcript, scored
P(yes) / (P(yes) + P(no)) from the next-token distribution after the chat template's generation
prompt — one forward, no sampling, always finite. The prompts of all criteria of a trajectory
(across every bundle of `ascore_many`) share their start (instructions, task, transcript), so that
prefix runs once and its KV cache serves all criteria, whose suffixes run batched.

`scoring="json"` generates the JSON answer greedily, parsed like the HTTP verifier's, with one
corrective re-ask; a small model's nonsense becomes recorded failures, never an exception.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from orsd.rubric.accounting import Accounting, VerifierEvent
from orsd.rubric.answers import MALFORMED_JSON, ParsedScores, Problem, parse_group_answer, parse_score_answer
from orsd.rubric.bundle import RubricBundle
from orsd.rubric.prompts import PromptTemplates, reask_messages, verification_messages, yes_no_messages
from orsd.rubric.verifier import VerifierBase, VerifierResult, check_mode, check_score_inputs, events_from

#: words whose first token counts as "yes" / "no", each also tried with a leading space
YES_WORDS = ("yes", "Yes", "YES")
NO_WORDS = ("no", "No", "NO")
PROMPT_TOO_LONG = "prompt_too_long"


def answer_token_ids(tokenizer: Any, yes_words: Sequence[str] = YES_WORDS,
                     no_words: Sequence[str] = NO_WORDS) -> tuple[list[int], list[int]]:
    """Token ids that start a "yes" and a "no" answer.

    For every word w and its variant " w", the first token of its encoding counts when that token,
    decoded, stripped and lowercased, is a non-empty prefix of the lowercased word ("y", "yes").
    The two sets must be non-empty and disjoint.
    """
    def ids_for(words: Sequence[str]) -> list[int]:
        found: list[int] = []
        for word in words:
            for variant in (word, " " + word):
                ids = tokenizer.encode(variant, add_special_tokens=False)
                if not ids:
                    continue
                piece = tokenizer.decode([ids[0]]).strip().lower()
                if piece and word.lower().startswith(piece) and ids[0] not in found:
                    found.append(int(ids[0]))
        return found

    yes_ids, no_ids = ids_for(yes_words), ids_for(no_words)
    if not yes_ids or not no_ids:
        raise ValueError(f"tokenizer: no token starts {list(yes_words) if not yes_ids else list(no_words)}; "
                         "pass yes_words/no_words the tokenizer can encode")
    if set(yes_ids) & set(no_ids):
        raise ValueError(f"yes ids {yes_ids} and no ids {no_ids} overlap; pass other yes_words/no_words")
    return yes_ids, no_ids


class LocalVerifier(VerifierBase):
    """Scores bundles with an in-process causal LM kept frozen (eval mode, inference_mode)."""

    def __init__(self, model: Any, tokenizer: Any, mode: str = "per_trajectory", scoring: str = "yes_prob",
                 max_new_tokens: int = 256, batch_size: int = 8, templates: PromptTemplates | None = None,
                 chat_template_kwargs: dict | None = None, yes_words: Sequence[str] = YES_WORDS,
                 no_words: Sequence[str] = NO_WORDS, max_prompt_tokens: int | None = None,
                 autocast_dtype: Any = None) -> None:
        """Size: the local verifier's options (the verifier section's keys) as keywords with defaults, so tests
        and orsd-probe build one without a config."""
        check_mode(mode, scoring)
        for name, value in (("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r}: expected a positive int")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("tokenizer has no chat_template; set one (verifier prompts are chat messages)")
        if templates is not None and not isinstance(templates, PromptTemplates):
            raise TypeError(f"templates={templates!r}: expected PromptTemplates or None")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.mode = mode
        self.scoring = scoring
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.templates = templates or PromptTemplates()
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.yes_ids, self.no_ids = answer_token_ids(tokenizer, yes_words, no_words)
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.max_prompt_tokens = max_prompt_tokens or positions
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("tokenizer has neither pad_token_id nor eos_token_id; set one")
        self.pad_id = int(pad)
        self.accounting = Accounting()
        self._lock = threading.Lock()  # one forward at a time: the CPU has no cores to spare
        # autocast is per thread and the forwards run on a worker thread, so the caller's autocast
        # never reaches them: the dtype is entered here (a model whose matmul weights are stored in
        # it, orsd.train.model.frozen_copy, runs only under it)
        self.autocast_dtype = autocast_dtype

    def __repr__(self) -> str:
        name = getattr(getattr(self.model, "config", None), "_name_or_path", type(self.model).__name__)
        return f"LocalVerifier(model={name!r}, mode={self.mode!r}, scoring={self.scoring!r})"

    async def ascore_with_events(self, task: str, transcripts: Sequence[str], bundle: RubricBundle,
                                 bundle_index: int | None = None) -> VerifierResult:
        """Scores [N, K] plus the events explaining each NaN (also kept for `drain_events`)."""
        check_score_inputs(task, transcripts, [bundle])
        results = await asyncio.to_thread(self._score_bundles, task, list(transcripts), [bundle],
                                          [bundle_index])
        return results[0]

    async def ascore_many_with_events(self, task: str, transcripts: Sequence[str],
                                      bundles: Sequence[RubricBundle]) -> list[VerifierResult]:
        """All M bundles in one pass, so yes_prob runs each trajectory's prefix once for all of them."""
        check_score_inputs(task, transcripts, bundles)
        return await asyncio.to_thread(self._score_bundles, task, list(transcripts), list(bundles),
                                       list(range(len(bundles))))

    # -- work (runs on a worker thread, one call at a time) ----------------------------------------
    def _score_bundles(self, task: str, transcripts: list[str], bundles: list[RubricBundle],
                       indices: list[int | None]) -> list[VerifierResult]:
        import torch

        device = next(self.model.parameters()).device.type
        with self._lock, torch.inference_mode(), torch.autocast(device, dtype=self.autocast_dtype,
                                                                enabled=self.autocast_dtype is not None):
            if self.scoring == "yes_prob":
                return self._yes_prob_bundles(task, transcripts, bundles, indices)
            return [self._json_bundle(task, transcripts, bundle, index)
                    for bundle, index in zip(bundles, indices)]

    def _prompt_ids(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  **self.chat_template_kwargs)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _too_long(self, ids: list[int], extra: int) -> bool:
        return self.max_prompt_tokens is not None and len(ids) + extra > self.max_prompt_tokens

    def _yes_prob_bundles(self, task: str, transcripts: list[str], bundles: list[RubricBundle],
                          indices: list[int | None]) -> list[VerifierResult]:
        scores = [np.full((len(transcripts), len(b)), np.nan) for b in bundles]
        events: list[list[VerifierEvent]] = [[] for _ in bundles]
        for i, transcript in enumerate(transcripts):
            cells = [(m, k) for m, bundle in enumerate(bundles) for k in range(len(bundle))]
            prompts = [self._prompt_ids(yes_no_messages(task, transcript, bundles[m].criteria[k],
                                                        self.templates.yes_no)) for m, k in cells]
            self.accounting.add("requests", len(prompts))
            fits = [not self._too_long(ids, 1) for ids in prompts]
            for (m, k), ok in zip(cells, fits):
                if not ok:
                    self.accounting.request_failed(PROMPT_TOO_LONG)
                    events[m].append(VerifierEvent(PROMPT_TOO_LONG, i, k, indices[m],
                                                   f"prompt exceeds {self.max_prompt_tokens} tokens"))
            kept = [c for c, ok in zip(cells, fits) if ok]
            if not kept:
                continue
            started = time.monotonic()
            values = self.yes_probabilities([ids for ids, ok in zip(prompts, fits) if ok])
            self.accounting.latency(time.monotonic() - started)
            self.accounting.add("succeeded", len(kept))
            for (m, k), value in zip(kept, values):
                scores[m][i, k] = value
        return [self._finish(s, e, 0) for s, e in zip(scores, events)]

    def yes_probabilities(self, prompts: list[list[int]]) -> np.ndarray:
        """P(yes)/(P(yes)+P(no)) of the next token after each prompt (token id lists).

        The prompts' longest common prefix runs once; its KV cache is copied for each batch of up to
        `batch_size` suffixes (right-padded, so positions match an unbatched forward).
        """
        import torch

        shortest = min(len(ids) for ids in prompts)
        if shortest == 0:
            raise ValueError("prompts: expected non-empty token id lists")
        prefix_len = 0
        while prefix_len < shortest - 1 and all(ids[prefix_len] == prompts[0][prefix_len] for ids in prompts):
            prefix_len += 1
        device = next(self.model.parameters()).device
        cache = None
        if prefix_len > 0:
            prefix = torch.tensor([prompts[0][:prefix_len]], device=device)
            cache = self.model(input_ids=prefix, use_cache=True).past_key_values
            self.accounting.add("prompt_tokens", prefix_len)
        yes = torch.tensor(self.yes_ids, device=device)
        no = torch.tensor(self.no_ids, device=device)
        out = np.empty(len(prompts))
        for start in range(0, len(prompts), self.batch_size):
            batch = [ids[prefix_len:] for ids in prompts[start:start + self.batch_size]]
            width = max(len(ids) for ids in batch)
            input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long, device=device)
            mask = torch.zeros((len(batch), prefix_len + width), dtype=torch.long, device=device)
            for row, ids in enumerate(batch):
                input_ids[row, :len(ids)] = torch.tensor(ids, device=device)
                mask[row, :prefix_len + len(ids)] = 1
            last = torch.tensor([len(ids) - 1 for ids in batch], device=device)
            keep = torch.unique(last)  # only these positions need logits
            kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask, "logits_to_keep": keep}
            if cache is not None:
                batch_cache = copy.deepcopy(cache)
                if len(batch) > 1:
                    batch_cache.batch_repeat_interleave(len(batch))
                kwargs.update(past_key_values=batch_cache, use_cache=True)
            logits = self.model(**kwargs).logits  # [b, len(keep), V]
            column = torch.searchsorted(keep, last)
            rows = logits[torch.arange(len(batch), device=device), column].float()
            log_probs = torch.log_softmax(rows, dim=-1)
            log_yes = torch.logsumexp(log_probs[:, yes], dim=-1)
            log_no = torch.logsumexp(log_probs[:, no], dim=-1)
            out[start:start + len(batch)] = torch.sigmoid(log_yes - log_no).double().cpu().numpy()
            self.accounting.add("prompt_tokens", sum(len(ids) for ids in batch))
        return out

    def _json_bundle(self, task: str, transcripts: list[str], bundle: RubricBundle,
                     index: int | None) -> VerifierResult:
        n, k = len(transcripts), len(bundle)
        if self.mode == "per_trajectory":
            requests = [(verification_messages(task, t, bundle, "per_trajectory",
                                               self.templates.verification_trajectory),
                         lambda text, i=i: parse_score_answer(text, k, trajectory=i))
                        for i, t in enumerate(transcripts)]
        else:
            requests = [(verification_messages(task, transcripts, bundle, "per_group",
                                               self.templates.verification_group),
                         lambda text: parse_group_answer(text, n, k))]
        self.accounting.add("requests", len(requests))
        answers = self._generate([messages for messages, _ in requests])
        parsed: list[ParsedScores] = [parse(text) if text is not None else self._too_long_result(parse)
                                      for (_, parse), text in zip(requests, answers)]
        retry = [j for j, p in enumerate(parsed) if p.malformed is not None and answers[j] is not None]
        if retry:
            self.accounting.add("reasks", len(retry))
            again = self._generate([reask_messages(requests[j][0], answers[j] or "", parsed[j].malformed or "",
                                                   self.mode, k, self.templates.reask) for j in retry])
            for j, text in zip(retry, again):
                parse = requests[j][1]
                parsed[j] = parse(text) if text is not None else self._too_long_result(parse)
                if parsed[j].malformed is not None:
                    for problem in parsed[j].problems:
                        problem.detail = f"after one corrective re-ask: {problem.detail}"
        for p in parsed:
            if p.malformed is None:
                self.accounting.add("succeeded")
            else:
                self.accounting.request_failed(p.problems[0].reason if p.problems else MALFORMED_JSON)
        scores = np.stack([p.scores for p in parsed]).reshape(n, k)
        problems = [q for p in parsed for q in p.problems]
        return self._finish(scores, events_from(ParsedScores(scores, problems), index),
                            sum(p.clamped for p in parsed))

    def _too_long_result(self, parse: Any) -> ParsedScores:
        result = parse("")
        trajectory = result.problems[0].trajectory if result.problems else None
        result.problems = [Problem(trajectory, None, PROMPT_TOO_LONG,
                                   f"prompt exceeds {self.max_prompt_tokens} tokens")]
        result.malformed = PROMPT_TOO_LONG
        return result

    def _generate(self, conversations: list[list[dict]]) -> list[str | None]:
        """Greedy answers, batched with left padding; None for a prompt that does not fit."""
        import torch

        prompts = [self._prompt_ids(messages) for messages in conversations]
        out: list[str | None] = [None] * len(prompts)
        todo = [j for j, ids in enumerate(prompts) if not self._too_long(ids, self.max_new_tokens)]
        device = next(self.model.parameters()).device
        stops = {t for t in (self.tokenizer.eos_token_id, self.pad_id) if t is not None}
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            width = max(len(prompts[j]) for j in chunk)
            input_ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long, device=device)
            mask = torch.zeros_like(input_ids)
            for row, j in enumerate(chunk):
                ids = prompts[j]
                input_ids[row, width - len(ids):] = torch.tensor(ids, device=device)
                mask[row, width - len(ids):] = 1
            started = time.monotonic()
            generated = self.model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False,
                                            max_new_tokens=self.max_new_tokens, pad_token_id=self.pad_id,
                                            eos_token_id=self.tokenizer.eos_token_id)
            self.accounting.latency(time.monotonic() - started)
            for row, j in enumerate(chunk):
                new = generated[row, width:].tolist()
                length = next((t for t, token in enumerate(new) if token in stops), len(new))
                out[j] = self.tokenizer.decode(new[:length], skip_special_tokens=True)
                self.accounting.add("prompt_tokens", len(prompts[j]))
                self.accounting.add("completion_tokens", length)
        return out
