"""``kvsim replay``: play a trace against a real server and save measured Results.

A server that stops answering (a lost connection, not an engine failure) or a request
past its deadline (``--request-timeout``, wall clock) stops the replay: what was
measured until then is saved to the output folder, then one error line, exit code 2.
Ctrl-C saves it too: one line, exit code 130.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kvsim.calibrate.wire import (
    CHECK_TIMEOUT_S,
    MAX_CHECK_TIMEOUT_S,
    MAX_REQUEST_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
)
from kvsim.cli._output import check_output, output_errors
from kvsim.config.workload import AFTER_FAILURE
from kvsim.errors import InputError


@click.command()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
@click.option("--api", type=click.Choice(["llama.cpp", "openai"]), default="llama.cpp",
              show_default=True, help="llama.cpp /completion, or OpenAI chat (Ollama/vLLM/SGLang)")
@click.option("--model", default="", help="model name for the OpenAI API")
@click.option("--token-range", default="1000:30000", show_default=True,
              help="token ids LOW:HIGH that segments map to (llama.cpp API)")
@click.option("--ban-tokens", default="", help="token ids LOW:HIGH to ban via logit_bias")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="multiply start and think times (use the workload's time_scale)")
@click.option("--max-sessions", type=int, default=None, help="replay only the first N sessions")
@click.option("--after-failure", type=click.Choice(AFTER_FAILURE),
              default="new_chat", show_default=True,
              help="after a failed request a session starts a new chat, ends, or replays the "
                   "trace verbatim (use the workload's after_failure)")
@click.option("--request-timeout", type=float, default=REQUEST_TIMEOUT_S, show_default=True,
              help=f"seconds one request may take, send to last token, in (0, "
                   f"{MAX_REQUEST_TIMEOUT_S:g}]; past it the replay stops, keeping what "
                   "was measured")
@click.option("--check-timeout", type=float, default=CHECK_TIMEOUT_S, show_default=True,
              help=f"seconds the server check (GET /props or /v1/models) may take, in (0, "
                   f"{MAX_CHECK_TIMEOUT_S:g}]")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="directory to write the measured Results into")
def replay(trace: str, url: str, api: str, model: str, token_range: str, ban_tokens: str,
           time_scale: float, max_sessions: int | None, after_failure: str,
           request_timeout: float, check_timeout: float, out_dir: str) -> None:
    """Replay TRACE closed-loop against the server at URL; save measured Results."""
    from kvsim.calibrate.replay import ReplayInterrupted, ReplayOptions
    from kvsim.calibrate.replay import replay as run
    from kvsim.cli.calibrate import token_space
    from kvsim.workload.io import sorted_sessions

    if max_sessions is not None and max_sessions < 1:
        raise InputError("--max-sessions", max_sessions, "an integer >= 1 (omit it to replay "
                         "every session)")
    opts = ReplayOptions(url=url, api=api, model=model,  # type: ignore[arg-type]
                         space=token_space(token_range, ban_tokens), time_scale=time_scale,
                         after_failure=after_failure,  # type: ignore[arg-type]
                         request_timeout_s=request_timeout, check_timeout_s=check_timeout)
    check_output("--output", out_dir, folder=True)
    sessions = sorted_sessions(trace)
    if max_sessions is not None:
        sessions = sessions[:max_sessions]
    res = run(sessions, opts)
    path = _save(res, out_dir)  # NOTE: a stopped replay keeps what it answered before
    if isinstance(stop := res.stopped, ReplayInterrupted):
        click.echo(f"interrupted: the {res.summary['requests']} requests answered "
                   f"so far are saved in {path}", err=True)
        raise click.exceptions.Exit(130)
    if stop is not None:  # the server died
        raise InputError(stop.field, stop.value, f"{stop.allowed}; the "
                         f"{res.summary['requests']} requests answered before are "
                         f"saved in {path}")
    s = res.summary
    click.echo(f"{s['requests']} requests ({s['failed_requests']} failed) → {path}; "
               f"TTFT p50 {s['ttft_p50_s'] * 1000:.1f} ms p95 {s['ttft_p95_s'] * 1000:.1f} ms; "
               f"ITL p50 {s['itl_p50_s'] * 1000:.1f} ms p95 {s['itl_p95_s'] * 1000:.1f} ms")
    if s.get("client_late_s", 0.0) > 0:  # NOTE: a delay a scenario takes (> 0)
        late, sd = s["client_late_s"], s["client_late_sd_s"]
        from kvsim.latency.config import arrival_keys

        click.echo(f"client: turns went out {late * 1000:.2f} ms late (sd {sd * 1000:.2f} ms) "
                   f"after their start or think time; {arrival_keys(late, sd)} replay that in "
                   "a simulation of it")


def _save(res: Any, out_dir: str) -> Path:
    with output_errors("--output", out_dir):
        return res.save(out_dir)
