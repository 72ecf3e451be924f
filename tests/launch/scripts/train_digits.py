"""hvdrun test script: train the digits model; rank 0 saves its parameters to --out (npz)."""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import digits  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=15)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--single", action="store_true", help="one process, no engine_native")
parser.add_argument("--out", required=True)
args = parser.parse_args()
result = digits.train(args.steps, args.batch, distributed=not args.single, verbose=True)
if result["rank"] == 0:
    np.savez(args.out, *result["params"])
    print(f"final loss {result['loss']:.6f} accuracy {result['accuracy']:.3f} "
          f"size {result['size']}")
