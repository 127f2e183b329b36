"""Snapshot every prediction over a fixed matrix, or compare the current cost model with a snapshot.

A refactor of ``search/`` must not move a prediction unless it says so. This walks a fixed matrix (catalog
models x workload kinds x hardware, every strategy of the search space, thinned by a fixed stride) through
``search.predict`` and writes one JSON object per prediction; ``--compare FILE`` reports which fields
moved, by how much, and for which strategies.

    .venv/bin/python benchmarks/prediction_snapshot.py -o /tmp/before.json
    .venv/bin/python benchmarks/prediction_snapshot.py --compare /tmp/before.json
    .venv/bin/python benchmarks/prediction_snapshot.py --compare /tmp/before.json --framework trl
    .venv/bin/python benchmarks/prediction_snapshot.py --engines --framework verl --only-framework -o /tmp/verl.json

``--framework NAME`` plans every workload of the matrix that NAME runs for that program (``store.frameworks``;
the others stay memplan's own loop) under the same keys: compared with a snapshot of the default, it shows
what that framework's code changes and where. ``--only-framework`` leaves out the workloads NAME does not
run (they are the default's, already in its snapshot).

Single-model spaces are thinned by a fixed stride; RLHF spaces (hundreds of thousands of strategies) are
sampled by a digest of each strategy's JSON (the strategies whose digest is 0 modulo :data:`RLHF_MODULUS`), so
two trees whose spaces differ still sample the same strategies where the spaces agree. ``--clear-caches``
empties search's caches after each workload and hardware (for trees whose caches are bounded by entries, not
bytes: before issue 45 the replay cache kept up to 2048 streams, ~10 GB for this matrix; it moves no figure).
The default RLHF space is the search's own (DeepSpeed's generation); ``--engines`` walks instead the RLHF
strategies whose rollout runs on each vLLM or SGLang engine option the framework runs (memplan's loop plans
them too), sampled the same way: the engine rules of ``search.rollout`` are read only there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search import DEFAULT_COEFFICIENTS, predict  # noqa: E402
from store.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, WORKLOADS  # noqa: E402
from store.gpus import get_gpu  # noqa: E402
from store.models import get_model  # noqa: E402
from store.records import Hardware, Workload  # noqa: E402

GIB = 2**30
STRIDE = 7  # every 7th strategy of each single-model space: about a thousand predictions, a minute to run
# RLHF strategies kept: 1 in RLHF_MODULUS by digest (PPO's space at 24 GB is ~655,000 strategies: ~80 kept;
# remax's and grpo's 40,000-60,000: ~80-120), a few hundred predictions of ~0.6 CPU s each
RLHF_MODULUS = {"ppo": 8192, "remax": 512, "grpo": 512}


def _workloads() -> Iterator[tuple[str, Workload]]:
    opt13, opt350, llama = get_model("opt-1.3b"), get_model("opt-350m"), get_model("llama-3-8b")
    yield "sft-opt1.3b", Workload("sft", opt13, seq_len=512, global_batch=16)
    yield "sft-llama8b-4k", Workload("sft", llama, seq_len=4096, global_batch=8)
    yield "reward-opt350m", Workload("reward", opt350, seq_len=512, global_batch=8)
    yield "dpo-opt1.3b", Workload("dpo", opt13, seq_len=512, global_batch=8)
    rlhf = dict(seq_len=512, global_batch=8, prompt_len=256, gen_len=256)
    yield "ppo-opt1.3b-350m", Workload("ppo", opt13, critic_model=opt350, reward_model=opt350, **rlhf)
    yield "remax-opt1.3b", Workload("remax", opt13, **rlhf)
    yield "grpo-opt350m", Workload("grpo", opt350, samples_per_prompt=4, **rlhf)


def _hardware() -> Iterator[tuple[str, Hardware]]:
    a10, a100 = get_gpu("A10"), get_gpu("A100-80G")
    yield "24G-x1", Hardware(a10, a10.memory_bytes, gpus=1, nodes=1, cpu_memory_bytes=64 * GIB)
    yield "80G-x8", Hardware(a100, a100.memory_bytes, gpus=8, nodes=1, cpu_memory_bytes=512 * GIB)


def _strategy_json(strategy: Any) -> str:
    return json.dumps(strategy.to_dict(), sort_keys=True)


def _sampled(strategy_json: str, modulus: int) -> bool:
    digest = hashlib.blake2b(strategy_json.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % modulus == 0


def _strategies(workload: Workload, hardware: Hardware, thin: int = 1, engines: bool = False) -> list[Any]:
    """The sampled strategies of the workload's space (``thin`` times fewer: a subset of ``thin=1``'s); with
    ``engines``, the RLHF strategies whose rollout runs on a vLLM or SGLang engine instead (none for the others)."""
    if workload.is_rlhf:
        modulus = RLHF_MODULUS[workload.kind] * thin
        space = _engine_strategies(workload, hardware) if engines else _own_generation(workload, hardware)
        return [s for s in space if _sampled(_strategy_json(s), modulus)]
    if engines:
        return []
    from search.choose.single_space import all_strategies

    return list(all_strategies(workload, hardware, (0, 16)))[:: STRIDE * thin]


def _own_generation(workload: Workload, hardware: Hardware) -> Iterator[Any]:
    """The RLHF space the search walks by default: DeepSpeed's own generation (hybrid engine or HF generate)."""
    from search.choose.rlhf_space import all_rlhf_strategies

    return all_rlhf_strategies(workload, hardware, (0, 16))


