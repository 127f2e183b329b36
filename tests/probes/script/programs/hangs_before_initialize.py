"""A script that never gets to ``deepspeed.initialize``: it waits forever for a file no one writes (a dataset
being prepared elsewhere, a lock). With ``--helper`` it first starts a helper process in a session of its own,
as data servers and launchers do. Its arguments carry a marker, so a test can find every process it left.

No torch here: the wait is the point, and it must cost nothing while it lasts.
"""

import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    if "--helper" in sys.argv:
        marker = [a for a in sys.argv[1:] if a != "--helper"]
        code = "import time\nwhile True: time.sleep(1)"
        subprocess.Popen([sys.executable, "-c", code, "helper", *marker], start_new_session=True)
    print("waiting for the dataset", flush=True)
    while not Path("/nonexistent/dataset-ready").exists():
        time.sleep(0.5)
