"""The benchmark report checks each target from the scripts' JSON (pure functions, no benchmark runs)."""

from __future__ import annotations

from typing import Any

from benchmarks._report import (
    MISS,
    NOT_MEASURED,
    PASS,
    ScriptRun,
    accelerate_checks,
    accelerate_summary,
    check_targets,
    cloud_storage_checks,
    cold_resume_checks,
    cpu_ratio_checks,
    hf_trainer_checks,
    hf_trainer_summary,
    pause_memory_checks,
    pause_time_checks,
    render_results,
    resume_checks,
    resume_time_checks,
    seeding_checks,
    step_instructions_summary,
    step_overhead_checks,
    throughput_checks,
    where_seeding_time_goes,
    worst_pause_size,
)

MIB = 1 << 20


def _throughput(ratio_at_200: float, ratio_at_0: float = 0.5) -> dict[str, Any]:
    return {
        "settings": {"num_workers": 2},
        "results": [
            {
                "cost_us": 0.0,
                "torch_samples_per_s": 10_000.0,
                "resumable_samples_per_s": 10_000.0 * ratio_at_0,
            },
            {
                "cost_us": 200.0,
                "torch_samples_per_s": 4_000.0,
                "resumable_samples_per_s": 4_000.0 * ratio_at_200,
            },
        ],
    }


def _checkpointing(
    pause_s: float, reference_s: float, peak_mib: float, state_mib: float = 100.0
) -> dict[str, Any]:
    return {
        "sizes": [
            {
                "parameters": 10_500_000,
                "state_bytes": int(state_mib * MIB),
                "save": {
                    "pause()": {
                        "median_seconds": pause_s,
                        "max_peak_rss_above_baseline_bytes": int(peak_mib * MIB),
                    },
                    "torch.save + fsync": {
                        "median_seconds": reference_s,
                        "max_peak_rss_above_baseline_bytes": 0,
                    },
                },
                "load": {
                    "resume()": {"median_seconds": reference_s},
                    "torch.load + load_state_dict": {"median_seconds": reference_s},
                },
            }
        ],
    }


def _resume(ours: dict[int, list[float]], theirs: dict[int, list[float]]) -> dict[str, Any]:
    return {
        "resumable": {str(p): times for p, times in ours.items()},
        "stateful_dataloader": {str(p): times for p, times in theirs.items()},
        "stateful_dataloader_skipped": {"100000000": "n/a: beyond one epoch"},
    }


def test_throughput_passes_at_ratio_097_and_ignores_the_zero_cost_setting() -> None:
    [check] = throughput_checks(_throughput(0.98, ratio_at_0=0.5))
    assert check.status == PASS
    assert "0.980" in check.measured and "num_workers=2" in check.measured


def test_throughput_below_097_at_200us_is_a_miss_with_the_ratio() -> None:
    [check] = throughput_checks(_throughput(0.9))
    assert check.status == MISS
    assert "0.900" in check.measured


def test_throughput_without_a_200us_run_is_not_measured() -> None:
    data = _throughput(1.0)
    data["results"] = data["results"][:1]
    [check] = throughput_checks(data)
    assert check.status == NOT_MEASURED


def test_resume_flat_up_to_1e8_passes_and_growing_stateful_loader_passes() -> None:
    ours = {
        0: [0.30, 0.50, 0.31],
        1_000_000: [0.28, 0.29, 0.9],
        100_000_000: [0.33, 0.32, 0.2],
    }  # medians .31 .29 .32
    theirs = {0: [1.0, 1.2, 1.1], 1_000_000: [3.0, 3.3, 3.6]}  # medians 1.1 and 3.3
    flat, grows = resume_checks(_resume(ours, theirs))
    assert flat.status == PASS
    assert "1.10" in flat.measured  # 0.32 / 0.29
    assert grows.status == PASS
    assert "x3.00" in grows.measured


