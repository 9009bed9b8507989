"""Bad policy input through `kvsim simulate --set`: one line naming the field, exit 2."""

import pytest

from kvsim.cli import main

BASE = ["simulate", "quickstart", "--set", "workload.max_sessions=2"]


@pytest.mark.parametrize("sets, needle", [
    (["policies=[{kind: sliding_window, window_tokens: 20000}]"], "window_tokens"),
    (["policies=[{kind: recoverable_eviction, window_tokens: 1024, cache_type: kivi_int2}]"],
     "cache_type"),
    (["policies=[{kind: kivi, bits: 3}]"], "bits"),
    (["engine.cache_type_v=q8_0", "engine.flash_attn=false"], "flash"),
    (["accuracy.exact.lost=1.5"], "lost"),
    (["accuracy.p_hit=-0.2"], "p_hit"),
    (["policies=[{kind: idle_offload, host_budget_bytes: 0}]"],
     "policies.0.host_budget_bytes: 0"),
    # the default budget is the engine's: the error names that field, not the policy's
    (["engine.cache_ram_bytes=0", "policies=[{kind: idle_offload}]"],
     "engine.cache_ram_bytes: 0"),
    # the demoted q4_0 / q8_0 tokens sit in llama.cpp's V cache: flash attention needed
    (["engine.flash_attn=false",
      "policies=[{kind: recoverable_eviction, window_tokens: 1024, cache_type: q8_0}]"],
     "policies.0.cache_type: 'q8_0' — none with engine.flash_attn false"),
    (["gpu=apple-m4-max", "policies=[{kind: idle_offload}]"], "no host tier"),
    (["engine={preset: vllm, context_tokens: 16384}", "policies=[{kind: idle_offload}]"],
         "slot engines"),
    (["policies=[{kind: teleport}]"], "teleport"),
])
def test_bad_policy_input_is_one_line_and_exit_2(tmp_path, capsys, sets, needle) -> None:
    args = [*BASE, "-o", str(tmp_path / "out")]
    for s in sets:
        args += ["--set", s]
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2
    assert err.startswith("error:") and len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "out").exists()
