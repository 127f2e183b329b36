"""A script that imports DeepSpeed and exits cleanly without ever calling ``deepspeed.initialize``: a user's
``--dry-run`` that only checks its configuration."""

import json
import sys

import deepspeed

CONFIG = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}

if __name__ == "__main__":
    print(f"dry run with deepspeed {deepspeed.__version__}: {json.dumps(CONFIG)}", flush=True)
    sys.exit(0)