def _engine_strategies(workload: Workload, hardware: Hardware) -> Iterator[Any]:
    """The RLHF space with each vLLM or SGLang engine option the workload's framework runs
    (``search.choose.rollout_space.searched_generations``), outer x inner as ``all_rlhf_strategies`` walks it."""
    from search.choose.rlhf_space import batch_choices, cache_choices, rlhf_outer_points, rlhf_strategy_at
    from search.choose.rollout_space import searched_generations
    from store.errors import InputError

    try:
        generations = tuple(g for g in searched_generations(workload, hardware) if g[1] is not None)
    except InputError:  # the framework runs no engine for this workload
        return
    splits = batch_choices(workload, hardware)
    for point in rlhf_outer_points(workload, hardware, (0, 16), generations):
        for batches in splits:
            for cache in cache_choices(point.rollout):
                yield rlhf_strategy_at(point, batches, cache)


def _clear_caches() -> None:
    """Empty every functools cache of search's modules and the replay's stream table (moves no figure)."""
    for name, module in list(sys.modules.items()):
        if name == "search" or name.startswith("search."):
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", "") == name:
                    value.cache_clear()
    from search.step import replayed

    for table in ("_STREAMS", "_SEEN", "_REPLAYS"):  # the last two since issue 45
        if hasattr(replayed, table):
            getattr(replayed, table).clear()


def snapshot(
    framework: str = DEFAULT_FRAMEWORK,
    only_framework: bool = False,
    clear: bool = False,
    thin: int = 1,
    engines: bool = False,
) -> dict[str, Any]:
    """Every sampled prediction of the matrix, keyed by workload, hardware and strategy (workloads ``framework``
    runs planned for it; with ``only_framework`` only those; ``thin`` times fewer strategies; ``engines``: the
    RLHF strategies with a vLLM or SGLang rollout engine instead of the default space)."""
    out: dict[str, Any] = {}
    for wname, workload in _workloads():
        if workload.kind in WORKLOADS[framework]:
            workload = replace(workload, framework=framework)
        elif only_framework:
            continue
        for hname, hardware in _hardware():
            for strategy in _strategies(workload, hardware, thin, engines):
                key = f"{wname}|{hname}|{_strategy_json(strategy)}"
                out[key] = predict(workload, strategy, hardware, DEFAULT_COEFFICIENTS).to_dict()
            if clear:
                _clear_caches()
    return out


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            name = item.get("name", i) if isinstance(item, dict) else i
            yield from _flatten(item, f"{prefix}[{name}]")
    else:
        yield prefix, value


def compare(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Print how many predictions moved per workload and hardware, then the fields that moved (count, largest
    relative change, an example); 0 when none moved."""
    moved: dict[str, list[tuple[float, str, Any, Any]]] = defaultdict(list)
    jobs: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # workload|hardware: [compared, moved]
    for key in sorted(set(before) | set(after)):
        if key not in before or key not in after:
            moved["<strategy set>"].append((1.0, key, key in before, key in after))
            continue
        old, new = dict(_flatten(before[key])), dict(_flatten(after[key]))
        job = jobs["|".join(key.split("|")[:2])]
        job[0] += 1
        changed = False
        for field in sorted(set(old) | set(new)):
            a, b = old.get(field), new.get(field)
            if a == b or (isinstance(a, float) and isinstance(b, float) and abs(b - a) <= 1e-9 * max(abs(a), 1e-12)):
                continue  # the same figure, up to the order of a floating-point sum
            rel = (
                abs(b - a) / max(abs(a), 1e-12) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else 1.0
            )
            moved[field].append((rel, key, a, b))
            changed = True
        job[1] += changed
    for name, (compared, changed) in sorted(jobs.items()):
        print(f"{name}: {changed} of {compared} predictions moved")
    for field, changes in sorted(moved.items()):
        rel, key, a, b = max(changes, key=lambda c: c[0])
        print(f"{field}: {len(changes)} moved, largest {rel:+.2%} ({a} -> {b}) at {key[:160]}")
    print(f"{len(before)} predictions compared; {len(moved)} fields moved")
    return 1 if moved else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, help="write the snapshot here")
    parser.add_argument("--compare", type=Path, help="compare the current predictions with this snapshot")
    parser.add_argument("--framework", choices=FRAMEWORKS, default=DEFAULT_FRAMEWORK, help="plan for this program")
    parser.add_argument("--only-framework", action="store_true", help="only the workloads --framework runs")
    parser.add_argument("--clear-caches", action="store_true", help="empty search's caches after each model")
    parser.add_argument("--thin", type=int, default=1, help="N times fewer strategies (a subset of the default's)")
    parser.add_argument(
        "--engines", action="store_true", help="RLHF strategies with each vLLM/SGLang engine the framework runs"
    )
    args = parser.parse_args()
    current = snapshot(args.framework, args.only_framework, args.clear_caches, args.thin, args.engines)
    if args.output:
        fd, tmp = tempfile.mkstemp(dir=args.output.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(current, handle)
        os.replace(tmp, args.output)
        print(f"{len(current)} predictions -> {args.output}")
    if args.compare:
        return compare(json.loads(args.compare.read_text()), current)
    return 0


if __name__ == "__main__":
    sys.exit(main())