def test_resume_spread_above_12_is_a_miss() -> None:
    ours = {0: [0.2], 1_000_000: [0.2], 100_000_000: [0.3]}
    flat, _ = resume_checks(_resume(ours, {0: [1.0], 1_000_000: [3.0]}))
    assert flat.status == MISS
    assert "1.50" in flat.measured


def test_resume_measured_only_up_to_1e6_cannot_pass_the_flatness_target() -> None:
    flat, _ = resume_checks(_resume({0: [0.2], 1_000_000: [0.2]}, {0: [1.0], 1_000_000: [3.0]}))
    assert flat.status == MISS
    assert "1,000,000" in flat.measured


def test_stateful_loader_that_stays_flat_is_a_miss_and_one_position_is_not_measured() -> None:
    ours = {0: [0.2], 100_000_000: [0.2]}
    _, flat_theirs = resume_checks(_resume(ours, {0: [1.0], 1_000_000: [1.1]}))
    assert flat_theirs.status == MISS
    _, single = resume_checks(_resume(ours, {0: [1.0]}))
    assert single.status == NOT_MEASURED
    assert "beyond one epoch" in single.measured


def test_seeding_per_batch_passes_within_its_target_and_is_not_measured_when_absent() -> None:
    data = _throughput(1.0)
    data.update(seeding_us_per_batch=14.2, seeding_target_us=15.0)
    [ok] = seeding_checks(data)
    assert ok.status == PASS and "14.2 µs" in ok.measured
    data["seeding_us_per_batch"] = 16.0
    [missed] = seeding_checks(data)
    assert missed.status == MISS
    [absent] = seeding_checks(_throughput(1.0))
    assert absent.status == NOT_MEASURED


def test_pause_time_ratio_passes_at_095_and_misses_above() -> None:
    [ok] = pause_time_checks(_checkpointing(0.95, 1.0, 1.0), None)
    [missed] = pause_time_checks(_checkpointing(1.2, 1.0, 1.0), None)
    assert ok.status == PASS and "0.95x" in ok.measured
    assert missed.status == MISS and "1.20x" in missed.measured


def test_pause_and_resume_are_checked_fresh_and_in_one_process() -> None:
    checkpointing = _checkpointing(0.9, 1.0, 1.0)
    size = checkpointing["sizes"][0]
    size["load"] = {
        "resume()": {"median_seconds": 2.0},
        "torch.load + load_state_dict": {"median_seconds": 1.0},
    }
    size["same_process"] = {
        "save": {
            "pause()": {"median_seconds": 1.0},
            "torch.save + fsync": {"median_seconds": 1.0},
        },
        "load": {
            "resume()": {"median_seconds": 1.1},
            "torch.load + load_state_dict": {"median_seconds": 1.0},
        },
    }
    fresh_pause, same_pause = pause_time_checks(checkpointing, None)
    assert fresh_pause.status == PASS and "fresh process" in fresh_pause.measured
    assert same_pause.status == MISS and "same process" in same_pause.measured
    fresh_resume, same_resume = resume_time_checks(checkpointing)
    assert fresh_resume.status == MISS and "2.00x" in fresh_resume.measured
    assert same_resume.status == PASS and "1.10x" in same_resume.measured


def test_pause_time_also_checks_the_pause_script_json() -> None:
    pause = {
        "parameters": 100_700_000,
        "blocking": {"pause_median_s": 3.0, "torch_save_fsync_median_s": 2.0},
    }
    checks = pause_time_checks(_checkpointing(0.9, 1.0, 1.0), pause)
    assert [c.status for c in checks] == [PASS, MISS]
    assert "1.50x" in checks[1].measured and checks[1].source == "pause.json"


def test_profile_follows_the_state_size_that_missed_the_pause_target_most() -> None:
    small, large = (
        _checkpointing(1.3, 1.0, 1.0)["sizes"][0],
        _checkpointing(2.0, 1.0, 1.0)["sizes"][0],
    )
    small["label"], large["label"] = "10M", "100M"
    assert worst_pause_size({"sizes": [small, large]}) == "100M"
    met = _checkpointing(0.9, 1.0, 1.0)["sizes"][0]
    met["label"] = "10M"
    assert worst_pause_size({"sizes": [met]}) is None


