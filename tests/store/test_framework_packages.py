"""Issue 42 part 2: a plan whose step imports a package the framework does not install says so, in the plan and in
its export (``store.framework_packages``): transformers' Trainer runs the chunked loss through Liger-Kernel."""

from __future__ import annotations

import pytest
from tiny_models import make_hardware, rough_spec

from launch import frameworks
from launch.frameworks import hf
from store.framework_packages import LIGER_KERNEL, packages_needed, packages_setting
from store.records import Strategy, Workload


def test_transformers_refuses_the_liger_loss_without_the_package() -> None:
    """The rule's source, run: transformers' own apply_liger_kernel raises where liger-kernel is missing."""
    from transformers.integrations.liger import apply_liger_kernel
    from transformers.utils import is_liger_kernel_available

    if is_liger_kernel_available():
        pytest.skip("liger-kernel is installed here: the refusal cannot be seen")
    with pytest.raises(ImportError, match="pip install liger-kernel"):
        apply_liger_kernel(None, None)
    assert LIGER_KERNEL.requirement == "liger-kernel>=0.3.0"  # is_liger_kernel_available's own floor


def test_only_the_trainers_chunked_loss_needs_it() -> None:
    assert packages_needed("hf", "chunked") == (LIGER_KERNEL,)
    assert packages_needed("hf", "hf") == ()
    # memplan's own loop and an accelerate loop run planner.runtime.chunked_causal_lm_loss: nothing to install
    assert packages_needed("deepspeed", "chunked") == ()
    assert packages_needed("accelerate", "chunked") == ()
    assert "pip install 'liger-kernel>=0.3.0'" in packages_setting("hf", "chunked")["packages"]
    assert packages_setting("hf", "hf") == {}


def test_the_hf_export_of_a_chunked_plan_says_what_to_install() -> None:
    workload = Workload(kind="sft", model=rough_spec("opt-125m"), seq_len=512, global_batch=8)
    layout = frameworks.file_layout("hf", "ds.json")
    chunked = hf.render(Strategy(micro_batch=2, grad_accum=1, loss="chunked"), workload, make_hardware(gpus=4), layout)
    assert any("pip install 'liger-kernel>=0.3.0'" in note for note in chunked.notes)
    plain = hf.render(Strategy(micro_batch=2, grad_accum=1), workload, make_hardware(gpus=4), layout)
    assert not any("liger" in note for note in plain.notes)
