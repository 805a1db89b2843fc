"""Console entry points."""
import os
import sys


def braze_opt_main():
    exe = os.path.join(os.path.dirname(__file__), "bin", "braze-opt")
    os.execv(exe, [exe] + sys.argv[1:])