def test_pause_peak_rss_within_11_times_state_passes_and_above_misses() -> None:
    [ok] = pause_memory_checks(_checkpointing(1.0, 1.0, peak_mib=5.0, state_mib=100.0))
    [missed] = pause_memory_checks(_checkpointing(1.0, 1.0, peak_mib=120.0, state_mib=100.0))
    assert ok.status == PASS and "0.05x" in ok.measured
    assert missed.status == MISS and "1.20x" in missed.measured


def test_missing_or_malformed_json_is_not_measured_never_pass() -> None:
    checks = check_targets({"checkpointing": {"sizes": [{"parameters": 1}]}})
    assert checks and all(check.status == NOT_MEASURED for check in checks)


def test_rendered_results_show_each_check_status_and_figure() -> None:
    checks = check_targets(
        {
            "loader_throughput": _throughput(0.9),
            "checkpointing": _checkpointing(0.9, 1.0, 1.0),
        }
    )
    text = render_results(
        command="python -m benchmarks --quick",
        generated="2030-01-01 00:00 UTC",
        machine={"CPU": "test cpu"},
        runs=[
            ScriptRun(
                "pause", "python benchmarks/pause.py --quick", "not available: missing", None, ""
            )
        ],
        checks=checks,
        notes=[("Where the time goes: pause()", "fsync 1.000 s")],
    )
    assert "`python -m benchmarks --quick`" in text
    assert "| test cpu |" in text
    assert "**MISS** | num_workers=2: 0.900" in text
    assert "not available: missing" in text
    assert "fsync 1.000 s" in text
    # no CPU, seeding, Trainer, Accelerate or cloud storage figures
    assert "3 passed, 1 missed, 9 not measured." in text


def test_throughput_checks_each_num_workers_row_at_200us_separately() -> None:
    data = {
        "settings": {"num_workers": [0, 2]},
        "results": [
            {
                "num_workers": workers,
                "cost_us": 200.0,
                "torch_samples_per_s": 4_000.0,
                "resumable_samples_per_s": 4_000.0 * ratio,
            }
            for workers, ratio in ((0, 0.99), (2, 0.9))
        ],
    }
    at_0, at_2 = throughput_checks(data)
    assert at_0.status == PASS and at_0.measured.startswith("num_workers=0: 0.990")
    assert at_2.status == MISS and at_2.measured.startswith("num_workers=2: 0.900")


def test_cpu_ratio_checks_each_target_point_and_stateful_dataloader_within_its_slack() -> None:
    data = {
        "results": [
            {"num_workers": 0, "cost_us": 0.0, "cpu_ratio": 0.91, "stateful_cpu_ratio": 0.95},
            {"num_workers": 0, "cost_us": 200.0, "cpu_ratio": 0.96, "stateful_cpu_ratio": 0.97},
            {"num_workers": 2, "cost_us": 0.0, "cpu_ratio": 0.5, "stateful_cpu_ratio": 0.4},
            {
                "dataset": "iterable",
                "num_workers": 2,
                "cost_us": 0.0,
                "cpu_ratio": 0.89,
                "cpu_ratio_runs": [0.85, 0.89, 0.93],
                "stateful_cpu_ratio": 0.8,
            },
        ],
    }
    checks = cpu_ratio_checks(data)
    statuses = [(check.target.split(" >= ")[1], check.status) for check in checks]
    assert statuses == [
        ("0.90 at 0 µs/sample (map, num_workers=0)", PASS),
        ("StatefulDataLoader's - 0.02", MISS),
        ("0.97 at 200 µs/sample (map)", MISS),
        ("StatefulDataLoader's - 0.02", PASS),
        ("StatefulDataLoader's - 0.02", PASS),
        ("0.90 at 0 µs/sample (iterable)", MISS),
        ("StatefulDataLoader's - 0.02", PASS),
    ]
    assert checks[2].measured == "map, num_workers=0, 200 µs/sample: 0.960"
    assert checks[5].measured == (
        "iterable, num_workers=2, 0 µs/sample: 0.890 (min-max over 3 repeats 0.850-0.930)"
    )


