"""A process killed in the middle of fflow.save leaves the previous checkpoint intact,
and the next save succeeds."""

import os
import signal
import subprocess
import sys
import time

import numpy as np

import fflow
import fflow.numpy as jnp

CHILD = """
import sys
import numpy as np
import fflow
tree = {f"w{i:05d}": np.full((64,), i, np.float32) for i in range(4000)}
fflow.save(sys.argv[1], tree)
print("finished")
"""


def test_killed_save_keeps_previous_checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    fflow.save(path, {"w": jnp.arange(5.0)})
    tmp = tmp_path / ".ckpt.tmp-fflow"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if tmp.exists() and len(os.listdir(tmp)) >= 20:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the child finished its save before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert tmp.exists() and len(os.listdir(tmp)) < 4001  # killed mid-save
    restored = fflow.load(path)
    assert list(restored) == ["w"]
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.arange(5.0))
    fflow.save(path, {"w": jnp.ones(2)})  # the next save cleans up and succeeds
    assert fflow.load(path)["w"].tolist() == [1.0, 1.0]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
