"""launch: what the user launches. DeepSpeed configs rendered from a strategy (``ds_config``), read back
(``ds_config_read``) and validated with DeepSpeed's own parser (``ds_config_deepspeed``); an RLHF strategy's
configs per model (``rlhf_config``); and one module per framework under ``frameworks/`` (Accelerate, the HF
Trainer, TRL, OpenRLHF, veRL, DeepSpeed-Chat), each the one front door for that framework's files and flags.

Imports only ``store``; nothing here imports torch at module level (``planner recommend`` renders configs).
"""
