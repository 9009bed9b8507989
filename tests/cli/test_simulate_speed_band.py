"""`kvsim simulate`'s speed band: the note on a fitted roofline's error for unseen cards,
`--speed-band` (the run at both ends, speed_band.json), and the refusal without a band."""

import json

from kvsim.config.units import format_latency
from kvsim.latency.speed_band import speed_band
from kvsim.scenario import load_scenario

SMALL = ["--set", "workload.max_sessions=6", "--no-report", "--no-advice"]


def test_a_fitted_roofline_run_says_how_far_unseen_cards_ran(kvsim_cli, tmp_path) -> None:
    code, err, _ = kvsim_cli("simulate", "quickstart", *SMALL, "-o", tmp_path / "r")
    assert (code, err) == (0, "")
    band = speed_band(load_scenario("quickstart", ["workload.max_sessions=6"]))
    note = next(ln for ln in kvsim_cli.stderr.splitlines()  # type: ignore[attr-defined]
                if ln.startswith("note: speed model"))
    assert note == (
        f"note: speed model: cards left out of its CUDA fit ran, 8 in 10 of "
        f"{band.decode_rows} decode and {band.prompt_rows} prompt measurements, at "
        f"{band.speed_words()} (hardware_profiles/speed/constants.yaml); --speed-band reruns "
        "this scenario at both ends, kvsim calibrate bench on your card replaces the "
        "estimate with measurements")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["latency_fit_prompt_speed_p10"] == 1 / band.prompt[1]


def test_speed_band_reruns_at_both_ends_and_saves_them(kvsim_cli, tmp_path) -> None:
    code, err, out = kvsim_cli("simulate", "quickstart", *SMALL, "--speed-band",
                               "-o", tmp_path / "r")
    assert (code, err) == (0, "")
    doc = json.loads((tmp_path / "r" / "speed_band.json").read_text())
    ttft = doc["metrics"]["ttft_p95_s"]
    row = next(ln for ln in out.splitlines() if ln.startswith("│ TTFT p95"))
    assert [c.strip() for c in row.strip("│").split("│")[1:]] == [
        format_latency(ttft[k]) for k in ("predicted", "fast", "slow")]
    # the verdict says it too (and so does the report, which shows the verdict's lines)
    line = next(ln for ln in out.splitlines() if ln.startswith("  speed band (8 in 10"))
    assert f"TTFT p95 {format_latency(ttft['fast'])} … {format_latency(ttft['slow'])}" in line
    band = speed_band(load_scenario("quickstart", ["workload.max_sessions=6"]))
    assert doc["step_time_factors"] == {
        "fast": {"decode": band.decode[0], "prompt": band.prompt[0]},
        "slow": {"decode": band.decode[1], "prompt": band.prompt[1]}}
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for key in ("ttft_p95_s", "itl_p95_s", "e2e_p95_s"):
        m = doc["metrics"][key]
        assert m["predicted"] == summary[key]
        assert m["fast"] < m["predicted"] < m["slow"], key
    assert not any(ln.startswith("note: speed model")  # the band itself is shown instead
                   for ln in kvsim_cli.stderr.splitlines())  # type: ignore[attr-defined]


def test_speed_band_without_a_fitted_roofline_is_refused_before_the_run(kvsim_cli,
                                                                       tmp_path) -> None:
    code, err, _ = kvsim_cli("simulate", "quickstart", *SMALL, "--speed-band",
                             "--set", "latency.rates=peak", "-o", tmp_path / "r")
    assert code == 2
    assert err == ("error: --speed-band: 'latency.rates peak' — needs a roofline with fitted "
                   "backend constants (latency.kind roofline, rates backend on CUDA, ROCm, "
                   "Vulkan or Metal); a calibrated model is the card's own measurements, "
                   "with no band")
    assert not (tmp_path / "r").exists()


