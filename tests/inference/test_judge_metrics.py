"""The judge/* metrics of a step (`inference.judge_metrics.JudgeMeter`), read from the judge server's own /metrics:
the built-in server through real requests of the OpenAI client (the session's `builtin_server`), vLLM's from a
/metrics text written from its metric definitions (vllm/v1/metrics/loggers.py, 0.32), a judge that is not there."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import openai
import pytest

from prime_lab.inference.builtin.launcher import BuiltinServer
from prime_lab.inference.judge_metrics import JudgeMeter, judge_totals, step_metrics
from prime_lab.runs.processes import free_port

ZERO = {"judge/requests": 0, "judge/prompt_tokens": 0, "judge/generation_tokens": 0, "judge/errors": 0,
        "judge/timed_out": 0}  # fmt: skip


def rubric(answer: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You grade answers. Reply with a score from 1 to 10 and one reason."},
            {"role": "user", "content": f"Question: what is 2 + 2?\nAnswer: {answer}\nIs the answer correct?"}]


def test_a_step_counts_the_judge_requests_answered_failed_and_abandoned(builtin_server: BuiltinServer) -> None:
    meter = JudgeMeter(builtin_server.root_url)
    client = openai.AsyncOpenAI(base_url=builtin_server.base_url, api_key="unused", max_retries=0, timeout=60)
    model = builtin_server.model_name

    async def judge(answer: str, max_tokens: int) -> Any:
        return await client.chat.completions.create(model=model, messages=rubric(answer),  # type: ignore[arg-type]
                                                    max_tokens=max_tokens, extra_body={"ignore_eos": True})

    async def requests() -> list[Any]:
        answers = list(await asyncio.gather(*(judge(str(4 + i), 4 + 2 * i) for i in range(5))))  # batched together
        answers.append(await judge("four", 3))
        with pytest.raises(openai.BadRequestError):
            await judge("4", 10_000)  # beyond the context: answered 400
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="no-such-judge", messages=rubric("4"))  # type: ignore[arg-type]
        return answers

    answers = asyncio.run(requests())
    step = meter.step()
    assert {key: step[key] for key in ZERO} == {
        "judge/requests": 6,
        "judge/prompt_tokens": sum(a.usage.prompt_tokens for a in answers),
        "judge/generation_tokens": sum(a.usage.completion_tokens for a in answers),
        "judge/errors": 2,
        "judge/timed_out": 0,
    }
    assert 0 < step["judge/latency_p50_s"] <= step["judge/latency_p95_s"] < 60
    assert meter.step() == ZERO  # nothing in between: zero counts and no latency (never NaN)

    abandoning = openai.OpenAI(base_url=builtin_server.base_url, api_key="unused", max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):  # ~3 s of decoding on two CPU cores: the client leaves first
        abandoning.chat.completions.create(model=model, messages=rubric("5"), max_tokens=1800,  # type: ignore[arg-type]
                                           extra_body={"ignore_eos": True})
    seen: dict[str, float] = dict(ZERO)
    deadline = time.monotonic() + 10
    while seen["judge/timed_out"] == 0 and time.monotonic() < deadline:  # the server notices the disconnect
        for key, value in meter.step().items():
            seen[key] = seen.get(key, 0) + value
        time.sleep(0.02)
    assert (seen["judge/requests"], seen["judge/errors"], seen["judge/timed_out"]) == (0, 0, 1)
    assert "judge/latency_p50_s" not in seen  # the answered requests' latency only


def test_a_judge_that_is_not_there_is_a_flag_within_the_timeout() -> None:
    assert JudgeMeter(f"http://127.0.0.1:{free_port()}/v1").step() == {"judge/unreachable": 1}
    with socket.create_server(("127.0.0.1", 0)) as silent:  # takes the connection, never answers
        start = time.monotonic()
        meter = JudgeMeter(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.2)
        assert meter.step() == {"judge/unreachable": 1}
        assert time.monotonic() - start < 2


# vLLM 0.32's buckets for e2e_request_latency_seconds (vllm/v1/metrics/buckets.py REQUEST_LATENCY_BUCKETS)
VLLM_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                960.0, 1920.0, 7680.0)  # fmt: skip


def vllm_metrics(engines: list[dict[str, Any]], http: dict[str, float]) -> str:
    """/metrics as vLLM's prometheus_client writes it: per engine (data parallel) counters with their `_created`
    samples, the e2e latency histogram (`latency`: observations per bucket, cumulated here), and the HTTP
    instrumentator's http_requests_total by handler and status class."""
    lines = []

    def family(name: str, kind: str, text: str) -> None:
        lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}"])

    family("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.")
    for i, engine in enumerate(engines):
        lines.append(f'vllm:prompt_tokens_total{{engine="{i}",model_name="judge"}} {float(engine["prompt"])}')
        lines.append(f'vllm:prompt_tokens_created{{engine="{i}",model_name="judge"}} 1.7645e+09')
    family("vllm:generation_tokens", "counter", "Number of generation tokens processed.")
    for i, engine in enumerate(engines):
        lines.append(f'vllm:generation_tokens_total{{engine="{i}",model_name="judge"}} {float(engine["generated"])}')
    family("vllm:request_success", "counter", "Count of successfully processed requests.")
    for i, engine in enumerate(engines):
        for reason in ("stop", "length", "abort", "error", "repetition"):
            labels = f'engine="{i}",finished_reason="{reason}",model_name="judge"'
            lines.append(f"vllm:request_success_total{{{labels}}} {float(engine['finished'].get(reason, 0))}")
            lines.append(f"vllm:request_success_created{{{labels}}} 1.7645e+09")
    family("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.")
    for i, engine in enumerate(engines):
        seen = 0
        for bound in (*VLLM_BUCKETS, "+Inf"):
            seen += engine["latency"].get(bound, 0)
            lines.append(f'vllm:e2e_request_latency_seconds_bucket{{engine="{i}",le="{bound}",model_name="judge"}} '
                         f"{float(seen)}")
        lines.append(f'vllm:e2e_request_latency_seconds_count{{engine="{i}",model_name="judge"}} {float(seen)}')
        lines.append(f'vllm:e2e_request_latency_seconds_sum{{engine="{i}",model_name="judge"}} 12.5')
    family("http_requests_total", "counter", "Total number of requests by method, status and handler.")
    for key, n in http.items():
        handler, status = key.split(" ")
        lines.append(f'http_requests_total{{handler="{handler}",method="POST",status="{status}"}} {n}')
    return "\n".join(lines) + "\n"


