"""A program that starts a daemon the classic way (fork, setsid, fork again) and writes the daemon's pid, then
exits at once (``--then exit``) or waits to be stopped (``--then wait``). No DeepSpeed: the hook leaves it alone.
The daemon sleeps until it is killed; a test asserts it is gone after the probe."""

from __future__ import annotations

import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("pid_file")
parser.add_argument("--then", choices=("exit", "wait"), default="exit")
args = parser.parse_args()

if os.fork() == 0:  # the first child: a session of its own, then the daemon, then it exits
    os.setsid()
    if os.fork() == 0:  # the daemon: its parent exits, so it is no one's child but a reaper's
        with open(args.pid_file + ".tmp", "w") as out:
            out.write(str(os.getpid()))
        os.replace(args.pid_file + ".tmp", args.pid_file)
        while True:
            time.sleep(60)
    os._exit(0)
while not os.path.exists(args.pid_file):
    time.sleep(0.01)
if args.then == "wait":
    print("daemon started", flush=True)
    while True:
        time.sleep(60)
sys.exit(0)
