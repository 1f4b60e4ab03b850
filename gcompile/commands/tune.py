"""gcompile tune MODEL.py -o RECORD.json: time the training step's GEMM tiles on this machine's GPU and write
the tuning record that `gcompile build/run --tuning RECORD.json` (gc.compile(tuning=...)) builds with."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import GCompileError
from .model_file import at_least_one, load_program, parse_settings


def add_arguments(parser) -> None:
    parser.add_argument("model", help="model file defining program(batch_size=...)")
    parser.add_argument("-o", "--out", required=True, help="the tuning record to write (JSON)")
    parser.add_argument("--batch-size", type=at_least_one("the batch size"), default=None,
                        help="passed to program(batch_size=...)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="passed to program(NAME=VALUE), as for gcompile build")
    parser.add_argument("--precision", choices=("fp32", "tf32"), default="fp32",
                        help="the precision the record is for (default fp32)")
    parser.add_argument("--arch", default=None, help="CUDA architectures, as for gcompile build (default: the GPU's)")
    parser.add_argument("--count", type=at_least_one("--count"), default=8,
                        help="alternative tiles tried per GEMM (default 8)")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help="time the trainer's steps on this dataset (the binary's epochs, the batch read from "
                             "the dataset as training does) instead of the library's on one batch")


def run(args) -> int:
    from ..tune import tune, write_record

    out = Path(args.out)
    if out.exists() and out.is_dir():
        raise GCompileError(f"{out}: is a folder; -o names the record file to write")
    program = load_program(args.model, args.batch_size, parse_settings(args.set))
    record = tune(program, name=program.name, precision=args.precision, arch=args.arch, count=args.count,
                  data=args.data)
    record["model_file"] = os.path.relpath(args.model)
    record["batch_size"] = args.batch_size
    write_record(record, out)
    print(f"wrote {out}")
    return 0
