"""`calibrate engine` measures how late requests reach the server beyond their typical
handling (settings.arrival_delay_s / arrival_jitter_s), which a scenario replays as
``latency.arrival_delay_s`` / ``arrival_jitter_s``."""

import pytest

from kvsim.calibrate.engine import EngineGrid, measure_engine
from kvsim.calibrate.engine_noise import arrival_delay
from kvsim.calibrate.engine_samples import EngineSamples, PrefillSample
from kvsim.calibrate.wire import TokenSpace
from kvsim.cli.calibrate import _arrival_line
from kvsim.scenario import load_scenario

from .fake_llama import FakeLlama


def _prompt(late_s: float, handling_s: float, rnd: int) -> PrefillSample:
    return PrefillSample(0.05, 0, 16, rnd, late_s=late_s, handling_s=handling_s)


def test_the_delay_is_lateness_plus_handling_above_its_rounds_median() -> None:
    """Round 1's handling is 10 ms slower throughout (a slower minute): only each prompt's
    handling above its round's median is a delay, so both rounds give 0, 3, 1.5 ms."""
    samples = EngineSamples(props={}, prefill={
        (0, 16): [_prompt(0.001, 0.002, 0), _prompt(0.001, 0.012, 1)],
        (0, 64): [_prompt(0.002, 0.004, 0), _prompt(0.002, 0.014, 1)],
        (0, 256): [_prompt(0.0015, 0.003, 0), _prompt(0.0015, 0.013, 1)]})
    mean, sd = arrival_delay(samples)
    assert mean == pytest.approx(0.0015, abs=1e-15)
    assert sd == pytest.approx(0.0013416407864998738, rel=1e-12)  # stdev of 0, 3, 1.5 ms twice


def test_no_delay_without_both_parts_or_with_a_mean_not_above_zero() -> None:
    assert arrival_delay(EngineSamples(props={}, prefill={
        (0, 16): [PrefillSample(0.05, 0, 16), PrefillSample(0.05, 0, 16)]})) is None
    early = EngineSamples(props={}, prefill={(0, 16): [_prompt(0.0, 0.002, 0),
                                                       _prompt(0.0, 0.002, 0)]})
    assert arrival_delay(early) is None  # on time, handling steady: nothing to replay


def test_the_prober_reads_its_own_lateness_and_the_servers_prompt_time() -> None:
    grid = EngineGrid(prompt_tokens=(8, 40), contexts=(0, 64), batches=(1,),
                      decode_tokens=8, idle_s=0.01, repeats=1, ram_cache=False,
                      space=TokenSpace(low=300, high=900))
    with FakeLlama(slot_tokens=200) as srv:  # NOTE: it reports prompt_ms 1 + prompt length
        samples = measure_engine(srv.url, grid)
    prompts = [v for vals in samples.prefill.values() for v in vals]
    assert len(prompts) == 4
    for v in prompts:
        assert 0.0 <= v.late_s < 0.5
        assert v.handling_s == v.ttft_s - (1 + v.cache_n + v.prompt_n) / 1000.0


def test_the_line_printed_gives_keys_a_scenario_takes() -> None:
    line = _arrival_line(0.00065, 0.00035)
    assert line == ("requests reach the server 0.65 ms late (sd 0.35 ms: the client's "
                    "lateness and the server's request handling): set "
                    "latency.arrival_delay_s: 0.00065 and latency.arrival_jitter_s: 0.00035 "
                    "to replay it (docs/scenarios.md, Timing noise)")
    sc = load_scenario("quickstart", ["latency.arrival_delay_s=0.00065",
                                      "latency.arrival_jitter_s=0.00035"])
    assert (sc.latency.arrival_delay_s, sc.latency.arrival_jitter_s) == (0.00065, 0.00035)
