"""The probes' minimal LoRA: DeepSpeed-Chat's layer layout, zero change at start, frozen base, switchable."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_models import tiny_llama_hf_config  # noqa: E402

from probes.model.lora import LoRALinear, adapters_disabled, add_lora  # noqa: E402


def _llama() -> torch.nn.Module:
    config = transformers.AutoConfig.for_model("llama", **tiny_llama_hf_config())
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


def test_lora_wraps_every_block_linear_and_trains_only_adapters() -> None:
    model = _llama()
    ids = torch.randint(0, 128, (2, 8))
    before = model(input_ids=ids).logits
    names_before = {name for name, _ in model.named_parameters()}
    adapted = add_lora(model, rank=4)
    assert adapted == 2 * 7  # q, k, v, o, gate, up, down in each of the 2 layers; not lm_head
    assert isinstance(model.model.layers[0].self_attn.q_proj, LoRALinear)
    assert not isinstance(model.lm_head, LoRALinear)
    names_after = {name for name, _ in model.named_parameters()}
    assert names_before <= names_after  # base weights keep their names (q_proj.weight), as the hybrid engine reads
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    h, i, r = 64, 128, 4
    per_layer = 4 * (h * r + r * h) + 2 * (h * r + r * i) + (i * r + r * h)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 2 * per_layer
    assert torch.allclose(model(input_ids=ids).logits, before)  # left factor starts at zero

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_left_weight.fill_(0.01)
    changed = model(input_ids=ids).logits
    assert not torch.allclose(changed, before)
    with adapters_disabled(model):
        assert torch.allclose(model(input_ids=ids).logits, before)
    assert torch.allclose(model(input_ids=ids).logits, changed)


def test_lora_on_gpt2_conv1d_and_value_head_stays_trainable() -> None:
    config = transformers.AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config)
    model.v_head = torch.nn.Linear(32, 1)
    model.eval()  # no dropout: compare outputs exactly
    ids = torch.randint(0, 64, (1, 5))
    before = model(input_ids=ids).last_hidden_state
    assert add_lora(model, rank=2, trainable=("v_head",)) == 4  # c_attn, c_proj, c_fc, mlp.c_proj
    assert torch.allclose(model(input_ids=ids).last_hidden_state, before, atol=1e-6)
    assert model.v_head.weight.requires_grad and not model.h[0].attn.c_attn.weight.requires_grad
