"""Command line: ``byoc-hetero demo`` (and ``python -m byoc_hetero demo``)."""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="byoc-hetero",
        description="Offload conv2d/dense regions of Relax models to oneDNN; the rest runs on llvm.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="VGG-11 through the four partition stages, then latency")
    demo.add_argument("--image-size", type=int, default=224, help="input height/width (multiple of 32)")
    demo.add_argument("--repeat", type=int, default=3, help="timed runs of the llvm-only build")
    sub.add_parser("info", help="versions, oneDNN ISA and the runtime's kernels")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import byoc_hetero as bh  # imported late: TVM takes a moment to load

    try:
        if args.command == "demo":
            from .demo import demo

            demo(image_size=args.image_size, repeat=args.repeat)
        elif args.command == "info":
            c = bh._C
            print(f"byoc_hetero {bh.__version__}, oneDNN {c.onednn_version()} ({c.isa()}), "
                  f"kernels: {', '.join(c.kernels())}")
    except (bh.ByocError, ValueError) as err:
        print(f"byoc-hetero: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
