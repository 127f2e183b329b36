"""Host cost of torch's non-reentrant activation checkpointing around transformers' decoder layers, in units
of the model's own forward host time (the ratios behind ``checkpoint_forward_overhead`` and
``checkpoint_backward_overhead`` in search/coefficients.py).

The model is built with tiny widths so that every kernel is negligible and the step is host-bound on any
processor: what remains is Python and dispatch. Forward and backward are timed with and without
``gradient_checkpointing_enable(use_reentrant=False)``; the checkpointed backward also runs the recompute,
one plain forward, which is subtracted. Prints the two ratios per model family.

    .venv/bin/python benchmarks/checkpoint_overhead.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

CONFIGS = {
    "opt": dict(
        model_type="opt", hidden_size=64, num_hidden_layers=24, num_attention_heads=4, ffn_dim=256,
        word_embed_proj_dim=64, vocab_size=512, max_position_embeddings=64, dropout=0.1,
    ),
    "llama": dict(
        model_type="llama", hidden_size=64, num_hidden_layers=16, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=256, vocab_size=512, max_position_embeddings=64,
    ),
}  # fmt: skip


def _timed(model, ids, repeats: int) -> tuple[float, float]:
    forward, backward = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        forward.append(t1 - t0)
        backward.append(t2 - t1)
    skip = repeats // 5
    return statistics.median(forward[skip:]), statistics.median(backward[skip:])


def main() -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        "| family | forward ms | backward ms | checkpointed forward ms | checkpointed backward ms "
        "| forward overhead (x forward) | backward overhead beyond the recompute (x forward) |"
    )
    print("|---|---|---|---|---|---|---|")
    for family, values in CONFIGS.items():
        config = AutoConfig.for_model(**values)
        config.use_cache = False
        ids = torch.randint(0, config.vocab_size, (1, 16))
        models = []
        for checkpointed in (False, True):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()
            if checkpointed:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            models.append(model)
        _timed(models[0], ids, 5), _timed(models[1], ids, 5)  # warm-up
        (f, b), (cf, cb) = _timed(models[0], ids, args.repeats), _timed(models[1], ids, args.repeats)
        print(
            f"| {family} | {f * 1e3:.2f} | {b * 1e3:.2f} | {cf * 1e3:.2f} | {cb * 1e3:.2f} "
            f"| {(cf - f) / f:.2f} | {(cb - b - f) / f:.2f} |"
        )


if __name__ == "__main__":
    main()