def test_throughput_ignores_the_iterable_datasets_runs() -> None:
    data = _throughput(0.98)
    data["results"].append(
        {
            "dataset": "iterable",
            "cost_us": 200.0,
            "torch_samples_per_s": 4_000.0,
            "resumable_samples_per_s": 1_000.0,
        }
    )
    [check] = throughput_checks(data)
    assert check.status == PASS and "0.980" in check.measured


def test_seeding_stretch_is_checked_beside_the_target_when_the_json_names_it() -> None:
    data = _throughput(1.0)
    data.update(seeding_us_per_batch=6.4, seeding_target_us=8.0, seeding_stretch_us=5.0)
    target, stretch = seeding_checks(data)
    assert (target.status, stretch.status) == (PASS, MISS)
    assert stretch.target == "seeding + hand-back per batch <= 5 µs (num_workers=0, stretch)"
    assert stretch.measured == "6.4 µs per batch"


def test_cpu_ratio_without_cpu_figures_is_not_measured() -> None:
    [check] = cpu_ratio_checks({"results": [{"cost_us": 200.0, "num_workers": 0}]})
    assert check.status == NOT_MEASURED


def test_the_seeding_note_lists_each_step_largest_first() -> None:
    profile = {
        "seeding_breakdown_us": {
            "seed torch CPU (manual_seed)": 1.5,
            "seed NumPy (init_genrand)": 2.0,
            "whole: CallerGenerators.run around seed_batch": 7.25,
        }
    }
    assert where_seeding_time_goes(profile) == (
        "Seeding one batch and handing the caller's generators back took 7.25 µs in the profile "
        "run (each step timed on its own, min of repeats): seed NumPy (init_genrand) 2.00 µs; "
        "seed torch CPU (manual_seed) 1.50 µs."
    )
    assert where_seeding_time_goes({"cost_us": 200.0}) is None


def _resume_method(label: str, first: int | None, difference: float) -> dict[str, Any]:
    """One method of a framework resume comparison, as the benchmark scripts write it."""
    return {
        "label": label,
        "identical": first is None and difference == 0.0,
        "first_differing_step": first,
        "max_weight_difference": difference,
        "median_pause_s": 0.05,
        "median_resume_s": 1.25,
    }


def _hf_trainer(identical: bool) -> dict[str, Any]:
    return {
        "parameters": 550_000,
        "steps": 12,
        "interrupted_after": 4,
        "repeats": 3,
        "methods": {
            "trainer": _resume_method("Trainer", 5, 0.0034),
            "resumable": _resume_method(
                "ResumableTrainer", None if identical else 7, 0.0 if identical else 0.1
            ),
        },
    }


def test_hf_trainer_check_passes_when_the_resumed_run_is_identical_and_names_the_trainers_step() -> (
    None
):
    [check] = hf_trainer_checks(_hf_trainer(identical=True))
    assert check.status == PASS
    assert check.measured == (
        "resumed after step 4 of 12: losses and weights identical; the Trainer's own resume "
        "differs from step 5"
    )
    [check] = hf_trainer_checks(_hf_trainer(identical=False))
    assert check.status == MISS and check.measured.startswith(
        "resumed after step 4 of 12: differs from step 7"
    )


def test_hf_trainer_without_or_with_malformed_json_is_not_measured() -> None:
    assert [check.status for check in hf_trainer_checks(None)] == [NOT_MEASURED]
    assert [check.status for check in hf_trainer_checks({"methods": {}})] == [NOT_MEASURED]


