"""gepa/launcher.py: a job from a config file or the defaults, the resolved.json round trip, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_lab.gepa.config import GepaSearchSection
from prime_lab.gepa.launcher import GepaJob, GepaLaunchError, create_run, job_for_env, open_run, read_config

CONFIGS = Path(__file__).parents[2] / "configs" / "gepa"


def test_a_config_file_gives_its_settings_and_the_defaults_for_the_rest() -> None:
    job, text = read_config(CONFIGS / "reverse-text.toml")
    spec = job.settings
    assert (spec.env_id, spec.max_metric_calls, spec.num_train, spec.num_val, spec.perfect_score) == \
        ("reverse-text", 200, 30, 12, 1.0)
    assert spec.sampling == {"max_tokens": 48, "temperature": 0.7} and job.base_url is None
    defaults = GepaSearchSection()
    assert (spec.max_concurrent, spec.num_parallel_proposals) == (defaults.max_concurrent,
                                                                   defaults.num_parallel_proposals)
    assert text.startswith("# GEPA on reverse-text")
    bare = job_for_env("gsm8k").settings
    assert (bare.max_metric_calls, bare.num_train, bare.minibatch_size) == (defaults.max_calls, defaults.num_train,
                                                                           defaults.minibatch_size)


def test_a_run_created_from_a_job_resumes_as_the_same_job(tmp_path: Path) -> None:
    job = job_for_env("reverse-text")
    job.settings.seed, job.base_url = 7, "http://127.0.0.1:9/v1"
    run = create_run(job, output_dir=tmp_path / "runs" / "mine")
    assert run.dir == tmp_path / "runs" / "mine" and run.state == "queued"
    again, resumed = open_run(run.dir)
    assert again.id == run.id and resumed == job and isinstance(resumed, GepaJob)


def test_what_a_user_can_fix_is_one_clear_message(tmp_path: Path) -> None:
    bad = tmp_path / "gepa.toml"
    bad.write_text('[env]\nid = "reverse-text"\n\n[gepa]\nmax_cals = 10\n')
    with pytest.raises(GepaLaunchError) as exc:
        read_config(bad)
    assert f"{bad}:5" in str(exc.value) and "max_calls" in str(exc.value)  # file:line and the did-you-mean
    with pytest.raises(GepaLaunchError, match="not a GEPA run directory"):
        open_run(tmp_path)
    with pytest.raises(GepaLaunchError, match="no-such-env"):
        create_run(job_for_env("no-such-env"), output_dir=tmp_path / "runs" / "x")
    assert not (tmp_path / "runs" / "x").exists()
