"""Engine-config errors name the sub-field the user set, its value and what is allowed."""

import pytest

from kvsim.errors import InputError
from kvsim.scenario import load_scenario


@pytest.mark.parametrize("sets,line", [
    (["engine.cache_type_k=q9_0"],
     ("engine.cache_type_k: 'q9_0' — not supported by llama.cpp; allowed: f32, f16, bf16, "
      "q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1")),
    (["engine.flash_attn=false", "engine.cache_type_v=q8_0"],
     "engine.cache_type_v: 'q8_0' — a quantized V cache requires flash attention"),
    (["engine.allocator=slots", "engine.parallel=20000"],
     "engine.parallel: 20000 — exceeds ctx_size (16384); must be at most that"),
])
def test_model_level_engine_errors_name_the_sub_field(sets, line):
    # quickstart: llama.cpp, -c 16384 (workloads/scenarios/quickstart.yaml)
    with pytest.raises(InputError) as exc:
        load_scenario("quickstart", sets)
    assert exc.value.one_line().startswith(line)
    assert "{" not in exc.value.one_line()          # never the whole engine dict