def test_hf_trainer_summary_puts_both_resumes_side_by_side() -> None:
    [(title, headers, rows)] = hf_trainer_summary(
        {"hf_trainer_resume": _hf_trainer(identical=True)}
    )
    assert title == (
        "Hugging Face Trainer resume (hf_trainer_resume.py, 0.6M parameters, resumed after step 4 "
        "of 12, medians of 3)"
    )
    assert headers[1:4] == ["bit-identical", "first differing step", "max weight difference"]
    assert rows == [
        ["Trainer", "no", "5", "0.0034", "0.050", "1.250"],
        ["ResumableTrainer", "yes", "none", "0", "0.050", "1.250"],
    ]
    assert hf_trainer_summary({}) == []


def _accelerate(identical: bool) -> dict[str, Any]:
    return {
        "parameters": 600_000,
        "steps": 50,
        "interrupted_after": 30,
        "repeats": 3,
        "methods": {
            "accelerate": _resume_method("Accelerate save_state", 31, 0.02),
            "adapter": _resume_method(
                "adapter", None if identical else 34, 0.0 if identical else 0.1
            ),
        },
    }


def test_accelerate_check_passes_when_the_adapter_is_identical_and_names_accelerates_micro_step() -> (
    None
):
    [ok] = accelerate_checks(_accelerate(identical=True))
    assert ok.status == PASS
    assert ok.target == "the Accelerate adapter resumes an Accelerate loop bit-identically"
    assert ok.measured == (
        "resumed after micro-step 30 of 50: losses and weights identical; Accelerate's own "
        "resume differs from micro-step 31"
    )
    [missed] = accelerate_checks(_accelerate(identical=False))
    assert missed.status == MISS
    assert missed.measured.startswith(
        "resumed after micro-step 30 of 50: differs from micro-step 34"
    )
    assert [check.status for check in accelerate_checks(None)] == [NOT_MEASURED]


def test_accelerate_summary_puts_both_resumes_side_by_side() -> None:
    [(title, headers, rows)] = accelerate_summary({"accelerate_resume": _accelerate(True)})
    assert title == (
        "Accelerate resume (accelerate_resume.py, 0.6M parameters, resumed after micro-step 30 "
        "of 50, medians of 3)"
    )
    assert headers[1:4] == ["bit-identical", "first differing micro-step", "max weight difference"]
    assert rows == [
        ["Accelerate save_state", "no", "31", "0.02", "0.050", "1.250"],
        ["adapter", "yes", "none", "0", "0.050", "1.250"],
    ]
    assert accelerate_summary({}) == []


