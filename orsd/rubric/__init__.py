"""Rubric machinery of ORSD (paper §3.2, Eq. 5–7): bundles, prompts, verifiers, alignment.

Model- and trainer-independent: nothing here imports `orsd.train`. `LocalVerifier` imports torch
only when it runs.
"""

from orsd.rubric.accounting import COUNTERS, Accounting, VerifierEvent
from orsd.rubric.align import (METHODS, Alignment, align, satisfaction, select, select_random,
                               select_single, spearman_rho)
from orsd.rubric.answers import (ParsedScores, Problem, find_json_object, parse_group_answer,
                                 parse_score_answer, yes_probability)
from orsd.rubric.bundle import MAX_CRITERIA, MIN_CRITERIA, Criterion, RubricBundle, extract_criteria
from orsd.rubric.cache import ResponseCache, cache_key
from orsd.rubric.chat_client import ChatClient
from orsd.rubric.local_verifier import LocalVerifier, answer_token_ids
from orsd.rubric.openai_verifier import OpenAIVerifier, VerifierRequestError, parse_retry_after
from orsd.rubric.prompts import (MODES, TEMPLATE_DIR, PromptTemplates, answer_json_schema,
                                 generation_messages, load_template, reask_messages, rubric_context,
                                 verification_messages, yes_no_messages)
from orsd.rubric.transcript import DEFAULT_MAX_TRANSCRIPT_CHARS, format_transcript
from orsd.rubric.verifier import SCORINGS, VerifierBase, VerifierResult, run_blocking

__all__ = [
    "COUNTERS", "DEFAULT_MAX_TRANSCRIPT_CHARS", "MAX_CRITERIA", "METHODS", "MIN_CRITERIA", "MODES",
    "SCORINGS", "TEMPLATE_DIR", "Accounting", "Alignment", "ChatClient", "Criterion", "LocalVerifier",
    "OpenAIVerifier", "ParsedScores", "Problem", "PromptTemplates", "ResponseCache", "RubricBundle",
    "VerifierBase", "VerifierEvent", "VerifierRequestError", "VerifierResult", "align",
    "answer_json_schema", "answer_token_ids", "cache_key", "extract_criteria", "find_json_object",
    "format_transcript", "generation_messages", "load_template", "parse_group_answer",
    "parse_retry_after", "parse_score_answer", "reask_messages", "rubric_context", "run_blocking",
    "satisfaction", "select", "select_random", "select_single", "spearman_rho",
    "verification_messages", "yes_no_messages", "yes_probability",
]