def test_plan_and_compare_name_each_backend_s_band_once() -> None:
    from kvsim.cli._speed_band_output import bands_note

    def on(gpu: str, *sets: str):
        return load_scenario("quickstart", [f"gpu={gpu}", *sets])

    cuda = speed_band(on("rtx-3090"))
    rocm = speed_band(on("rx-7900-xtx"))
    note = bands_note({"rtx-3090": on("rtx-3090"), "rx-7900-xtx": on("rx-7900-xtx"),
                       "rtx-4090": on("rtx-4090"),
                       "rtx-a6000": on("rtx-a6000", "latency.rates=peak")})
    assert note == (
        f"speed model: cards left out of its fit ran, 8 in 10, at {cuda.ratio_words()} on "
        f"CUDA (rtx-3090, rtx-4090); {rocm.ratio_words()} on ROCm (rx-7900-xtx) of kvsim's "
        "speed: a p95 near its target may land on either side (kvsim simulate --speed-band "
        "reruns a setting at both ends; --set latency.speed_band=slow plans for the slow "
        "one)")
    assert bands_note({"rtx-a6000": on("rtx-a6000", "latency.rates=peak")}) == ""
    slow = bands_note({"rtx-3090": on("rtx-3090", "latency.speed_band=slow")})
    decode, prompt = cuda.factors("slow")
    assert slow == (f"speed model: run at the slow end of its band on CUDA (rtx-3090: "
                    f"decode steps x{decode:.3g}, prompt steps x{prompt:.3g} the predicted "
                    "time)")


def test_on_vllm_the_note_says_the_band_is_llama_cpp_s(kvsim_cli, tmp_path) -> None:
    code, err, _ = kvsim_cli("simulate", "family-4-vllm", "--set", "workload.days=0.05",
                             "--no-report", "--no-advice", "-o", tmp_path / "r")
    assert (code, err) == (0, "")
    note = next(ln for ln in kvsim_cli.stderr.splitlines()  # type: ignore[attr-defined]
                if ln.startswith("note: speed model"))
    assert ("; those measurements are llama.cpp's: vllm's own kernels are in none of them "
            "(published vLLM runs decoded 16-bit weights 15-26 % faster than kvsim prices "
            "them on an A6000 and A100, within 6 % on an RTX 4090; 4-bit and FP8 within "
            "16 %: docs/design/vllm-speed.md);") in note
    assert note.endswith("kvsim calibrate kernels on your card replaces the estimate with "
                         "measurements")


def test_on_a_pascal_card_the_note_says_its_dp4a_price_rests_on_one_card() -> None:
    from kvsim.cli._speed_band_output import speed_note

    dp4a = ("; this card's quantized layers take Pascal's dp4a path, priced from one card "
            "(Tesla P40)")
    assert dp4a in speed_note(load_scenario("quickstart", ["gpu=gtx-1070"]))
    assert dp4a not in speed_note(load_scenario("quickstart", []))            # RTX card
    assert dp4a not in speed_note(load_scenario("quickstart", ["gpu=gtx-1070",
                                                               "weights=f16"]))
    assert "held-out Pascal prompts ran 12 % off (median)" in speed_note(
        load_scenario("quickstart", ["gpu=gtx-1070"]))


def test_a_plan_or_comparison_on_a_pascal_card_carries_the_dp4a_caveat() -> None:
    from kvsim.cli._speed_band_output import bands_note

    note = bands_note({"gtx-1070": load_scenario("quickstart", ["gpu=gtx-1070"]),
                       "rtx-3090": load_scenario("quickstart", ["gpu=rtx-3090"])})
    assert ("; gtx-1070: quantized layers on Pascal's dp4a path, priced from one card "
            "(Tesla P40)") in note
    assert "rtx-3090:" not in note
    assert "dp4a" not in bands_note({"rtx-3090": load_scenario("quickstart",
                                                               ["gpu=rtx-3090"])})


def test_on_a_volta_card_with_an_moe_model_the_note_names_the_expert_loop() -> None:
    from kvsim.cli._speed_band_output import speed_note

    loop = ("; this card runs a step of 64+ tokens through the MoE layers' host loop over "
            "the experts, priced from two Volta prompts of one source, outside the band")
    moe = ["gpu=tesla-v100-sxm2-32gb", "model=qwen3-30b-a3b", "weights=q4_k_m"]
    assert loop in speed_note(load_scenario("quickstart", moe))
    assert loop not in speed_note(load_scenario("quickstart", moe[:1]))   # a dense model
    assert "host loop" not in speed_note(load_scenario("quickstart", ["model=qwen3-30b-a3b",
                                                                     "weights=q4_k_m"]))