def _steps(library_ratios: list[float], bare_us: float = 100.0) -> dict[str, Any]:
    bare = [bare_us] * len(library_ratios)
    library = [bare_us * ratio for ratio in library_ratios]
    ordered = sorted(library_ratios)
    middle = ordered[len(ordered) // 2]
    return {
        "steps": 1500,
        "warmup": 100,
        "rounds": len(library_ratios),
        "targets": {"map, 0 workers": 1.10, "iterable, 2 workers": 1.05},
        "cases": {
            "map, 0 workers": {
                "bare": {
                    "us_per_step": bare,
                    "median_us_per_step": bare_us,
                    "ratios_to_bare": [1.0] * len(bare),
                    "median_ratio_to_bare": 1.0,
                    "median_overhead_us": 0.0,
                },
                "library": {
                    "us_per_step": library,
                    "median_us_per_step": bare_us * middle,
                    "ratios_to_bare": library_ratios,
                    "median_ratio_to_bare": middle,
                    "median_overhead_us": bare_us * (middle - 1.0),
                },
            }
        },
    }


def _cloud(pause_s: float, resume_s: float) -> dict[str, Any]:
    def entry(seconds: float) -> dict[str, Any]:
        return {"median_seconds": seconds}

    return {
        "state_bytes": 128 * MIB,
        "write": {
            "pause()": entry(pause_s),
            "torch.save(BytesIO) + fs.pipe": entry(1.0),
            'torch.save(fs.open(url, "wb"))': entry(2.0),
        },
        "read": {
            "resume()": entry(resume_s),
            'torch.load(fs.open(url, "rb")) + load_state_dict': entry(1.0),
        },
    }


def test_step_overhead_checks_the_median_ratio_per_case_with_its_spread_and_a_case_not_run() -> (
    None
):
    ok, stretch, not_run = step_overhead_checks(
        _steps([1.02, 1.08, 1.30]), {"seeding_us_per_batch": 4.0}
    )
    assert ok.status == PASS and ok.target.endswith("<= 1.10x (map, 0 workers)")
    assert "1.080x (rounds 1.020-1.300" in ok.measured
    assert stretch.status == PASS and "+8.0 µs (limit 9.0 µs)" in stretch.measured
    assert not_run.status == NOT_MEASURED and "iterable, 2 workers" in not_run.target
    [missed, _, _] = step_overhead_checks(_steps([1.12, 1.15, 1.2]), None)
    assert missed.status == MISS and "1.150x" in missed.measured


def test_step_overhead_is_checked_only_where_the_suite_ran_it() -> None:
    assert not any("per-step" in check.target for check in check_targets({}))
    [failed] = [
        check for check in check_targets({"step_overhead": None}) if "per-step" in check.target
    ]
    assert failed.status == NOT_MEASURED


def test_cold_resume_checks_the_small_ratio_and_both_bandwidths_against_their_targets() -> None:
    gib = 1 << 30
    data = {
        "small_target": 1.10,
        "bandwidth_target": 0.90,
        "small": {
            "seconds": {"resume()": [0.11, 0.12], "torch.load": [0.1, 0.1]},
            "ratios": [1.1, 1.2],
            "median_ratio": 1.15,
        },
        "large": {
            "file_bytes": 2 * gib,
            "bytes_per_s": {
                "pause_write": [0.95 * gib],
                "plain_write": [1.0 * gib],
                "resume_read": [0.5 * gib],
                "plain_read": [1.0 * gib],
            },
            "write_ratios": [0.95],
            "read_ratios": [0.5],
        },
    }
    small, write, read = cold_resume_checks(data)
    assert small.status == MISS and "1.150x (rounds 1.100-1.200" in small.measured
    assert write.status == PASS and "0.950" in write.measured and "2.00 GiB" in write.measured
    assert read.status == MISS and "512 vs 1,024 MiB/s" in read.measured
    assert all(c.status == NOT_MEASURED for c in cold_resume_checks(None))


def test_cloud_storage_checks_pause_against_both_fsspec_writes_and_resume_against_torch_load() -> (
    None
):
    pipe, open_write, read = cloud_storage_checks(_cloud(pause_s=1.5, resume_s=1.05))
    assert (pipe.status, open_write.status, read.status) == (MISS, PASS, PASS)
    assert "1.50x" in pipe.measured and "128 MiB" in pipe.measured
    assert [check.status for check in cloud_storage_checks(None)] == [NOT_MEASURED] * 3


def test_instructions_per_step_are_tabled_per_case_and_variant_or_said_not_measured() -> None:
    data = {
        "steps": 200,
        "warmup": 100,
        "cases": {
            "map, 0 workers": {
                "bare": {
                    "instructions_per_step": 1_000_000.0,
                    "ratio_to_bare": 1.0,
                    "over_bare": 0.0,
                },
                "library": {
                    "instructions_per_step": 1_060_000.0,
                    "ratio_to_bare": 1.06,
                    "over_bare": 60_000.0,
                },
            }
        },
    }

    [(title, headers, rows)] = step_instructions_summary({"step_instructions": data})

    assert "200 steps after 100" in title and "not a target" in title
    assert headers == ["case", "variant", "instructions/step", "x bare", "over bare"]
    assert rows == [
        ["map, 0 workers", "bare", "1,000,000", "1.000", "+0"],
        ["map, 0 workers", "library", "1,060,000", "1.060", "+60,000"],
    ]
    assert step_instructions_summary({}) == []
    [(_, _, [[reason]])] = step_instructions_summary(
        {"step_instructions": {"not_measured": "valgrind not found"}}
    )
    assert reason == "valgrind not found"
    [(_, headers, [[error]])] = step_instructions_summary({"step_instructions": {"cases": {}}})
    assert headers == ["error"] and "unexpected JSON layout" in error
