"""The preflight report as a short aligned table. Pure Python (no torch): the driver
(enlace-remote) renders the JSON it gets from the server with the same function."""

from __future__ import annotations

from typing import Any


def format_report(r: dict[str, Any]) -> str:
    """A short aligned table for people; the JSON holds the same fields."""
    rows = [("run", f"{r['run_name']}  (batch {r['batch_size']} x {r['seq_len']}, grad_accum {r['grad_accum']})")]
    rows += _environment_rows(r) + _measured_rows(r) + _verdict_detail_rows(r)
    rows.append(("verdict", r["verdict"].upper() + (f" — {r['suggestion']}" if r.get("suggestion") else "")))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _environment_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """The device and the settings the run measured with."""
    rows: list[tuple[str, str]] = [("profile", r["profile"])] if r.get("profile") else []
    env = r.get("environment", {})
    if env:
        rows.append(
            (
                "device",
                f"{env['device_name']} ({env['device']}), torch {env['torch']}"
                + (f", CUDA {env['cuda']}" if env.get("cuda") else ""),
            )
        )
        rows.append(
            (
                "settings",
                f"{env['precision']}, compile {env['compile']}, deterministic {env['deterministic']}, "
                f"{env['threads']} threads, {env['params'] / 1e6:.2f}M params"
                + (f" + a {env['teacher_params'] / 1e6:.2f}M teacher" if env.get("teacher_params") else "")
                + (f", {r['world']} processes (worst rank shown)" if r.get("world", 1) > 1 else ""),
            )
        )
    return rows


def _measured_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Memory, step time, throughput and the projection."""
    rows: list[tuple[str, str]] = []
    m = r.get("memory", {})
    if m.get("kind") == "cuda":
        rows.append(
            (
                "memory",
                f"peak reserved {m['peak_reserved_mib']} MiB (allocated {m['peak_allocated_mib']}) of "
                f"{m['total_mib']} MiB, headroom {m['headroom_pct']}%, retries {m['num_alloc_retries']}",
            )
        )
    elif m:
        rows.append(
            (
                "memory",
                f"peak RSS {m['peak_rss_mib']} MiB of {m['total_mib']} MiB"
                f"{' (limit)' if m.get('limit_mib') else ''}, headroom {m['headroom_pct']}%",
            )
        )
    tp = r.get("throughput")
    if tp:
        rows.append(("step time", f"median {tp['median_step_s'] * 1000:.0f} ms, p90 {tp['p90_step_s'] * 1000:.0f} ms"))
        rows.append(("throughput", f"{tp['tokens_per_s']:.0f} tokens/s"))
        span = (
            f"the {tp['remaining_steps']} steps left (resumes at {tp['resumes_at']} of {tp['max_steps']})"
            if tp.get("resumes_at")
            else f"{tp['max_steps']} steps"
        )
        rows.append(
            (
                "projected",
                f"{tp['projected']} for {span} (incl. eval and checkpoints; save {tp['checkpoint_save_s']} s)",
            )
        )
    return rows


def _verdict_detail_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Disk, fp16's stability, and what made the verdict (too slow, out of memory, max batch)."""
    rows: list[tuple[str, str]] = []
    disk = r.get("disk")
    if disk:
        rows.append(("disk", f"{disk['checkpoint_mib']} MiB per checkpoint, {disk['free_mib']} MiB free"))
    f = r.get("fp16")
    if f:
        rows.append(
            (
                "fp16",
                "n/a (not fp16)"
                if f["skip_rate"] == "n/a"
                else f"skip rate {f['skip_rate']:.0%} after calibration, final scale {f['final_scale']:g}, "
                f"non-finite losses {f['nonfinite_losses']}",
            )
        )
    if r.get("too_slow"):
        ts = r["too_slow"]
        rows.append(("too slow", f"measured {ts['elapsed_s']} s of a {ts['budget_s']:.0f} s budget"))
    if r.get("oom_phase"):
        rows.append(("out of memory", f"in {r['oom_phase']}: {r['oom_detail']}"))
    if r.get("max_batch"):
        mb = r["max_batch"]
        rows.append(
            (
                "max batch",
                f"{mb['batch_size']} fits ({mb['tokens_per_s']:.0f} tokens/s); {mb['first_failing']} does not"
                if mb["first_failing"]
                else f"{mb['batch_size']} (search cap)",
            )
        )
    return rows
