"""The search configs' bounds (``workers/config.py``): a value the decoder cannot use is one
``ValueError`` line at construction, before any work; the bounds themselves are accepted."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from raymt.workers.config import (MAX_BEAM_SIZE, MAX_SAMPLING_TEMPERATURE, MIN_SAMPLING_TEMPERATURE,
                                  SamplingConfig, SearchConfig)

INF, NAN = math.inf, math.nan


def refused(match: str, build) -> None:
    with pytest.raises(ValueError, match=match) as e:
        build()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("temperature", [INF, -INF, NAN, 0.0, -0.0, -1.0, 1e-300, 1e300, 5e-324,
                                         MIN_SAMPLING_TEMPERATURE / 2, MAX_SAMPLING_TEMPERATURE * 2])
def test_a_temperature_outside_its_bounds_is_refused(temperature):
    refused(r"^sampling temperature must be in \[0\.0001, 10000\], got ",
            lambda: SamplingConfig(temperature=temperature))


@pytest.mark.parametrize("topk", [-1, -(2**40), 1.5, 2.0, NAN, INF, True, "3", None])
def test_a_top_k_not_a_whole_number_from_zero_is_refused(topk):
    refused(r"^sampling top-k must be an integer >= 0", lambda: SamplingConfig(topk=topk))


@pytest.mark.parametrize("topp", [NAN, INF, -INF, 0.0, -0.5, 1.0 + 1e-9, 1e300])
def test_a_top_p_outside_zero_to_one_is_refused(topp):
    refused(r"^sampling top-p must be in \(0, 1\], got ", lambda: SamplingConfig(topp=topp))


@pytest.mark.parametrize("fields", [dict(temperature=MIN_SAMPLING_TEMPERATURE),
                                    dict(temperature=MAX_SAMPLING_TEMPERATURE), dict(topk=0), dict(topk=2**40), dict(topk=np.int64(5)), dict(topp=1e-9),
                                    dict(topp=1.0)])
def test_the_bounds_themselves_are_accepted(fields):
    SamplingConfig(**fields)


@pytest.mark.parametrize("samples", [0, -1, MAX_BEAM_SIZE + 1, 100_000])
def test_a_sample_count_outside_its_bounds_is_refused(samples):
    refused(rf"^num_samples \(sampling's beam_size\) must be in \[1, {MAX_BEAM_SIZE}\], got {samples}$",
            lambda: SearchConfig(beam_size=samples, num_hypotheses=1, sampling=SamplingConfig()))


@pytest.mark.parametrize("beam_size", [0, MAX_BEAM_SIZE + 1, 100_000])
def test_a_beam_outside_its_bounds_is_refused(beam_size):
    refused(rf"^beam_size must be in \[1, {MAX_BEAM_SIZE}\], got {beam_size}$",
            lambda: SearchConfig(beam_size=beam_size, num_hypotheses=1))


def test_the_widest_beam_is_accepted_and_the_n_best_stays_within_it():
    widest = SearchConfig(beam_size=MAX_BEAM_SIZE, num_hypotheses=MAX_BEAM_SIZE)
    replace(widest, sampling=SamplingConfig())
    refused(r"^num_hypotheses must be in \[1, beam_size=1024\], got 1025",
            lambda: replace(widest, num_hypotheses=MAX_BEAM_SIZE + 1))
