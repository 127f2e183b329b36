"""The text of a plan and a prediction: ``planner recommend``, ``predict`` and ``check`` (the header of the job,
memory, phases, time, host memory and the rollout engine), read from the plan's document."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from planner.job.calibrated import calibration_line
from planner.report.results import CheckResult, Plan, Predicted, PredictionReport
from planner.report.spread_text import spread_basis_line
from planner.report.text_units import GIB, console, describe
from planner.report.text_units import gib as _gib
from planner.report.text_units import seconds as _seconds
from store.records import RLHF_WORKLOADS
from store.sizes import format_bytes


def _header(report: PredictionReport) -> None:
    w, h = report.workload, report.hardware
    params = w.get("params", 0) / 1e9
    actor = w.get("shapes", {}).get("actor", {})
    active = f", {actor['active_params'] / 1e9:.2f} B active" if "active_params" in actor else ""
    size = f"{params:.2f} B params{active}"
    if "prompt_len" in w and w["kind"] in RLHF_WORKLOADS:
        roles = [f"{role} {name}" for role, name in w.get("roles", {}).items() if role != "actor"]
        if "reference" not in w.get("roles", {}):
            roles.append(f"no reference (KL coefficient {w.get('kl_coef', 0):g})")
        if w.get("reward_model") == "none":
            roles.append("rule-based rewards (no reward model)")
        per = f" x {w['samples_per_prompt']} samples" if w.get("samples_per_prompt", 1) > 1 else ""
        console.print(
            f"[bold]{w['model']}[/bold] ({size}) · {w['kind']} · {w['global_batch']} prompts{per} "
            f"per step · prompt {w['prompt_len']} + generation {w['gen_len']} tokens · {w['dtype']}"
            + (f" · {', '.join(roles)}" if roles else "")
            + (f" · for {w['framework']}" if w.get("framework") else "")
        )
    else:
        console.print(
            f"[bold]{w['model']}[/bold] ({size}) · {w['kind']} · global batch {w['global_batch']} x "
            f"{w['seq_len']} tokens · {w['dtype']} · {w['attn_impl']}"
            + (f" · for {w['framework']}" if w.get("framework") else "")
        )
    sources = {shape.get("activations") for shape in w.get("shapes", {}).values()}
    if sources == {"traced"}:
        composed = sorted(
            name.replace("_", " + ")
            for shape in w.get("shapes", {}).values()
            for name, how in shape.get("activation_variants", {}).items()
            if how == "composed"
        )
        console.print(
            "activation and loss bytes traced from the model's own code (transformers, meta device), with HF "
            "checkpointing and LoRA "
            + (f"traced as such but {', '.join(dict.fromkeys(composed))} (composed)" if composed else "traced as such")
        )
        for shape in w.get("shapes", {}).values():  # how a traced hybrid was traced (search.model.activations)
            if shape.get("activations_reason"):
                console.print(f"  {shape.get('name', w['model'])}: {shape['activations_reason']}", soft_wrap=True)
    elif "formula" in sources:
        shapes = w.get("shapes", {})
        for role, shape in shapes.items():
            if shape.get("activations") != "formula":
                continue
            who = f"{role} {shape.get('name', '')}" if len(shapes) > 1 else str(shape.get("name", w["model"]))
            why = shape.get("activations_reason") or "no trace of this model for this dtype and attention"
            console.print(f"activation and loss bytes of {who} from the formula because {why}", soft_wrap=True)
    console.print(
        f"{h['gpus']} x {h['gpu']} per node x {h['nodes']} node(s)"
        + (f" ({h['node']})" if h.get("node") else "")
        + f" · GPU {format_bytes(h['gpu_memory_bytes'])}, usable {format_bytes(report.predicted.gpu_budget_bytes)}"
        f" · host {format_bytes(h['cpu_memory_bytes'])}"
        + (f" · {h['inter_node_gbps']:g} GB/s between nodes" if h.get("inter_node_gbps") is not None else "")
    )
    p = report.predicted
    if p.reserved_uncertainty:
        kept = h["gpu_memory_bytes"] - p.gpu_budget_bytes
        margin = h.get("safety_margin", 0.0)
        console.print(
            f"  [dim]usable keeps {format_bytes(kept)} free with the CUDA context: the larger of the "
            f"{100 * margin:.0f}% safety margin and a {_spread_pct(p.reserved_uncertainty)}% spread of peak reserved "
            "(how far the measured runs nearest this plan reserved above their predictions)[/dim]",
            soft_wrap=True,
        )
        basis = p.reserved_spread_basis.model_dump() if p.reserved_spread_basis else {}
        console.print(f"  [dim]{spread_basis_line(basis)}[/dim]", soft_wrap=True)
    for line in report.readings:
        console.print(f"  [dim]{line}[/dim]")
    if report.calibration is not None:
        console.print(f"  [dim]{calibration_line(report.calibration)}[/dim]")


def _spread_pct(spread: float) -> str:
    """A reserved spread in percent: a whole number (the fixed 8%), else one decimal (a program's measured one)."""
    tenths = round(100 * spread, 1)
    return f"{tenths:.0f}" if tenths == round(tenths) else f"{tenths:.1f}"


def _breakdown_table(predicted: Predicted) -> Table:
    table = Table(title=f"Memory per GPU at the peak phase ({predicted.peak_phase})", title_justify="left")
    table.add_column("component")
    table.add_column("bytes", justify="right")
    table.add_column("share", justify="right")
    total = max(1, predicted.peak_reserved_bytes)
    for name, value in predicted.breakdown.items():
        if value:
            table.add_row(name.replace("_", " "), format_bytes(value), f"{100 * value / total:.0f}%")
    table.add_row("[bold]peak reserved[/bold]", f"[bold]{format_bytes(predicted.peak_reserved_bytes)}[/bold]", "")
    table.add_row("usable GPU memory", format_bytes(predicted.gpu_budget_bytes), "")
    headroom = predicted.gpu_budget_bytes - predicted.peak_reserved_bytes
    table.add_row("headroom", format_bytes(headroom), "", style="green" if headroom >= 0 else "red")
    if predicted.reserved_uncertainty:
        # usable memory is sized so that peak reserved x (1 + spread) fits beside the CUDA context
        # (search.step.assemble.gpu_budget_bytes): a plan within it has the spread kept free on top
        spread = predicted.reserved_uncertainty * predicted.peak_reserved_bytes
        table.add_row(
            f"reserved spread (+/-{_spread_pct(predicted.reserved_uncertainty)}%)",
            format_bytes(spread),
            "kept free beyond usable" if headroom >= 0 else "not kept: over usable",
        )
    return table


def _phases_table(predicted: Predicted, replay: dict[str, Any] | None = None) -> Table:
    """Each phase's peaks, inactive-split bytes and time; where peak reserved is not the replay's (a plan saved
    before the replay decided), the replay's column beside it."""
    table = Table(title="Phases of one optimizer step", title_justify="left")
    columns = ["phase", "runs", "peak allocated", "peak reserved", "inactive split"]
    replayed = {p["name"]: p["peak_reserved_bytes"] for p in replay["phases"]} if replay else {}
    beside = bool(replayed) and predicted.reserved_from != "replay"
    if beside:
        columns.append("reserved, replay alone")
    for column in (*columns, "time"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for phase in predicted.phases:
        mark = " *" if phase.name == predicted.peak_phase else ""
        cells = [
            phase.name + mark,
            str(phase.count),
            _gib(phase.peak_allocated_bytes),
            _gib(phase.peak_reserved_bytes),
            _gib(phase.inactive_split_bytes),
        ]
        if beside:
            cells.append(_gib(replayed.get(phase.name, 0)))
        table.add_row(*cells, _seconds(phase.time_s))
    source = (
        "peak reserved from the allocator replay"
        if predicted.reserved_from == "replay"
        else "peak reserved from the fragment coefficients (a plan saved before the replay decided)"
    )
    caption = source
    if replay:
        caption += (
            f": the step's stream ({replay['events']:,} events) through the rules of torch's caching allocator; "
            f"{_gib(replay['after_init_reserved_bytes'])} reserved once the engines are built"
        )
        init_peak = replay.get("init_peak_reserved_bytes", 0)
        if init_peak > replay["peak_reserved_bytes"]:
            caption += (
                f"; building them peaks higher, at {_gib(init_peak)} (the model as loaded, before DeepSpeed holds it)"
            )
        if replay.get("oom_phase"):
            caption += f"; it runs out of the GPU's memory in {replay['oom_phase']}"
    if predicted.screen_reserved_bytes:
        caption += f" (the search's screen said {_gib(predicted.screen_reserved_bytes)})"
    table.caption, table.caption_justify = caption, "left"
    return table


def _outside(report: PredictionReport) -> None:
    console.print("[bold]Outside the DeepSpeed config[/bold]")
    for name, text in report.outside_settings.items():
        console.print(f"  {name}: {text or 'leave unset'}", soft_wrap=True)


def render_prediction(report: PredictionReport) -> None:
    """``planner predict``: one strategy's memory, phases and time."""
    _header(report)
    p = report.predicted
    verdict = "[green]fits[/green]" if report.fits else "[red]does not fit[/red]"
    console.print(f"\nStrategy: [bold]{describe(report.strategy, report.workload.get('roles'))}[/bold] · {verdict}")
    console.print(
        f"peak allocated {_gib(p.peak_allocated_bytes)} · peak reserved {_gib(p.peak_reserved_bytes)} · "
        f"host {_gib(p.host_bytes)} of {_gib(p.host_budget_bytes)} · step {_seconds(p.step_time_s)}"
    )
    _host_line(p)
    console.print(_breakdown_table(p))
    console.print(_phases_table(p, report.allocator_replay))
    _time_line(p)
    _rollout_line(p)
    for note in p.notes:
        console.print(f"note: {note}")


HOST_PARTS_SHOWN = 3  # the largest parts named on the host line; the rest are summed as "other"


def host_line(p: Predicted) -> str:
    """Host memory per node in one line: the peak against ``--cpu-mem``, the largest parts of the phase that
    sets it, and the other phase's total (loading happens before training, so the two never add)."""
    line = f"host per node {_gib(p.host_bytes)} of {_gib(p.host_budget_bytes)}"
    if p.host_peak_phase == "loading":
        line += " while loading the models (before training)"
    parts = sorted(p.host_breakdown.items(), key=lambda kv: -kv[1])
    shown = [f"{name.replace('_', ' ')} {value / GIB:.2f}" for name, value in parts[:HOST_PARTS_SHOWN]]
    rest = sum(value for _, value in parts[HOST_PARTS_SHOWN:])
    if rest:
        shown.append(f"other {rest / GIB:.2f}")
    if shown:
        line += ": " + ", ".join(shown) + " GiB"
    labels = {"steady": "through training", "loading": "model loading (before training)"}
    for phase, value in p.host_phases.items():
        if phase != p.host_peak_phase and value:
            line += f"; {labels.get(phase, phase)} {_gib(value)}"
    return line


def _host_line(p: Predicted) -> None:
    style = "green" if p.host_bytes <= p.host_budget_bytes else "red"
    console.print(f"[{style}]{host_line(p)}[/{style}]", soft_wrap=True)


def _time_line(p: Predicted) -> None:
    parts = [f"{k} {_seconds(v)}" for k, v in p.time_breakdown.items() if v > 0]
    console.print("step time: " + " + ".join(parts))
    if p.dominant_time_term:
        share = p.time_terms[p.dominant_time_term] / max(p.step_time_s, 1e-12)
        console.print(f"dominant time term: {p.dominant_time_term.replace('_', ' ')} ({100 * share:.0f}% of the step)")


def _rollout_line(p: Predicted) -> None:
    """The rollout engine's settings and bytes, when a vLLM/SGLang engine generates."""
    r = p.rollout
    if not r:
        return
    name = {"vllm": "vLLM", "sglang": "SGLang"}.get(r["engine"], r["engine"])
    knob = "gpu_memory_utilization" if r["engine"] == "vllm" else "mem_fraction_static"
    span = r.get("fitting_utilization")
    fitting = f" (fits {span[0]:.2f}-{span[1]:.2f})" if span else " (none fits)"
    console.print(
        f"rollout: {name} {r['placement']}, tensor parallel {r['tensor_parallel']}, {knob} "
        f"{r['gpu_memory_utilization']:.2f}{fitting}, sleep level {r['sleep_level']}"
        + (", DeepSpeed states offloaded during the rollout" if r.get("offload_training") else "")
        + (", enforce_eager" if r.get("enforce_eager") else ", CUDA graphs"),
        soft_wrap=True,
    )
    console.print(
        f"  KV cache {_gib(r['kv_cache_bytes'])} for {r['kv_cache_tokens']:,} tokens "
        f"({r['needed_kv_tokens']:,} needed: {r['sequences_per_replica']} sequences per replica, "
        f"{r['max_running_sequences']} at once) · engine awake {_gib(r['awake_bytes'])}, asleep "
        f"{_gib(r['asleep_bytes'])} per GPU · sleep backup {_gib(r['host_backup_bytes'])} host per GPU",
        soft_wrap=True,
    )


def render_plan(plan: Plan) -> None:
    """``planner recommend``: the chosen strategy, the next best, memory breakdown and phases."""
    _header(plan)
    verdict = "[green]fits[/green]" if plan.fits else "[red]nothing fits[/red]"
    console.print(f"\nPlan [bold]{plan.plan_id or '(not saved)'}[/bold]: {verdict}")
    table = Table()
    for column in ("", "strategy", "peak reserved", "headroom", "host", "step time", "overhead"):
        table.add_column(column, justify="left" if column in ("", "strategy") else "right")
    fastest = plan.fastest_ignoring_memory.predicted.step_time_s if plan.fastest_ignoring_memory else None
    rows: list[tuple[str, dict[str, Any], Predicted]] = [
        ("chosen" if plan.fits else "closest", plan.strategy, plan.predicted)
    ]
    rows += [(f"#{i + 2}", alt.strategy, alt.predicted) for i, alt in enumerate(plan.alternatives)]
    for label, strategy, p in rows:
        overhead = f"+{100 * (p.step_time_s / fastest - 1):.0f}%" if fastest else "-"
        table.add_row(
            label,
            describe(strategy, plan.workload.get("roles")),
            _gib(p.peak_reserved_bytes),
            _gib(p.gpu_budget_bytes - p.peak_reserved_bytes),
            _gib(p.host_bytes),
            _seconds(p.step_time_s),
            overhead,
        )
    console.print(table)
    if plan.fastest_ignoring_memory:
        f = plan.fastest_ignoring_memory
        console.print(
            f"[dim]overhead is against the fastest strategy if memory were unlimited: "
            f"{describe(f.strategy, plan.workload.get('roles'))}, {_seconds(f.predicted.step_time_s)}, "
            f"{_gib(f.predicted.peak_reserved_bytes)} peak"
            f"{' (the search screen, not replayed)' if f.predicted.reserved_from == 'screen' else ''}[/dim]"
        )
    _host_line(plan.predicted)
    console.print(_breakdown_table(plan.predicted))
    console.print(_phases_table(plan.predicted, plan.allocator_replay))
    _time_line(plan.predicted)
    _rollout_line(plan.predicted)
    effect = plan.empty_cache_effect
    if effect:
        chosen = effect["chosen"]
        verb = "" if chosen else "not chosen; it would take "
        saved = effect["peak_reserved_saved_fraction"]
        console.print(
            f"empty_cache {effect['policy']}: {verb}peak reserved {_gib(effect['peak_reserved_never_bytes'])} -> "
            f"{_gib(effect['peak_reserved_bytes'])} ({abs(100 * saved):.0f}% {'less' if saved >= 0 else 'more'}) "
            f"for {100 * effect['step_time_added_fraction']:+.1f}% step time, against never calling it"
            + ("" if effect["fits_without"] or not chosen else "; without it the plan would not fit"),
            soft_wrap=True,
        )
    for line in plan.suggestions:
        console.print(f"[yellow]{'what would fit' if not plan.fits else 'note'}:[/yellow] {line}")
    _outside(plan)
    for framework, flags in plan.launch.items():
        console.print(f"[bold]Launch flags ({framework.replace('_', ' ')})[/bold]")
        console.print("  " + " ".join(flags), soft_wrap=True)
        for gap in plan.launch_gaps.get(framework, []):
            console.print(f"  [dim]not expressible: {gap}[/dim]", soft_wrap=True)
    if plan.plan_id:
        console.print(f"\nExport: planner export {plan.plan_id} -o ds_config.json")


def render_check(result: CheckResult) -> None:
    """``planner check``: the verdict, the reasons and the prediction behind them."""
    render_prediction(result.report)
    for reason in result.reasons:
        console.print(f"[red]{reason}[/red]")