def test_vllm_metrics_give_the_step_deltas() -> None:
    before = vllm_metrics(
        [{"prompt": 1000, "generated": 300, "finished": {"stop": 8, "length": 2, "abort": 1},
          "latency": {0.3: 2, 0.5: 3, 0.8: 3, 1.0: 1, 1.5: 1, "+Inf": 1}},
         {"prompt": 500, "generated": 100, "finished": {"stop": 4}, "latency": {0.5: 4}}],
        {"/v1/chat/completions 2xx": 15, "/v1/chat/completions 4xx": 1, "/v1/models 4xx": 3},
    )  # fmt: skip
    after = vllm_metrics(
        [{"prompt": 1800, "generated": 700, "finished": {"stop": 14, "length": 3, "abort": 3, "error": 1,
                                                         "repetition": 1},
          "latency": {0.3: 2, 0.5: 3, 0.8: 7, 1.0: 6, 1.5: 5, 2.0: 1, 2.5: 1, "+Inf": 1}},
         {"prompt": 700, "generated": 150, "finished": {"stop": 6}, "latency": {0.5: 4, 1.0: 2}}],
        {"/v1/chat/completions 2xx": 28, "/v1/chat/completions 4xx": 3, "/v1/chat/completions 5xx": 1,
         "/v1/completions 4xx": 1, "/v1/models 4xx": 9},
    )  # fmt: skip
    step = step_metrics(judge_totals(before), judge_totals(after))
    # latency increase per bucket (both engines): (0.5, 0.8] 4, (0.8, 1.0] 7, (1.0, 1.5] 4, (1.5, 2.0] 1, (2.0, 2.5] 1
    # of 17: the median (rank 8.5) is in (0.8, 1.0], 4.5 of 7 into it; p95 (rank 16.15) in (2.0, 2.5], 0.15 of 1
    assert step == pytest.approx({
        "judge/requests": (6 + 1 + 1) + 2,  # stop, length, repetition; not abort or error
        "judge/prompt_tokens": 800 + 200,
        "judge/generation_tokens": 400 + 50,
        "judge/errors": 2 + 1 + 1,  # 4xx and 5xx of the completion routes only (the 500 is the reason "error")
        "judge/timed_out": 2,
        "judge/latency_p50_s": 0.8 + 0.2 * 4.5 / 7,
        "judge/latency_p95_s": 2.0 + 0.5 * 0.15,
    })  # fmt: skip
    assert step_metrics(judge_totals(after), judge_totals(after)) == ZERO
    restarted = step_metrics(judge_totals(after), judge_totals(before))  # counters reset: from zero again
    assert restarted["judge/requests"] == 14 and restarted["judge/timed_out"] == 1
    assert restarted["judge/latency_p50_s"] == pytest.approx(0.3 + 0.2 * (7.5 - 2) / 7)
