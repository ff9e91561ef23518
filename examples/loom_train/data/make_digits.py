#!/usr/bin/python3
"""Writes scikit-learn's bundled 8x8 digits as .npy files for `loom-train --model cnn`.

    /usr/bin/python3 examples/loom_train/data/make_digits.py OUT_DIR

The images come from Debian's python3-sklearn (sklearn/datasets/data/digits.csv.gz, 1797
images, 64 pixels in 0..16, labels 0..9). They are shuffled with a fixed seed (numpy
RandomState(0)) and split 1438 train / 359 validation (80/20). Written to OUT_DIR:
digits_{train,val}_x.npy (float32 [N, 64], pixels / 16) and digits_{train,val}_y.npy (int64 [N]).
"""
import os
import sys

import numpy as np
from sklearn.datasets import load_digits


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_digits.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.RandomState(0).permutation(len(y))
    n_val = len(y) // 5
    splits = {"train": order[n_val:], "val": order[:n_val]}
    for name, rows in splits.items():
        np.save(os.path.join(out, "digits_%s_x.npy" % name), x[rows])
        np.save(os.path.join(out, "digits_%s_y.npy" % name), y[rows])
    print("make_digits: %d train, %d validation images in %s" %
          (len(splits["train"]), len(splits["val"]), out))


if __name__ == "__main__":
    main()
