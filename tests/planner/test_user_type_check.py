"""A user's CI type-checks against memplan installed as a user installs it (issue 44 item 2).

memplan is built as a wheel (a regular, non-editable install: the editable one's import hook hides ``py.typed``
from mypy) and installed into a fresh venv; ``mypy --strict`` of a user's script outside the repo must find the
package and its types: ``Plan.strategy`` typed (``PlanStrategy``), every public name importable from ``planner``.
One deliberate error in the script proves mypy saw the types rather than ``Any``; memplan's public packages, named
to mypy as packages (``-p``) so that it reports inside them although they sit in site-packages, report nothing under
the user's strict flags. One deliberate error planted in the installed ``planner`` proves that they are reported.

Why ``-p`` and not ``--no-silence-site-packages``: the latter also checks every function body of torch, transformers
and pydantic (338 CPU s on the 2-core EPYC, 2026-11-29, against 84 CPU s for ``-p``, which checks memplan's packages
whole and reads its dependencies' signatures only). Still about a minute and a half of CPU: marked ``slow``.

The user's ``mypy.ini`` does not follow imports into transformers and peft (``follow_imports = skip``): memplan's
public packages never import them (only probes/ does, and probes/ is not checked here; a test below holds that), and
the probes functions they call take and return ``Any`` for transformers' objects, so no finding inside the public
packages can depend on those types. Following them cost half of mypy's time (transformers' ``TYPE_CHECKING`` imports
pull in its ~2,400 model modules): mypy --timing-stats, 2026-11-29, 117 CPU s with them, 61 CPU s without, the same
findings. torch, SQLAlchemy, Optuna and pydantic, which the public packages do import, are still followed.

Where its minute goes (mypy 2.4.1 ``--timing-stats``, 2026-11-29: mypy 57 CPU s, the wheel and its install 5):
reading the modules memplan's dependencies pull in by their own imports. Optuna, which search/ and planner/tuning
use, imports torch for its types (``if TYPE_CHECKING: import torch`` in optuna/samplers/_gp/sampler.py and
optuna/_gp/*.py): about 40% of mypy's time, 1,384 torch modules; Optuna's storage and Alembic's ``ddl`` import every
SQLAlchemy dialect (oracle, mssql, mysql, postgresql): about 30% with the rest of SQLAlchemy; optuna.visualization
brings matplotlib and PIL, pydantic rich. memplan's own packages are under 10%. memplan's own torch imports
(planner.runtime, planner.job.target, planner.probing.cpu_rates, probes.measure.fingerprint, all inside functions)
add nothing: hidden from mypy in an experiment, the same 1,384 torch modules were read through Optuna, in about the
same time (59 CPU s). The user's script alone (``-m ci_check`` without the ``-p`` packages) costs 53 CPU s: the
minute is what a user's strict mypy of any script importing memplan costs, not this test's doing.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from planner_helpers import REPO

from planner.report.strategy_record import PlanStrategy

PACKAGES = ("planner", "search", "probes", "launch", "store")
# the packages a user's code reaches through the API, clean under the user's strict flags; probes/ (the real runs,
# behind planner.probing) is not yet: mypy --strict finds about 40 findings there (torch's and transformers'
# untyped calls, a few real ones), so it is left out of this check
PUBLIC_PACKAGES = ("planner", "search", "launch", "store")
USER_SCRIPT = """\
from planner import Plan, PlanStrategy, check, predict, probe_program, recommend

