"""Command line ``byoc-hetero`` (also ``python -m byoc_hetero``).

Commands: ``demo`` (the README's main job), ``report MODEL.onnx`` (the partition report, optionally
the picture), ``run MODEL.onnx --input x.npy`` (run the offloaded build; ``run model.so`` runs an exported
library, its file structure checked before loading), ``bench MODEL.onnx``
(offloaded vs llvm-only latency), ``info`` (versions, oneDNN ISA, kernels).

Exit codes: 0 success; 2 bad usage or bad input (argparse, a missing or corrupt model or input
file, a wrong input count, shape or dtype, an index out of range: :class:`~byoc_hetero.errors.InputError`,
:class:`~byoc_hetero.errors.ModelFileError`, a damaged library: :class:`~byoc_hetero.errors.IntegrityError`); 3 a model TVM cannot import
(:class:`~byoc_hetero.errors.UnsupportedModelError`); 1 anything else, TVM's own errors included
(whatever their Python class: TVM raises ``ValueError`` for its internal failures too). Every error
is one line on stderr: ``byoc-hetero: error: ...``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .errors import ByocError, InputError, IntegrityError, ModelFileError, UnsupportedModelError, first_line

EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_UNSUPPORTED = 0, 1, 2, 3


def _multiple_of_32(text: str) -> int:
    """``--image-size``: a positive multiple of 32 (VGG-11 halves it five times); else a usage error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0 or value % 32:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive multiple of 32")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="byoc-hetero",
        description="Offload conv2d/dense regions of TVM Relax models to oneDNN; the rest runs on llvm.",
        epilog="exit codes: 0 ok, 2 bad usage or input, 3 model cannot be imported, 1 internal error",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="VGG-11 through the four partition stages, then latency")
    demo.add_argument("--image-size", type=_multiple_of_32, default=224, help="input height/width (multiple of 32)")
    demo.add_argument("--repeat", type=int, default=3, help="timed runs of the llvm-only build")

    report = sub.add_parser("report", help="partition an ONNX model and print what went where, and why")
    report.add_argument("model", type=Path, help="the .onnx file")
    report.add_argument("--render", type=Path, metavar="PICTURE",
                        help="also draw the partitioned graph (.dot, or .svg/.png with graphviz)")

    run = sub.add_parser("run", help="run an ONNX model with its regions offloaded, or an exported library")
    run.add_argument("model", type=Path, help="the .onnx file, or a library exported with export_library (.so)")
    run.add_argument("--input", type=Path, action="append", required=True, metavar="X.npy",
                     help="an input as a .npy file (repeat for several inputs, in order)")
    run.add_argument("--output", type=Path, metavar="Y.npy", help="save the (first) output here")

    bench = sub.add_parser("bench", help="latency of an ONNX model: offloaded vs llvm-only")
    bench.add_argument("model", type=Path, help="the .onnx file")
    bench.add_argument("--repeat", type=int, default=5, help="timed runs per build")
    bench.add_argument("--input", type=Path, action="append", metavar="X.npy",
                       help="an input as a .npy file (repeat for several inputs, in order); needed for a "
                            "model with symbolic dims, whose sizes the inputs' shapes pick")

    for command in (report, run, bench):
        command.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                             help="what offloaded conv2d/dense/matmul compute in (bf16: bf16 weights and "
                                  "activations, f32 accumulation, float32 inputs/outputs; runs f32 with a "
                                  "warning on CPUs without native bf16)")

    sub.add_parser("info", help="versions, oneDNN ISA, native bf16 and the runtime's kernels")
    return parser


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _load_and_partition(path: Path, precision: str = "f32"):
    import byoc_hetero as bh

    start = time.perf_counter()
    _progress(f"importing {path} ...")
    mod, params = bh.from_onnx(path)
    m = bh.bind_params(mod, params)
    for stage in bh.stages(precision=precision):
        t = time.perf_counter()
        m = stage(m)
        _progress(f"  {stage.info.name:<22} {time.perf_counter() - t:6.2f} s")
    _progress(f"partitioned in {time.perf_counter() - start:.1f} s")
    return mod, params, m


def _build(m, what: str):
    from .timing import build

    _progress(f"compiling the {what} build ...")
    start = time.perf_counter()
    ex = build(m)
    _progress(f"  done in {time.perf_counter() - start:.1f} s")
    return ex


def _cmd_report(args) -> None:
    import byoc_hetero as bh

    _, _, m = _load_and_partition(args.model, args.precision)
    rep = bh.report(m)
    print(rep)
    if args.render:
        print(f"picture: {rep.render(args.render)}")


