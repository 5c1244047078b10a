"""An elastic script whose commits outgrow the commit store's file system (a small tmpfs in
tests/elastic/test_disk_full.py): it commits a `--kb` KiB tensor at every step, and from step `--grow-step`
on a `--big-kb` KiB one. Prints `COMMITTED rank=R step=S` after each commit that fit."""

from __future__ import annotations

import argparse

import torch

import hpcring.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--kb", type=int, default=4)
parser.add_argument("--big-kb", type=int, default=64)
parser.add_argument("--grow-step", type=int, default=3)
args = parser.parse_args()
hvd.init()


@hvd.elastic.run
def train(state: hvd.elastic.ObjectState) -> None:
    while state.step < 6:
        hvd.allreduce(torch.ones(1), name="step")
        state.step += 1
        kb = args.big_kb if state.step >= args.grow_step else args.kb
        state.weights = torch.full((kb * 256,), float(state.step))  # float32: 4 bytes each
        state.commit()
        print(f"COMMITTED rank={hvd.rank()} step={state.step}", flush=True)


train(hvd.elastic.ObjectState(step=0, weights=torch.zeros(args.kb * 256)))