plan: Plan = recommend("opt-1.3b", gpu_mem="24G", workload="sft")
strategy: PlanStrategy = plan.strategy
rank: int | None = strategy.lora_rank
stage: int | None = strategy.zero_stage
actor_stage: int | None = strategy.actor.zero_stage if strategy.actor is not None else None
peak: int = plan.predicted.peak_reserved_bytes
again = predict("opt-1.3b", dict(strategy), gpu_mem="24G", workload="sft")
fits: bool = again.fits and check("ds_config.json", "opt-1.3b", gpu_mem="24G").fits
print(rank, stage, actor_stage, peak, fits, probe_program)
wrong: str = strategy.micro_batch
"""
WRONG_LINE = USER_SCRIPT.splitlines().index("wrong: str = strategy.micro_batch") + 1
# the dependencies that only probes/ imports: the user's mypy does not read them (see the module docstring)
NOT_FOLLOWED = ("transformers", "peft")
USER_MYPY_INI = "[mypy]\n\n[mypy-{}]\nfollow_imports = skip\n".format(
    ",".join(f"{name},{name}.*" for name in NOT_FOLLOWED)
)


def test_the_strategy_is_the_json_object_with_typed_attributes() -> None:
    document = {"zero_stage": 2, "offload_optimizer": "none", "offload_param": "none",
                "gradient_checkpointing": True, "lora_rank": 16, "micro_batch": 4, "grad_accum": 2,
                "empty_cache": "never", "allocator": "default"}  # fmt: skip
    strategy = PlanStrategy(document)
    assert strategy == document and dict(strategy) == document
    assert (strategy.zero_stage, strategy.lora_rank, strategy.micro_batch, strategy.is_rlhf) == (2, 16, 4, False)
    assert strategy.actor is None and strategy.quantization == "none"
    with pytest.raises(TypeError, match="read-only"):
        strategy["lora_rank"] = 0
    rlhf = PlanStrategy({"actor": {"zero_stage": 3, "lora_rank": 0}, "reference": {"zero_stage": 0, "offload": "none"},
                         "micro_batch": 4, "grad_accum": 1, "empty_cache": "after-generation"})  # fmt: skip
    assert rlhf.is_rlhf and rlhf.zero_stage is None
    assert rlhf.actor is not None and rlhf.actor.zero_stage == 3
    assert rlhf.reference is not None and rlhf.reference.offload == "none" and rlhf.critic is None


def test_a_plans_strategy_is_typed_and_dumps_as_before() -> None:
    import json

    from planner import recommend

    plan = recommend("opt-1.3b", gpu_mem="24G", cpu_mem="64G", workload="sft")
    assert isinstance(plan.strategy, PlanStrategy)
    assert plan.strategy.lora_rank == plan.model_dump()["strategy"]["lora_rank"]
    assert json.loads(json.dumps(plan.strategy)) == json.loads(plan.to_json())["strategy"]
    assert all(isinstance(alt.strategy, PlanStrategy) for alt in plan.alternatives)


def test_the_public_packages_import_nothing_the_users_mypy_does_not_follow() -> None:
    """The user's mypy.ini skips transformers and peft: true to what the public packages see only while none of
    their modules imports them (probes/ does, behind ``Any`` signatures)."""
    importers = []
    for package in PUBLIC_PACKAGES:
        for module in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(module.read_text(), str(module))):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
                    names = [node.module]
                if any(name.split(".")[0] in NOT_FOLLOWED for name in names):
                    importers.append(f"{module.relative_to(REPO)}:{node.lineno}")
    assert importers == [], importers


def _wheel(tmp_path: Path) -> Path:
    """memplan's wheel, built from a copy of its packages (nothing is written into the checkout)."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("memplan-*.whl")
    return wheel


@pytest.mark.slow
def test_mypy_strict_of_a_users_script_against_the_installed_wheel(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    wheel = _wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    # memplan's dependencies (pydantic, torch, ...) from this venv, after the installed wheel on the path
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    assert (site / "planner" / "py.typed").is_file()
    user = tmp_path / "user"
    user.mkdir()
    (user / "ci_check.py").write_text(textwrap.dedent(USER_SCRIPT))
    (user / "mypy.ini").write_text(USER_MYPY_INI)
    planted = site / "planner" / "zz_planted_untyped.py"  # an error inside the installed package, to be reported
    planted.write_text("def planted(value):\n    return value\n")
    packages = [argument for package in PUBLIC_PACKAGES for argument in ("-p", package)]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-executable", str(python),
         "--cache-dir", str(tmp_path / "mypy_cache"), "-m", "ci_check", *packages],
        cwd=user,
        capture_output=True,
        text=True,
    )  # fmt: skip
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    inside = [line for line in errors if any(line.startswith(f"{site / package}/") for package in PUBLIC_PACKAGES)]
    assert [line for line in inside if line.startswith(f"{planted}:")], f"the planted error went unreported:\n{result}"
    inside = [line for line in inside if not line.startswith(f"{planted}:")]
    assert inside == [], "\n".join(inside)
    user_errors = [line for line in errors if line.startswith("ci_check.py:")]
    assert user_errors and all(line.startswith(f"ci_check.py:{WRONG_LINE}:") for line in user_errors), result.stdout
    assert 'has type "int | None", variable has type "str"' in user_errors[0], user_errors