def _load_inputs(paths: list[Path]) -> list:
    """The .npy files given with --input, in order (InputError for a missing or unreadable one)."""
    import numpy as np

    inputs = []
    for path in paths:
        if not path.is_file():
            raise InputError(f"input file {str(path)!r} does not exist")
        try:
            inputs.append(np.load(path))
        except Exception as err:  # noqa: BLE001 - numpy raises several kinds for a bad file
            raise InputError(f"input file {str(path)!r} is not a readable .npy array: {first_line(err)}") from err
    return inputs


def _run_library(path: Path, inputs: list):
    """Run ``main`` of an exported library (``export_library``'s .so) on ``inputs``: the file's
    structure is checked before it is loaded (:func:`byoc_hetero.load_module`)."""
    import tvm
    from tvm import relax

    from .library import load_module

    vm = relax.VirtualMachine(load_module(path), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return out.numpy() if hasattr(out, "numpy") else out[0].numpy()


def _cmd_run(args) -> None:
    import numpy as np

    from .inputs import check_inputs
    from .timing import run

    inputs = _load_inputs(args.input)
    if args.model.suffix == ".so":
        out = _run_library(args.model, inputs)
    else:
        mod, params, m = _load_and_partition(args.model, args.precision)
        check_inputs(mod, inputs, params)
        out = run(_build(m, "offloaded"), inputs)
    if args.output:
        np.save(args.output, out)
        print(f"output {list(out.shape)} {out.dtype} saved to {args.output}")
    else:
        np.set_printoptions(threshold=20, edgeitems=3)
        print(out)


def _cmd_bench(args) -> None:
    import byoc_hetero as bh

    from .inputs import check_inputs, signature
    from .timing import median_latency, random_inputs, relative_error, run

    mod, params, m = _load_and_partition(args.model, args.precision)
    if args.input:
        inputs = _load_inputs(args.input)  # their shapes pick the sizes of a dynamic model
        check_inputs(mod, inputs, params)
    else:
        symbolic = sorted({d for spec in signature(mod["main"], params) if spec and spec.shape
                           for d in spec.shape if not isinstance(d, int)}, key=str)
        if symbolic:
            raise InputError(f"{args.model} has symbolic input dims ({', '.join(map(str, symbolic))}); "
                             "give the inputs to time with --input X.npy")
        inputs = random_inputs(mod, params)
    ex_off = _build(m, "offloaded")
    ex_ref = _build(bh.bind_params(mod, params), "llvm-only")
    err = relative_error(run(ex_off, inputs), run(ex_ref, inputs))
    _progress("timing ...")
    t_off = median_latency(ex_off, inputs, repeat=args.repeat)
    t_ref = median_latency(ex_ref, inputs, repeat=args.repeat)
    print(f"offloaded  {t_off * 1e3:10.2f} ms")
    print(f"llvm-only  {t_ref * 1e3:10.2f} ms")
    print(f"speed-up   {t_ref / t_off:10.1f}x   (max relative difference {err:.1e})")


def exit_code(err: BaseException) -> int:
    """The exit code for an error that ended a command: decided by our exception classes only."""
    if isinstance(err, UnsupportedModelError):
        return EXIT_UNSUPPORTED
    if isinstance(err, InputError | ModelFileError | IntegrityError):
        return EXIT_INPUT
    return EXIT_INTERNAL


def _describe(err: BaseException) -> str:
    """For stderr: our messages as they are, anything else as its class name and first line."""
    if isinstance(err, ByocError):
        return str(err)
    return f"{type(err).__name__}: {first_line(err)}"


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        import byoc_hetero as bh  # imported late: TVM takes a moment to load

        if args.command == "demo":
            from .demo import demo

            demo(image_size=args.image_size, repeat=args.repeat)
        elif args.command == "report":
            _cmd_report(args)
        elif args.command == "run":
            _cmd_run(args)
        elif args.command == "bench":
            _cmd_bench(args)
        elif args.command == "info":
            c = bh._C
            print(f"byoc_hetero {bh.__version__}, oneDNN {c.onednn_version()} ({c.isa()}), "
                  f"bf16 {'native' if c.bf16_native() else 'not native (precision=bf16 runs f32)'}, "
                  f"kernels: {', '.join(c.kernels())}")
    except Exception as err:  # noqa: BLE001 - every failure becomes one line and an exit code
        print(f"byoc-hetero: error: {_describe(err)}", file=sys.stderr)
        return exit_code(err)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
