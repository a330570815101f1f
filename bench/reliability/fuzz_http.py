"""Schemathesis against Ivy's own ``/openapi.json``: every operation gets
generated requests, valid (positive) and schema-violating (negative), and
every answer is checked against the document: no status >= 500, a status the
document lists for that operation, and a body in the documented schema (so
every error is in the documented OpenAI or TEI error shape)."""

from __future__ import annotations

import builtins
import json
import time
from collections import Counter

# Checks from schemathesis that say "the server did what its document
# says". positive_data_acceptance / negative_data_rejection are left out:
# the document cannot express Ivy's limits (vocabulary, token counts), so a
# schema-valid request may fairly be refused and vice versa.
CHECK_NAMES = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
               "response_schema_conformance")
# What a failed check raises: an AssertionError or, for several failures,
# an exception group (Python 3.11+; 3.10 has none to catch).
_CHECK_FAILURES = (Exception, getattr(builtins, "BaseExceptionGroup", Exception))

# Error bodies by route family, as Ivy documents them (ivy/src/error.rs).
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}
TEI_ERROR_TYPES = {"Validation", "Empty", "Unauthorized", "Overloaded", "Unhealthy", "Backend", "Tokenizer"}


def error_shape_problem(path: str, status: int, body: bytes) -> str | None:
    """Why an error body is not in the documented shape, or None."""
    try:
        doc = json.loads(body)
    except ValueError:
        return f"error body is not JSON: {body[:80]!r}"
    if path.startswith("/v2/"):
        if not (isinstance(doc, dict) and isinstance(doc.get("message"), str) and isinstance(doc.get("id"), str)):
            return f"not Cohere's error shape: {str(doc)[:120]}"
        return None
    if path.startswith("/v1/"):
        err = doc.get("error") if isinstance(doc, dict) else None
        if not (isinstance(err, dict) and OPENAI_ERROR_KEYS <= set(err) and isinstance(err["message"], str)):
            return f"not OpenAI's error shape: {str(doc)[:120]}"
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("error"), str)
            and doc.get("error_type") in TEI_ERROR_TYPES):
        return f"not TEI's error shape: {str(doc)[:120]}"
    return None


def run(base_url: str, examples_per_operation: int, seed: int = 0, alive=None) -> dict:
    """Fuzzes every operation of ``base_url``'s document with
    ``examples_per_operation`` positive and as many negative examples.
    ``alive`` (optional) tells whether the server process is still up; it
    is checked after each operation. Returns counts and the first failures."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode, checks

    selected = [getattr(checks, name) for name in CHECK_NAMES]
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    statuses: Counter = Counter()
    by_operation: dict[str, int] = {}
    failures: list[dict] = []
    crashed = False
    started = time.monotonic()

    def record(label: str, mode: str, case, problem: str) -> None:
        if len(failures) < 50:
            body = case.body if not isinstance(case.body, bytes) else case.body[:200].hex()
            failures.append({"operation": label, "mode": mode, "problem": problem[:600],
                             "body": str(body)[:400], "query": case.query})

    def fuzzer(op, mode):
        """A hypothesis test of one operation in one generation mode."""
        @settings(max_examples=examples_per_operation, deadline=None, database=None, derandomize=False,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def fuzz(case):
            response = case.call(base_url=base_url, timeout=30)
            statuses[response.status_code] += 1
            by_operation[op.label] = by_operation.get(op.label, 0) + 1
            try:
                case.validate_response(response, checks=selected)
            except _CHECK_FAILURES as e:  # a failed check: keep going, report it
                record(op.label, mode.value, case, f"{type(e).__name__}: {e}")
            if response.status_code >= 400:
                problem = error_shape_problem(op.path, response.status_code, response.content)
                if problem:
                    record(op.label, mode.value, case, problem)
        return fuzz

    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                hseed(seed)(fuzzer(op, mode))()
            except Unsatisfiable:
                pass  # nothing can violate the schema of a GET without parameters
        if alive is not None and not alive():
            crashed = True
            break
    return {
        "requests": sum(statuses.values()),
        "operations": len(by_operation),
        "by_operation": by_operation,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "server_errors": sum(v for k, v in statuses.items() if k >= 500),
        "failures": failures,
        "crashed": crashed,
        "seconds": round(time.monotonic() - started, 1),
    }
