"""The `judge/*` metrics of a step, read from the judge server's own Prometheus `/metrics`.

`JudgeMeter(root_url).step()` scrapes the judge (the built-in server or vLLM) and returns what changed since the
previous call (the first: since the meter was made, or since the judge started when it was not up yet):

    judge/requests            requests answered
    judge/prompt_tokens       their prompt tokens (vLLM: every prefill, aborted requests' included)
    judge/generation_tokens   tokens generated (abandoned requests' included)
    judge/latency_p50_s       median seconds from a request's arrival to its answer; absent when none finished
    judge/latency_p95_s       95th percentile (vLLM's histogram holds aborted requests too)
    judge/errors              completion requests answered 4xx or 5xx
    judge/timed_out           requests whose client went away before the answer (a client timeout)

A judge that does not answer within `timeout` gives `{"judge/unreachable": 1}` and nothing else; the meter never
raises. Counters that went down (a restarted judge) count from zero again, as Prometheus' `increase` does. The
percentiles come from the histogram buckets' increase, interpolated inside a bucket as `histogram_quantile` does.

Where each figure comes from:

| key | built-in server | vLLM |
|---|---|---|
| requests | `prime_lab_requests_total` | `vllm:request_success_total`, finished_reason stop, length or repetition |
| prompt_tokens | `prime_lab_prompt_tokens_total` | `vllm:prompt_tokens_total` |
| generation_tokens | `prime_lab_generation_tokens_total` | `vllm:generation_tokens_total` |
| latency | `prime_lab_e2e_request_latency_seconds` | `vllm:e2e_request_latency_seconds` |
| errors | `prime_lab_requests_failed_total` | `http_requests_total` 4xx/5xx of `/v1/*completions` (else reason error) |
| timed_out | `prime_lab_requests_cancelled_total` | `vllm:request_success_total`, finished_reason abort |

Series are summed over their labels (models, routes, vLLM's engines).
"""

from __future__ import annotations

import http.client
import math
import re
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

UNREACHABLE = "judge/unreachable"
COUNTS = ("requests", "prompt_tokens", "generation_tokens", "errors", "timed_out")
QUANTILES = (("judge/latency_p50_s", 0.5), ("judge/latency_p95_s", 0.95))
COMPLETION_HANDLERS = ("/v1/chat/completions", "/v1/completions")
VLLM_ANSWERED = ("stop", "length", "repetition")

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line of a Prometheus text exposition; comments and lines that do not
    parse are skipped."""
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match[3])
        except ValueError:
            continue
        yield match[1], dict(LABEL.findall(match[2] or "")), value


@dataclass
class JudgeTotals:
    """The judge's counters since it started (`COUNTS`), and its latency histogram: upper bound -> cumulative
    count, summed over its label sets."""

    counts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0.0))
    latency: dict[float, float] = field(default_factory=dict)


def judge_totals(text: str) -> JudgeTotals:
    """The totals in a `/metrics` text of the built-in server or vLLM."""
    totals = JudgeTotals()
    counts = totals.counts
    http_errors: float | None = None  # None: the server has no http_requests_total
    vllm_errors = 0.0
    builtin = {"prime_lab_requests_total": "requests", "prime_lab_prompt_tokens_total": "prompt_tokens",
               "prime_lab_generation_tokens_total": "generation_tokens", "prime_lab_requests_failed_total": "errors",
               "prime_lab_requests_cancelled_total": "timed_out", "vllm:prompt_tokens_total": "prompt_tokens",
               "vllm:generation_tokens_total": "generation_tokens"}  # fmt: skip
    for name, labels, value in samples(text):
        if name in builtin:
            counts[builtin[name]] += value
        elif name == "vllm:request_success_total":
            reason = labels.get("finished_reason")
            if reason in VLLM_ANSWERED:
                counts["requests"] += value
            elif reason == "abort":
                counts["timed_out"] += value
            elif reason == "error":
                vllm_errors += value
        elif name == "http_requests_total":
            http_errors = http_errors or 0.0
            if labels.get("handler") in COMPLETION_HANDLERS and labels.get("status", "")[:1] in ("4", "5"):
                http_errors += value
        elif name in ("prime_lab_e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket"):
            try:
                bound = float(labels["le"])
            except (KeyError, ValueError):
                continue
            totals.latency[bound] = totals.latency.get(bound, 0.0) + value
    counts["errors"] += vllm_errors if http_errors is None else http_errors
    return totals


def increase(now: float, before: float) -> float:
    """A counter's increase; one that went down was reset (its server restarted) and counts from zero."""
    return now - before if now >= before else now


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The q-quantile of cumulative `buckets` (upper bound -> count, +Inf included) as Prometheus'
    `histogram_quantile` interpolates it, or None when nothing was observed."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]) or len(bounds) < 2:
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    index = next(i for i, bound in enumerate(bounds) if buckets[bound] >= rank)
    if index == len(bounds) - 1:  # in the +Inf bucket: the highest finite bound
        return bounds[-2]
    start, below = (0.0, 0.0) if index == 0 else (bounds[index - 1], buckets[bounds[index - 1]])
    inside = buckets[bounds[index]] - below
    if inside <= 0:
        return bounds[index]
    return start + (bounds[index] - start) * (rank - below) / inside


def step_metrics(before: JudgeTotals | None, now: JudgeTotals) -> dict[str, float]:
    """The `judge/*` metrics between two scrapes (`before` None: since the judge started)."""
    before = before or JudgeTotals()
    out: dict[str, float] = {f"judge/{key}": int(round(increase(now.counts[key], before.counts[key])))
                             for key in COUNTS}  # fmt: skip
    reset = sum(now.latency.values()) < sum(before.latency.values()) or set(before.latency) - set(now.latency)
    buckets = now.latency if reset else {bound: n - before.latency.get(bound, 0.0) for bound, n in now.latency.items()}
    for key, q in QUANTILES:
        value = histogram_quantile(q, buckets)
        if value is not None and math.isfinite(value):
            out[key] = value
    return out


class JudgeMeter:
    """The judge's metrics per step, from its `/metrics` (`root_url`: the server's root, e.g. `RunningServer.root_url`;
    a trailing `/v1` is dropped). Each scrape waits at most `timeout` seconds."""

    def __init__(self, root_url: str, *, timeout: float = 2.0) -> None:
        root = root_url.rstrip("/")
        self.url = root.removesuffix("/v1") + "/metrics"
        self.timeout = timeout
        self._last = self.scrape()

    def scrape(self) -> JudgeTotals | None:
        """The judge's totals now, or None when it does not answer."""
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as response:  # noqa: S310 (http only)
                text = response.read().decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException, ValueError):
            return None
        return judge_totals(text)

    def step(self) -> dict[str, float]:
        """The metrics since the previous step (see the module docstring), or `{"judge/unreachable": 1}`."""
        now = self.scrape()
        if now is None:
            return {UNREACHABLE: 1}
        metrics = step_metrics(self._last, now)
        self._last = now
        return metrics
