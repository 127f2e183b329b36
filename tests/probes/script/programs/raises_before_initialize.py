"""A training script that fails before ``deepspeed.initialize``: its data file is missing."""

import argparse
import json

import deepspeed  # noqa: F401 - imported as training scripts do, never reached: initialize


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="no-such-train-file.jsonl")
    args = parser.parse_args()
    with open(args.data, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle]
    print(f"{len(rows)} rows", flush=True)


if __name__ == "__main__":
    main()
